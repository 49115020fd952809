"""Ranks checked against each other at every save: one digest of what each rank passes.

Every rank hashes what must be the same on all of them: the step, the save
options, the names and kinds of the variables, and the JSON form of each
replicated value (xxhash of its canonical text).  The digest rides on a
collective the save already makes: the plan stage's allreduce or gather (blocking and
incremental saves, the first asynchronous save), or the commit's gather (an
asynchronous full save with a cached plan, whose ``save`` calls no MPI).  When
the digests differ, a CheckpointError on every rank names what differs
(``step``, an option, a variable) and two ranks that differ, and nothing is
committed.  Values that legitimately differ per rank are ``hpcckpt.PerRank``.

Pure apart from :func:`check_digests` (one more allgather, made only when the
digests already differ: the error path).
"""

from __future__ import annotations

import json

import xxhash

from hpcckpt.errors import CheckpointError, TemplateMismatchError

#: What a kind is called in the error messages.
_KIND_NAMES = {"block": "a Block", "replicated-block": "a Block declared replicated=True", "ragged": "a Ragged", "value": "a replicated value", "per-rank": "a PerRank"}


def _hash(text: str) -> str:
    return xxhash.xxh3_64_hexdigest(text.encode("utf-8", "surrogatepass"))


def entry_digests(step, options, kinds: dict, values: dict, directory: str | None = None) -> dict:
    """``{entry: text}`` of this rank: the step, the directory of a save to a path, each option, each variable's
    kind (and a replicated value's hash).

    ``options``: a SaveOptions (its fields), or None; ``kinds``: ``{name:
    kind}`` of every variable; ``values``: ``{name: JSON form}`` of the
    replicated values; ``directory``: the path of ``hpcckpt.save`` (None for
    a Checkpointer's save, whose version every rank names alike).
    """
    out = {"step": repr(step)}
    if directory is not None:
        out["directory"] = directory
    if options is not None:
        for field in sorted(options.__dataclass_fields__):
            out[f"option {field}"] = _hash(repr(getattr(options, field)))
    for name, kind in kinds.items():
        text = kind
        if name in values:
            text += ":" + _hash(json.dumps(values[name], sort_keys=True, allow_nan=False))
        out[f"variable {name}"] = text
    return out


def total(details: dict) -> str:
    """The digest of a rank's entries: what rides on the collective."""
    return _hash(json.dumps(sorted(details.items())))


def mismatch(details: list) -> CheckpointError | None:
    """The error for every rank's entries (one dict per rank, None for a rank that sent none), or None if equal.

    Names or kinds that differ are a TemplateMismatchError; steps, options and values a CheckpointError.
    """
    ref = next((r for r, d in enumerate(details) if d is not None), None)
    if ref is None:
        return None
    for r, d in enumerate(details):
        if d is not None and d != details[ref]:
            text = _difference(details[ref], ref, d, r)
            cls = TemplateMismatchError if text.startswith(("state names", "variable")) else CheckpointError
            return cls(text)
    return None


def _difference(a: dict, ra: int, b: dict, rb: int) -> str:
    """The first entry that differs between rank ``ra``'s entries ``a`` and rank ``rb``'s ``b``, in words."""
    if a.get("step") != b.get("step"):
        return (f"the ranks save different steps: rank {ra} step {a.get('step')}, rank {rb} step {b.get('step')}; "
                "nothing was committed")
    if a.get("directory") != b.get("directory"):
        return (f"the ranks save to different paths: rank {ra} {a.get('directory')!r}, rank {rb} "
                f"{b.get('directory')!r}; every rank must pass the same path (nothing was committed)")
    for key in sorted(set(a) | set(b)):
        if a.get(key) == b.get(key):
            continue
        kind, _, name = key.partition(" ")
        if kind == "option":
            return (f"the save option {name!r} differs between rank {ra} and rank {rb}; every rank must pass the "
                    "same options (nothing was committed)")
        if key not in a or key not in b:
            has, lacks = (ra, rb) if key in a else (rb, ra)
            return (f"state names differ between ranks: {name!r} is saved on rank {has} but not on rank {lacks} "
                    "(nothing was committed)")
        ka, kb = a[key].partition(":")[0], b[key].partition(":")[0]
        if ka != kb:
            return (f"the kinds of variable {name!r} differ between ranks: {_KIND_NAMES.get(ka, ka)} on rank {ra}, "
                    f"{_KIND_NAMES.get(kb, kb)} on rank {rb} (nothing was committed)")
        return (f"the replicated value {name!r} differs between rank {ra} and rank {rb}: a replicated value must "
                "be equal on every rank (wrap values that differ per rank in hpcckpt.PerRank); nothing was committed")
    return f"ranks {ra} and {rb} passed different states (nothing was committed)"


def check_digests(comm, what: str, totals: list, details: dict | None) -> None:
    """Collective when ``totals`` differ: every rank's :func:`total`, or any list of them that holds the smallest
    and the largest (saving.plan.Ballot), the same list on every rank.

    Then every rank sends its entries (one allgather) and every rank raises the
    same CheckpointError naming what differs and two ranks; otherwise no MPI.
    """
    if len({t for t in totals if t is not None}) <= 1:
        return
    error = mismatch(comm.allgather(details))
    if error is None:  # a hash collision of the totals only: the entries agree
        return
    raise type(error)(f"{what} failed: {error}")


#: How a rank's digest of a replicated copy it could not hash starts (selection.replica_digests).
HASH_FAILED = "failed: "


def replica_mismatch(per_rank: list) -> CheckpointError | None:
    """The error for copies of a replicated Block that differ, or None when every copy is equal.

    ``per_rank[r]``: rank r's ``{(variable, start, stop): digest}`` of the
    shared regions it holds (selection.replica_digests; None for a rank that
    sent none).  Every rank that holds a region hashed the same region, the
    owner (the lowest rank, the one whose copy is saved) included.
    """
    seen: dict = {}
    for rank, digests in enumerate(per_rank):
        for key, digest in sorted((digests or {}).items()):
            if digest.startswith(HASH_FAILED):
                return CheckpointError(f"rank {rank} could not hash its copy of the replicated Block {key[0]!r}: "
                                       f"{digest[len(HASH_FAILED):]} (nothing was committed)")
            first = seen.setdefault(key, (rank, digest))
            if first[1] != digest:
                name, start, stop = key
                where = ", ".join(f"{a}:{b}" for a, b in zip(start, stop))
                return CheckpointError(
                    f"the replicated Block {name!r} differs between rank {first[0]} and rank {rank} in [{where}]: "
                    "the copies of a Block declared replicated=True must be equal on every rank that holds them "
                    "(nothing was committed)")
    return None

