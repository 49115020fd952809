"""Tracked output files: the overhead per save of an append-only and of an in-place file.

    python bench/files.py [--mib 1024] [--saves 5] [--dir DIR] [--json out.json]

One process (a SerialComm: rank 0 records shared files, so one rank is what
a save of a shared file costs).  The state is a 1 MiB Block.  Cases, each on
a file of ``--mib`` MiB:

* ``append``: 8 MiB appended before each save; the file is append-only.
* ``inplace clustered``: 1% of the file rewritten as one contiguous run.
* ``inplace scattered``: 1% rewritten as 64 KiB writes at random offsets,
  with the default 1 MiB blocks and with 64 KiB blocks.

Each case makes one first save (an in-place file is then stored whole), then
``--saves`` measured saves, each paired with a save of the same state without
tracked files run right after it (the machine's load changes: the overhead is
the median of the paired differences).  Reported per save: the bytes stored
for the files (the version's ``tracked/`` files, and the growth of
``metadata.json``), the save time with and without the files, and for the
in-place cases the time of one rollback (restore of the previous version
after another rewrite).  fsync on; the file's pages are in the page cache,
as they are right after the application wrote them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import hpcckpt  # noqa: E402
from hpcckpt.mpi.collective import SerialComm  # noqa: E402
from benchutil import print_table  # noqa: E402

MIB = 1 << 20


def state(step):
    return {"u": hpcckpt.Block(np.full(MIB // 8, float(step))), "step": step}


def dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


def make_file(path: str, nbytes: int) -> None:
    block = np.random.default_rng(0).integers(0, 256, 8 * MIB, dtype=np.uint8).tobytes()
    with open(path, "wb") as f:
        for at in range(0, nbytes, len(block)):
            f.write(block[:min(len(block), nbytes - at)])


def change(path: str, case: str, rng: random.Random, nbytes: int) -> None:
    if case == "append":
        with open(path, "ab") as f:
            f.write(os.urandom(8 * MIB))
        return
    with open(path, "r+b") as f:
        if case.startswith("inplace clustered"):
            f.seek(rng.randrange(nbytes - nbytes // 100))
            f.write(os.urandom(nbytes // 100))
        else:
            piece = 64 << 10
            for _ in range(max(1, nbytes // 100 // piece)):
                f.seek(rng.randrange(nbytes - piece))
                f.write(os.urandom(piece))


def run_case(case: str, mode: str, block_bytes: int, args, work: str) -> dict:
    rng = random.Random(1)
    nbytes = args.mib * MIB
    target = os.path.join(work, "output.bin")
    make_file(target, nbytes)
    tracked_root, plain_root = os.path.join(work, "tracked"), os.path.join(work, "plain")
    ck = hpcckpt.Checkpointer(tracked_root, comm=SerialComm(), keep=args.saves + 2, track_failures=False,
                              handle_signals=False)
    ck.track_files(target, mode=mode, block_bytes=block_bytes)
    plain = hpcckpt.Checkpointer(plain_root, comm=SerialComm(), keep=args.saves + 2, track_failures=False,
                              handle_signals=False)
    t0 = time.perf_counter()
    first = ck.save(state(0), 0)
    first_s = time.perf_counter() - t0
    first_bytes = dir_bytes(os.path.join(first.path, "tracked"))
    with_s, without_s, stored, meta_growth = [], [], [], []
    for k in range(1, args.saves + 1):
        change(target, case, rng, nbytes)
        t0 = time.perf_counter()
        r = ck.save(state(k), k)
        with_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        p = plain.save(state(k), k)
        without_s.append(time.perf_counter() - t0)
        stored.append(dir_bytes(os.path.join(r.path, "tracked")))
        meta_growth.append(os.path.getsize(os.path.join(r.path, "metadata.json"))
                           - os.path.getsize(os.path.join(p.path, "metadata.json")))
    rollback_s = None
    if mode == "inplace":
        change(target, case, rng, nbytes)
        t0 = time.perf_counter()
        ck.restore({"u": hpcckpt.Block(np.zeros(MIB // 8)), "step": None})
        rollback_s = time.perf_counter() - t0
    ck.close()
    plain.close()
    for d in (tracked_root, plain_root):
        shutil.rmtree(d)
    os.remove(target)
    diffs = [a - b for a, b in zip(with_s, without_s)]
    return {"case": case, "mode": mode, "block_bytes": block_bytes, "file_bytes": nbytes,
            "first_save_s": first_s, "first_stored_bytes": first_bytes,
            "stored_bytes_per_save": statistics.median(stored), "metadata_growth_bytes": statistics.median(meta_growth),
            "save_s_with": statistics.median(with_s), "save_s_without": statistics.median(without_s),
            "overhead_s": statistics.median(diffs), "rollback_s": rollback_s}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=1024, help="size of the tracked file in MiB")
    p.add_argument("--saves", type=int, default=5, help="measured saves per case")
    p.add_argument("--dir", help="work directory (default: a temporary one)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    work = tempfile.mkdtemp(prefix="hpcckpt-files-", dir=args.dir)
    try:
        results = [run_case("append", "append", MIB, args, work),
                   run_case("inplace clustered 1%", "inplace", MIB, args, work),
                   run_case("inplace scattered 1%", "inplace", MIB, args, work),
                   run_case("inplace scattered 1%", "inplace", 64 << 10, args, work)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(["case", "block", "stored / save", "metadata +", "save with", "save without", "overhead",
                 "first save (stored)", "rollback"],
                [[r["case"], f"{r['block_bytes'] >> 10} KiB", f"{r['stored_bytes_per_save'] / MIB:.2f} MiB",
                  f"{r['metadata_growth_bytes'] / 1024:.1f} KiB", f"{r['save_s_with'] * 1e3:.0f} ms",
                  f"{r['save_s_without'] * 1e3:.0f} ms", f"{r['overhead_s'] * 1e3:.0f} ms",
                  f"{r['first_save_s']:.2f} s ({r['first_stored_bytes'] / MIB:.0f} MiB)",
                  "-" if r["rollback_s"] is None else f"{r['rollback_s']:.2f} s"] for r in results])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"mib": args.mib, "saves": args.saves, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
