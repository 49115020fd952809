"""Flip every bit of a small committed metadata.json and cut it at every length; count silent changes.

A silent change is a damaged file that parses and gives a restore something
other than the original (step, files, variables and chunk tables, values).
The figure of docs/performance.md: run with ``HPCCKPT_NO_MPI=1 python bench/metadata_flips.py``.
"""

from __future__ import annotations

import json
import tempfile

import numpy as np

import hpcckpt
from hpcckpt.errors import CorruptCheckpointError
from hpcckpt.format.metadata import parse


def restore_view(meta) -> str:
    """Everything in parsed metadata that a restore depends on (not ``extra`` or ``created``)."""
    return json.dumps([meta.step, meta.files, {n: v.to_json(False) for n, v in meta.variables.items()}, meta.values],
                      sort_keys=True)


def outcome(raw: bytes, reference: str) -> str:
    try:
        return "same" if restore_view(parse(raw)) == reference else "silent"
    except CorruptCheckpointError:
        return "refused"


def main() -> None:
    path = tempfile.mkdtemp() + "/v"
    u = np.arange(12.0).reshape(3, 4)
    parts = np.zeros(3, [("x", "<f4"), ("id", "<i8")])
    parts["id"] = [5, 6, 7]
    hpcckpt.save({"u": hpcckpt.Block(u, offset=(0, 0), global_shape=u.shape), "parts": hpcckpt.Ragged(parts),
                  "step": 3, "dt": 0.5, "name": "run", "rng": np.arange(4, dtype="<u8")}, path, chunk_bytes=32, step=3)
    with open(path + "/metadata.json", "rb") as f:
        raw = f.read()
    reference = restore_view(parse(raw))
    flips = {"refused": 0, "same": 0, "silent": 0}
    for i in range(len(raw)):
        for bit in range(8):
            bad = bytearray(raw)
            bad[i] ^= 1 << bit
            flips[outcome(bytes(bad), reference)] += 1
    cuts = {"refused": 0, "same": 0, "silent": 0}
    for n in range(len(raw)):
        cuts[outcome(raw[:n], reference)] += 1
    print(f"{len(raw)}-byte metadata.json: {8 * len(raw)} single-bit flips -> {flips}; "
          f"{len(raw)} truncations -> {cuts}")


if __name__ == "__main__":
    main()
