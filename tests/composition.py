"""The composition matrix: every Checkpointer capability against every other, as an all-pairs selection.

Axes (one value each per configuration):

* ``mode``: blocking or asynchronous saves;
* ``kind``: full or incremental versions;
* ``level``: no level, node-local alone (L1), or node-local with partner copies
  (L2), XOR parity (L3), Reed-Solomon parity (RS) or persistent memory (PM);
* ``precopy``: pre-copy rounds between checkpoints, on or off;
* ``files``: tracked output files off, shared files only (recorded by rank 0),
  or per-rank files as well;
* ``codec``: one of each codec family (none, blosc, hpcckpt's filter chain,
  blosc2, the lossy quantizer);
* ``resize``: the job shrinks by one rank and grows back in memory between
  saves (docs/malleability.md), or keeps its ranks;
* ``end``: how the run ends cleanly: ``close()`` after its last interval, or a
  final checkpoint asked for by a signal on one rank or by the halt file
  (docs/interval.md), then ``close()``.

``possible`` is what physics allows: pre-copy writes ahead the blocks that
changed since the previous checkpoint, so it needs incremental versions (its
refusal with the reason: tests/test_precopy.py).
``LIMITATIONS`` are the combinations refused today although nothing physical
forbids them; each names the refusal's message.  ``RUNS`` covers every pair
of values that some configuration free of limitations holds, with such
configurations only, so that those pairs are exercised today; ``REFUSED``
adds the configurations that cover the remaining pairs, each refused by a
single limitation where one suffices, every limitation alone at least once.  tests/test_composition_mpi.py runs all of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from pairwise import configurations, pairwise

AXES = {
    "mode": ("blocking", "asynchronous"),
    "kind": ("full", "incremental"),
    "level": ("none", "L1", "L2", "L3", "RS", "PM"),
    "precopy": (False, True),
    "files": ("off", "shared", "per-rank"),
    "codec": ("none", "lz4", "shuffle+zstd", "blosc2", "lossy"),
    "resize": (False, True),
    "end": ("close", "signal", "halt"),
}

def possible(config: dict) -> bool:
    """Whether the combination is physically possible (pre-copy needs incremental versions)."""
    return not (config["precopy"] and config["kind"] == "full")


@dataclass(frozen=True)
class Limitation:
    """A combination refused today: which configurations it refuses, and the refusal's message (a regex)."""

    name: str
    applies: Callable[[dict], bool]
    message: str


def _engine(config: dict) -> bool:
    return config["mode"] == "asynchronous" or config["level"] != "none"


LIMITATIONS = (
    Limitation("tracked files with asynchronous or multi-level saves",
               lambda c: c["files"] != "off" and _engine(c),
               re.escape("tracked files (files=...) need blocking saves: they are not supported with asynchronous "
                         "or multi-level saves")),
    Limitation("resize with asynchronous or multi-level saves",
               lambda c: c["resize"] and _engine(c),
               re.escape("resize is not supported with an asynchronous or multi-level engine")),
    Limitation("resize with per-rank tracked files",
               lambda c: c["resize"] and c["files"] == "per-rank",
               re.escape("resize is not supported with per-rank tracked files ({rank} in a path): the files of a "
                         "leaving rank would have no owner")),
    Limitation("pre-copy with blocking saves or a node-local level",
               lambda c: c["precopy"] and (c["mode"] == "blocking" or c["level"] != "none"),
               re.escape("precopy needs asynchronous=True and incremental=True, without local_dir")),
)


def limitations(config: dict) -> list[Limitation]:
    """The limitations that refuse ``config`` today (empty: it must work)."""
    return [lim for lim in LIMITATIONS if lim.applies(config)]


def _refused(runs: list[dict]) -> list[dict]:
    """Configurations that cover the pairs ``runs`` leaves out, each refused by one limitation alone where one
    suffices (so that every limitation's own message is seen: a configuration refused by several shows only the
    first refusal it meets), and at least one per limitation."""
    chosen: list[dict] = []
    for lim in LIMITATIONS:
        alone = lambda c, lim=lim: possible(c) and limitations(c) == [lim]  # noqa: E731
        added = pairwise(AXES, alone, start=runs + chosen)
        chosen += added or [next(c for c in configurations(AXES) if alone(c))]
    return chosen + pairwise(AXES, possible, start=runs + chosen)


RUNS = pairwise(AXES, lambda c: possible(c) and not limitations(c))
REFUSED = _refused(RUNS)
CONFIGS = RUNS + REFUSED


def label(config: dict) -> str:
    """A test id: ``async-incr-L2-precopy-sharedfiles-blosc2-resize-signal`` (no end named: ``close()``)."""
    return "-".join([
        "block" if config["mode"] == "blocking" else "async",
        config["kind"][:4],
        config["level"],
        *(["precopy"] if config["precopy"] else []),
        {"off": "nofiles", "shared": "sharedfiles", "per-rank": "rankfiles"}[config["files"]],
        config["codec"],
        *(["resize"] if config["resize"] else []),
        *([config["end"]] if config["end"] != "close" else []),
    ])
