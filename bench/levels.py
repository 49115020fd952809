#!/usr/bin/env python
"""Encode and rebuild throughput of the parity levels: XOR (levels/parity.py) against Reed-Solomon (levels/rs.py).

Run under mpiexec; every rank is a node of its own and the group is every rank:

    MPIR_CVAR_CH4_PROGRESS_THROTTLE=1 MPIR_CVAR_POLLS_BEFORE_YIELD=1 \\
        .venv/bin/mpiexec -n 4 .venv/bin/python bench/levels.py --size-mib 64 --repeats 5 --json levels.json

Each rank writes a data file of ``--size-mib`` MiB (random bytes) into
``--dir`` (default /dev/shm, so that the figures are the levels' arithmetic
and messages, not a disk), then every repeat runs, in an order that rotates
from repeat to repeat:

* ``encode``: XOR parity (one member's loss), and Reed-Solomon for each
  ``--codes`` (k, m) with k + m <= ranks (and, with ``--rs-round-kib``, for
  each of those round sizes instead of the level's ``rs.ROUND_BYTES``);
* ``rebuild``: XOR rebuilding one lost member; Reed-Solomon rebuilding one
  lost member and m lost members (the lost ranks receive, the others send).

No fsync (tmpfs).  Timing: ``Barrier; t0; operation; Barrier; t1``, rank 0's
clock (the slowest rank).  Throughput: encode, the data protected per rank
(``--size-mib`` / time); rebuild, the bytes rebuilt in all (lost files) / time.
Each row's ``vs XOR`` is the median over repeats of the paired ratio of its
time to the XOR row's of the same repeat (encode: XOR encode; rebuild: XOR
rebuilding one member), which cancels most of a shared machine's drift.
Every rebuilt file is compared with the original.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

import numpy as np
from mpi4py import MPI

from benchutil import print_table
from hpcckpt.levels import parity, rs, rs_coder
from hpcckpt.levels.rs_layout import rebuild_plan, segment_bytes
from hpcckpt.storage import POSIX


def timed(comm, fn) -> float:
    comm.Barrier()
    t0 = time.perf_counter()
    fn()
    comm.Barrier()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mib", type=float, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--codes", default="3+1,2+2", help="Reed-Solomon (k, m) pairs as k+m, comma separated")
    ap.add_argument("--rs-round-kib", default="", help="Reed-Solomon rounds to compare, KiB, comma separated "
                    "(default: the level's own, rs.ROUND_BYTES)")
    ap.add_argument("--dir", default="/dev/shm")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    codes = [tuple(int(x) for x in c.split("+")) for c in args.codes.split(",") if c]
    codes = [(k, m) for k, m in codes if k + m <= n]
    rounds = [int(x) << 10 for x in args.rs_round_kib.split(",") if x] or [rs.ROUND_BYTES]
    work = comm.bcast(tempfile.mkdtemp(prefix="hpcckpt-levels-", dir=args.dir) if rank == 0 else None)
    size = int(args.size_mib * (1 << 20))
    sizes = [size] * n
    mine = os.path.join(work, f"data-{rank}.bin")
    original = np.random.default_rng(rank).integers(0, 256, size, dtype=np.uint8)
    original.tofile(mine)
    xor_parity, rs_parity = os.path.join(work, f"xor-{rank}.bin"), os.path.join(work, f"rs-{rank}.bin")
    rebuilt = os.path.join(work, f"rebuilt-{rank}.bin")

    def check(path):
        ok = np.array_equal(np.fromfile(path, np.uint8), original)
        if not all(comm.allgather(ok)):
            raise SystemExit(f"rank {rank}: a rebuilt file differs from the original")

    def xor_encode():
        parity.encode(POSIX, comm, mine, size, sizes, xor_parity, fsync=False)

    def xor_rebuild():
        seg = parity.segment_bytes(sizes)
        parity.rebuild(POSIX, comm, n - 1, mine, size, xor_parity, seg, size, rebuilt, fsync=False)

    def rs_encode(k, m, rb):
        return lambda: rs.encode(POSIX, comm, (k, m), mine, size, sizes, rs_parity, fsync=False, round_bytes=rb)

    def rs_rebuild(k, m, lost, rb):
        seg = segment_bytes(sizes, k)
        erased = {(j, kind, i) for j in lost for kind, count in (("data", k), ("parity", m)) for i in range(count)}
        tasks, _ = rebuild_plan(n, k, m, erased)

        def run():
            # a lost rank rebuilds into a fresh copy path: its original stays for the check
            target = rebuilt if rank in lost else mine
            if rank in lost and os.path.exists(rebuilt):
                os.unlink(rebuilt)
            rs.rebuild(POSIX, comm, (k, m), seg, tasks, target, size, rs_parity, fsync=False, round_bytes=rb)
        return run

    rows = {}  # name -> (kind, bytes per timing, [seconds])

    def record(name, kind, nbytes, seconds):
        rows.setdefault(name, (kind, nbytes, []))[2].append(seconds)

    for rep in range(args.repeats):
        cases = [("XOR", None)] + [(f"RS k={k} m={m}" + (f", {rb >> 10} KiB rounds" if len(rounds) > 1 else ""),
                                    (k, m, rb)) for k, m in codes for rb in rounds]
        shift = rep % len(cases)
        for name, code in cases[shift:] + cases[:shift]:
            if code is None:
                record("XOR", "encode", size, timed(comm, xor_encode))
                if rank == n - 1 and os.path.exists(rebuilt):
                    os.unlink(rebuilt)
                record("XOR, 1 lost", "rebuild", size, timed(comm, xor_rebuild))
                if rank == n - 1:
                    ok = np.array_equal(np.fromfile(rebuilt, np.uint8), original)
                else:
                    ok = True
                if not all(comm.allgather(ok)):
                    raise SystemExit("XOR rebuild differs from the original")
                continue
            k, m, rb = code
            record(name, "encode", size, timed(comm, rs_encode(k, m, rb)))
            for lost in sorted({(n - 1,), tuple(range(n - m, n))}):
                record(f"{name}, {len(lost)} lost", "rebuild", size * len(lost),
                       timed(comm, rs_rebuild(k, m, lost, rb)))
                if rank in lost:
                    check(rebuilt)
                else:
                    comm.allgather(True)
    if rank == 0:
        base = {"encode": rows["XOR"][2], "rebuild": rows["XOR, 1 lost"][2]}
        table, out = [], {"ranks": n, "size_mib": args.size_mib, "repeats": args.repeats, "rs_round_bytes": rounds,
                          "rs_coder": rs_coder.CODER, "rows": []}
        for name, (kind, nbytes, secs) in sorted(rows.items(), key=lambda item: item[1][0] == "rebuild"):
            med = statistics.median(secs)
            ratio = statistics.median(s / b for s, b in zip(secs, base[kind]))
            table.append((kind, name, f"{med * 1e3:.0f} ms", f"{nbytes / med / 1e6:.0f} MB/s", f"{ratio:.2f}x"))
            out["rows"].append({"kind": kind, "name": name, "seconds": secs, "bytes": nbytes, "median_s": med,
                                "ratio_vs_xor": ratio})
        print(f"{n} ranks (one per node, one group), {args.size_mib:g} MiB per rank, {args.repeats} repeats, "
              f"dir {args.dir}")
        print_table(["", "level", "median time", "throughput", "vs XOR (paired)"], table)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
    comm.Barrier()
    if rank == 0:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
