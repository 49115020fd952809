"""The persistent-memory tier against the L1 files level: bytes and time per incremental checkpoint.

    python bench/pmem.py [--mib 16] [--dir DIR] [--pmem-dir /dev/shm] [--repeat 3] [--json out.json]

One rank (no mpiexec needed).  A uint8 Block of ``--mib`` MiB; for each block
size from 64 B to 1 MiB and 1%, 5%, 25% of its blocks changed (random blocks,
one byte flipped in each), one incremental checkpoint of the changed state on
top of the previous one:

* L1: ``Checkpointer(local_dir=DIR, incremental=True, block_bytes=B)`` (the
  L1 files level, fsync on, no flush in the measured saves): the seconds of
  ``save`` and the bytes it wrote (data file plus ``metadata.json``);
* PM: ``PmemImage.update`` of the tier (levels/pmem.py, block B, msync on)
  whose target slot holds the previous version: the seconds and the bytes
  it copied into the map (plus the one header page it flushes).

Each case runs ``--repeat`` times, L1 and PM alternately (paired, same run);
medians.  Then the restore of the whole state (a full version held by both):
``Checkpointer.restore`` from L1 (the data file, page cache warm) against from
PM (the mapped image), alternately, medians of ``--repeat`` * 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import hpcckpt  # noqa: E402
from hpcckpt.levels.pmem import PAGE, PmemImage  # noqa: E402
from benchutil import print_table  # noqa: E402

BLOCKS = [64, 256, 1024, 4096, 16384, 65536, 262144, 1 << 20]
FRACTIONS = [0.01, 0.05, 0.25]


def changed(data: np.ndarray, block: int, fraction: float, rng) -> np.ndarray:
    """A copy of ``data`` with ``fraction`` of its ``block``-byte blocks changed (one byte flipped in each)."""
    out = data.copy()
    nblocks = -(-data.size // block)
    picks = rng.choice(nblocks, size=max(1, round(fraction * nblocks)), replace=False)
    out[picks * block] ^= 0xFF
    return out


def state(data: np.ndarray) -> dict:
    return {"u": hpcckpt.Block(data, (0,), (data.size,))}


def l1_case(where: str, base: np.ndarray, new: np.ndarray, block: int) -> tuple[float, int]:
    """Seconds and bytes of one incremental save of ``new`` on ``base`` into the L1 files level."""
    shutil.rmtree(where, ignore_errors=True)
    opts = dict(local_dir=os.path.join(where, "local"), incremental=True, block_bytes=block, flush_every=1000,
                track_failures=False, keep=None)
    with hpcckpt.Checkpointer(os.path.join(where, "root"), **opts) as ck:
        ck.save(state(base), 1)
        t = time.perf_counter()
        r = ck.save(state(new), 2)
        seconds = time.perf_counter() - t
        meta = os.path.getsize(os.path.join(ck.engine.node.path(os.path.basename(r.path)), "metadata.json"))
    return seconds, r.bytes_written + meta


def pm_case(path: str, base: np.ndarray, new: np.ndarray, block: int) -> tuple[float, int]:
    """Seconds and bytes of one update of the tier to ``new`` into the slot holding ``base``."""
    for suffix in ("", ".part"):
        if os.path.exists(path + suffix):
            os.unlink(path + suffix)
    img = PmemImage(path, 0, 1, block)
    img.update(base, "v0")
    img.update(base, "v1")  # both slots hold the base: the next update writes over one
    t = time.perf_counter()
    written = img.update(new, "v2")
    return time.perf_counter() - t, written + PAGE


def restore_times(where: str, pmem: str, data: np.ndarray, repeat: int) -> dict:
    shutil.rmtree(where, ignore_errors=True)
    opts = dict(local_dir=os.path.join(where, "local"), track_failures=False)
    with hpcckpt.Checkpointer(os.path.join(where, "root"), pmem_dir=pmem, **opts) as ck:
        ck.save(state(data), 1)
    out = {"L1": [], "PM": []}
    for _ in range(2 * repeat):
        for level, more in (("L1", {}), ("PM", {"pmem_dir": pmem})):
            target = np.zeros_like(data)
            with hpcckpt.Checkpointer(os.path.join(where, "root"), **opts, **more) as ck:
                t = time.perf_counter()
                ck.restore(state(target))
                out[level].append(time.perf_counter() - t)
                assert ck.engine.restored_level == level and np.array_equal(target, data)
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=16)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--pmem-dir", default="/dev/shm")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    base_dir = tempfile.mkdtemp(prefix="hpcckpt-bench-pmem-", dir=args.dir)
    pmem_dir = tempfile.mkdtemp(prefix="hpcckpt-bench-pmem-", dir=args.pmem_dir)
    rng = np.random.default_rng(17)
    data = rng.integers(0, 256, args.mib << 20, dtype=np.uint8)
    rows, records = [], []
    try:
        for block in BLOCKS:
            for fraction in FRACTIONS:
                new = changed(data, block, fraction, rng)
                l1, pm = [], []
                for _ in range(args.repeat):
                    l1.append(l1_case(os.path.join(base_dir, "l1"), data, new, block))
                    pm.append(pm_case(os.path.join(pmem_dir, "000000.pmem"), data, new, block))
                rec = {"block": block, "fraction": fraction,
                       "l1_seconds": statistics.median(s for s, _ in l1), "l1_bytes": l1[0][1],
                       "pm_seconds": statistics.median(s for s, _ in pm), "pm_bytes": pm[0][1]}
                records.append(rec)
                rows.append([block, f"{fraction:.0%}", f"{rec['l1_bytes'] / 2**20:.2f}", f"{rec['pm_bytes'] / 2**20:.2f}",
                             f"{rec['l1_seconds'] * 1e3:.1f}", f"{rec['pm_seconds'] * 1e3:.1f}",
                             f"{rec['pm_seconds'] / rec['l1_seconds']:.2f}"])
                print(rows[-1], flush=True)
        restore = restore_times(os.path.join(base_dir, "restore"), os.path.join(pmem_dir, "restore"), data,
                                args.repeat)
    finally:
        shutil.rmtree(base_dir, ignore_errors=True)
        shutil.rmtree(pmem_dir, ignore_errors=True)
    print(f"\n{args.mib} MiB, one rank, medians of {args.repeat} paired runs\n")
    print_table(["block B", "changed", "L1 MiB written", "PM MiB written", "L1 ms", "PM ms", "PM/L1 time"], rows)
    print(f"\nrestore of {args.mib} MiB: L1 {restore['L1'] * 1e3:.1f} ms, PM {restore['PM'] * 1e3:.1f} ms "
          f"(PM/L1 {restore['PM'] / restore['L1']:.2f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"mib": args.mib, "repeat": args.repeat, "cases": records,
                       "restore_seconds": restore}, f, indent=1)


if __name__ == "__main__":
    main()
