#!/usr/bin/env python
"""The floor of a crash-consistent save in hpcckpt's on-disk layout, against raw, with no hpcckpt code.

    flock /tmp/hpcckpt-bench.lock .venv/bin/python bench/save_floor.py --sizes 64K 1M 16M --repeats 200

One process, no MPI.  Each repeat runs, in alternating order, into a fresh
directory of ``--root`` (default: a temporary one on /tmp's disk):

* ``raw``: what bench/latency.py's raw save does on one rank: the data
  ``tofile`` into a new file + fsync, then a small JSON index written and
  fsynced (2 fsyncs);
* ``floor``: only the file-system steps that docs/format.md section 2 asks of a
  version, in the order hpcckpt runs them, with the same bytes and an index of
  the same size as metadata: ``mkdir`` of the version directory and its
  ``data/``, the data file + fsync, fsync of ``data/`` and of the root (the
  new entries), ``metadata.json.tmp`` + fsync, rename, fsync of the version
  directory (5 fsyncs, 2 mkdirs, 1 rename) and nothing else: no planning, no
  checksum, no Python of hpcckpt's.

* ``flat``: the same steps as ``floor`` with the data file directly in the
  version directory instead of ``data/`` (a format change this benchmark
  prices: one ``mkdir`` less, and the writer's directory fsync is then of the
  version directory, 5 fsyncs still, since the data files' entries must be
  durable before the rename).

The ratio floor / raw (median of the per-repeat ratios) is the least a
repeated hpcckpt save of that size can be over raw on this disk, whatever its
code does; the ``extra ms`` column is floor - raw.  A target "within 1.3x raw"
cannot hold at a size where this ratio is already near or above 1.3.  Each
repeat's directory is deleted after its timing, outside it.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchutil import print_table  # noqa: E402 - bench/ is the script's folder
from latency import med, paired, parse_size  # noqa: E402


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path: str, data) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def raw_save(top: str, k: int, arr: np.ndarray, index: bytes) -> None:
    """bench/latency.py's raw save on one rank: a new data file and an index, each fsynced."""
    with open(os.path.join(top, f"raw-{k:06d}.bin"), "wb") as f:
        arr.tofile(f)
        f.flush()
        os.fsync(f.fileno())
    write_synced(os.path.join(top, f"raw-{k:06d}.json"), index)


def version_save(top: str, k: int, arr: np.ndarray, index: bytes, data_dir: str | None = "data") -> None:
    """The file-system steps of one version in hpcckpt's layout (docs/format.md section 2), nothing else;
    ``data_dir`` None: the data file directly in the version directory (the ``flat`` variant)."""
    version = os.path.join(top, f"step-{k:012d}")
    data = version if data_dir is None else os.path.join(version, data_dir)
    os.mkdir(version)
    if data_dir is not None:
        os.mkdir(data)
    with open(os.path.join(data, "part-000000.bin"), "wb") as f:
        arr.tofile(f)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(data)
    fsync_dir(top)
    tmp = os.path.join(version, "metadata.json.tmp")
    write_synced(tmp, index)
    os.replace(tmp, os.path.join(version, "metadata.json"))
    fsync_dir(version)


METHODS = {"raw": raw_save, "floor": version_save, "flat": functools.partial(version_save, data_dir=None)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", nargs="+", default=["64K", "1M", "16M"])
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--index-bytes", type=int, default=1500, help="the index / metadata size (a small version's)")
    p.add_argument("--root", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    index = json.dumps({"pad": "x" * max(0, args.index_bytes - 12)}).encode()
    rows, record = [], {"repeats": args.repeats, "load_average": os.getloadavg(), "sizes": {}}
    for text in args.sizes:
        arr = np.random.default_rng(0).random(parse_size(text) // 8)
        times = {m: [] for m in METHODS}
        for k in range(args.repeats):
            order = list(METHODS)[k % 3:] + list(METHODS)[:k % 3]
            for method in order:
                top = tempfile.mkdtemp(prefix=f"floor-{method}-", dir=args.root)
                t0 = time.perf_counter()
                METHODS[method](top, k, arr, index)
                times[method].append(time.perf_counter() - t0)
                shutil.rmtree(top)
        ratio, flat_ratio = paired(times["floor"], times["raw"]), paired(times["flat"], times["raw"])
        raw, floor, flat = med(times["raw"]), med(times["floor"]), med(times["flat"])
        rows.append([text, f"{raw * 1e3:.2f}", f"{floor * 1e3:.2f}", f"{(floor - raw) * 1e3:.2f}", f"{ratio:.2f}",
                     f"{flat * 1e3:.2f}", f"{flat_ratio:.2f}"])
        record["sizes"][text] = dict(times, ratio=ratio, flat_ratio=flat_ratio)
    print_table(["size", "raw ms", "floor ms", "extra ms", "floor / raw", "flat ms", "flat / raw"], rows)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
