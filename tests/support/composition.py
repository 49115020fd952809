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
refusal with the reason: tests/saving/test_precopy.py).
``CONFIGS`` covers every pair of values that some possible configuration
holds; tests/saving/test_composition_mpi.py runs all of them, and each must restore
the newest version exactly.
"""

from __future__ import annotations


from pairwise import pairwise

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


#: Every pair of values of two axes, in configurations that are possible: each restores the newest version.
CONFIGS = pairwise(AXES, possible)


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
