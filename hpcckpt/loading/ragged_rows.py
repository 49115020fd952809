"""Each rank's rows of a Ragged table from one scan of small tallies: O(1) bytes per rank, no allgather (pure).

A Ragged load's rows depend on every rank's request (planning.plan_rows):
``Ragged()`` on every rank is an even split of the stored rows, computable
alone; ``Ragged(rows=n)`` on every rank gives consecutive ranges in rank
order, the exclusive prefix sum of the counts.  Instead of every rank
receiving every rank's count, each rank contributes a tally per Ragged
variable (:func:`tally`: the rows it asks, and whether it asks a count, an
even split or a negative count) to one inclusive sum-scan (MPI_Scan of an
int64 vector of :data:`COLUMNS` numbers per variable, whatever the rank
count).  The scan minus a rank's own tally is what the ranks before it asked:
its range (:func:`row_range`).  The last rank's scan is the total of every
rank, enough for every check of plan_rows with its exact message
(:func:`rows_problem`); the load carries that message to every rank in its
next exchange, so that every rank raises the same TemplateMismatchError.

A rank that asks something invalid (a mix of both forms, a negative count,
counts that do not add up) still gets a range inside the table, so that it
can take part in the exchanges until the error is raised everywhere.  No MPI
and no I/O: tested with hypothesis against plan_rows.
"""

from __future__ import annotations

import numpy as np

from hpcckpt.core.regions import even_rows

#: Numbers per Ragged variable in a tally: the rows asked by counts, the ranks asking a count, the ranks asking
#: an even split (``Ragged()``), the ranks asking a negative count.
COLUMNS = 4
_ROWS, _COUNTS, _SPLITS, _NEGATIVE = range(COLUMNS)


def tally(requests: dict | None, names: list) -> np.ndarray:
    """This rank's contribution to the scan: :data:`COLUMNS` int64 numbers per name of ``names`` (the stored
    Ragged variables, in an order every rank shares).

    ``requests``: loading.check_template's (``{name: ("ragged", rows or None) | ("block", ...)}``), or None
    for a rank whose template failed (it adds nothing; its failure travels in the next exchange).  A name this
    rank does not ask Ragged rows of adds nothing either (rank 0's signature check reports the mismatch).  A
    negative count adds -1 rows, whatever it is (it is refused anyway, and no sum can overflow: the template
    check refuses a count above the stored rows).
    """
    out = np.zeros((len(names), COLUMNS), np.int64)
    for i, name in enumerate(names):
        request = (requests or {}).get(name)
        if request is None or request[0] != "ragged":
            continue
        if request[1] is None:
            out[i, _SPLITS] = 1
        else:
            out[i, _ROWS], out[i, _COUNTS], out[i, _NEGATIVE] = max(request[1], -1), 1, request[1] < 0
    return out.reshape(-1)


def row_range(rows: int | None, before: np.ndarray, total: int, rank: int, nranks: int) -> tuple[int, int]:
    """This rank's rows ``[lo, hi)`` of a table of ``total`` rows: an even split for ``rows=None``, else the
    ``rows`` after those the ranks before it ask (``before``: their summed tally of this variable).

    The same as plan_rows gives whenever plan_rows accepts the requests; otherwise some range inside the table
    (the load fails with :func:`rows_problem`'s message).
    """
    if rows is None:
        return even_rows(total, nranks, rank)
    lo = min(max(int(before[_ROWS]), 0), total)
    return lo, min(max(lo + rows, lo), total)


def rows_problem(names: list, totals: np.ndarray, shapes: dict, nranks: int) -> str | None:
    """The first of ``names`` whose requests plan_rows refuses, with plan_rows's message, or None.

    ``totals``: the last rank's scan (every rank's tallies summed); ``shapes``: the stored shape of each name.
    A variable that not every rank asks Ragged rows of is left to the signature check (its message names the
    ranks that differ), as are the names no rank asks.
    """
    totals = np.asarray(totals, np.int64).reshape(len(names), COLUMNS)
    for name, (rows, counts, splits, negative) in zip(names, totals.tolist()):
        if counts + splits != nranks:
            continue
        if counts and splits:
            return f"variable {name!r}: some ranks give Ragged(rows=...) and others do not"
        if negative:
            return f"variable {name!r}: a negative Ragged row count was requested"
        if counts and rows != shapes[name][0]:
            return f"variable {name!r}: the ranks ask for {rows} rows in all but the checkpoint holds {shapes[name][0]}"
    return None
