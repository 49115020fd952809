#!/usr/bin/env python
"""Asynchronous and multi-level checkpointing benchmark.

    .venv/bin/mpiexec -n 4 .venv/bin/python bench/async.py --total-mib 512 --repeats 3

One run, ``--total-mib`` of float64 state split evenly over the ranks,
simulated nodes of ``--ranks-per-node`` ranks, the root under ``--root``
(a disk directory) and the node-local level under ``--local`` (/dev/shm):

* memcpy: one ``np.copyto`` of the rank's state into a preallocated buffer
  (the floor for any save that lets the caller go on at once);
* blocking time of ``Checkpointer.save``: asynchronous to the root (L4 only),
  asynchronous with levels (L1 + partner copies, flush to L4), and the
  blocking (synchronous) save for reference; the pool is warm (second and
  later saves), as in a time loop;
* compute slowdown: a stencil loop (1 M float64 per rank) timed per iteration
  alone, then while the background writer runs, then while the L4 flush runs;
* restore: from L1 (/dev/shm) vs from L4 (the root, with the data files'
  pages dropped first through posix_fadvise(DONTNEED), i.e. cold).

Times are the slowest rank's (allreduce MAX of each rank's time between
barriers), medians over ``--repeats``.  Rank 0 prints a Markdown table.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from hpcckpt import Block, Checkpointer  # noqa: E402
from benchutil import drop_cache  # noqa: E402 - bench/ is the script's folder

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size


def slowest(seconds: float) -> float:
    return comm.allreduce(seconds, op=MPI.MAX)


def timed(fn) -> float:
    comm.Barrier()
    t = time.perf_counter()
    fn()
    return slowest(time.perf_counter() - t)



def stencil_loop(u: np.ndarray, v: np.ndarray, until=None, iterations: int = 0) -> list[float]:
    """Per-iteration seconds of a 3-point stencil; runs ``iterations`` times or while ``until()`` is true."""
    out = []
    k = 0
    while (until() if until is not None else k < iterations):
        t = time.perf_counter()
        np.add(u[2:], u[:-2], out=v[1:-1])
        np.multiply(v, 0.5, out=u)
        out.append(time.perf_counter() - t)
        k += 1
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--total-mib", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--ranks-per-node", type=int, default=2)
    p.add_argument("--root", default=None, help="directory for the shared level (default: a new one in /tmp)")
    p.add_argument("--local", default=None, help="node-local directory (default: a new one in /dev/shm)")
    p.add_argument("--json", default=None, help="also write the results here (rank 0)")
    p.add_argument("--no-torch", action="store_true", help="skip the torch.distributed.checkpoint comparison")
    p.add_argument("--stall-only", action="store_true",
                   help="only the memcpy floor and the asynchronous save to the root (the time save() blocks)")
    args = p.parse_args()
    os.environ["HPCCKPT_RANKS_PER_NODE"] = str(args.ranks_per_node)
    base = comm.bcast(tempfile.mkdtemp(prefix="hpcckpt-bench-async-", dir=args.root) if rank == 0 else None)
    local = comm.bcast(tempfile.mkdtemp(prefix="hpcckpt-bench-async-", dir=args.local or "/dev/shm")
                       if rank == 0 else None)
    n = args.total_mib * (1 << 20) // 8 // size
    a = np.random.default_rng(rank).standard_normal(n)
    state = lambda: {"u": Block(a, (rank * n,), (size * n,)), "t": 0.0}  # noqa: E731
    staging = a.nbytes + (64 << 20)
    res: dict = {"ranks": size, "ranks_per_node": args.ranks_per_node, "state_mib": args.total_mib}
    try:
        # memcpy floor: measured right before each timed save as well (the shared VM's load drifts), and the
        # ratio of each save to its neighbouring memcpy is reported besides the medians
        dst = np.empty_like(a)
        np.copyto(dst, a)
        res["memcpy"] = statistics.median(timed(lambda: np.copyto(dst, a)) for _ in range(args.repeats))

        def blocking(ck, name):
            ck.save(state(), 0)
            ck.wait()
            times, floors = [], []
            for i in range(1, args.repeats + 1):
                floors.append(timed(lambda: np.copyto(dst, a)))
                times.append(timed(lambda: ck.save(state(), i)))
                a[:1] += 1.0  # the application goes on writing its state
                ck.wait()
            res[name] = statistics.median(times)
            res[name + "_memcpy"] = statistics.median(floors)
            res[name + "_ratio"] = statistics.median(t / f for t, f in zip(times, floors))

        opts = dict(track_failures=False, keep=2, fsync=True)
        with Checkpointer(os.path.join(base, "async"), asynchronous=True, staging_bytes=staging, **opts) as ck:
            blocking(ck, "save_async_root")
        if not args.stall_only:
            with Checkpointer(os.path.join(base, "sync"), **opts) as ck:
                blocking(ck, "save_sync")
            levels = dict(asynchronous=True, staging_bytes=staging, local_dir=local, partner_every=1, flush_every=1,
                          **opts)
            with Checkpointer(os.path.join(base, "levels"), **levels) as ck:
                blocking(ck, "save_async_levels")

                # compute slowdown while the background writer, then the flush, runs
                u = np.random.default_rng(0).standard_normal(1 << 20)
                v = np.zeros_like(u)
                stencil_loop(u, v, iterations=20)
                alone = statistics.median(stencil_loop(u, v, iterations=200))
                eng = ck.engine
                during_write, during_flush = [], []
                for i in range(args.repeats):
                    comm.Barrier()
                    ck.save(state(), 100 + i)
                    during_write += stencil_loop(u, v, until=lambda: not eng.pending.writer.done)
                    ck.engine.sync()  # commits (partner copies over MPI) and starts the flush
                    flushing = lambda: eng.node.flush is not None and not eng.node.flush.thread.done  # noqa: E731
                    during_flush += stencil_loop(u, v, until=flushing)
                    ck.wait()
                mean = lambda xs: statistics.fmean(xs) if xs else float("nan")  # noqa: E731
                res["stencil_alone"] = comm.allreduce(alone) / size
                res["stencil_during_write"] = comm.allreduce(mean(during_write)) / size
                res["stencil_during_flush"] = comm.allreduce(mean(during_flush)) / size
                res["iterations_during_flush"] = comm.allreduce(len(during_flush))

                # restore: L1 vs L4 (cold)
                b = np.zeros_like(a)
                tmpl = lambda: {"u": Block(b, (rank * n,), (size * n,)), "t": None}  # noqa: E731
                l1 = []
                for _ in range(args.repeats):
                    l1.append(timed(lambda: ck.restore(tmpl())))
                    assert eng.restored_level == "L1"
                res["restore_L1"] = statistics.median(l1)
                restored = ck.last_restored
            with Checkpointer(os.path.join(base, "levels"), track_failures=False) as plain:
                l4 = []
                for _ in range(args.repeats):
                    if rank == 0:
                        drop_cache(os.path.join(base, "levels"))
                    l4.append(timed(lambda: plain.restore(tmpl())))
                res["restore_L4_cold"] = statistics.median(l4)
                res["restore_L4_warm"] = timed(lambda: plain.restore(tmpl()))
            assert os.path.basename(restored) == os.path.basename(plain.last_restored), (restored, plain.last_restored)
            if not args.no_torch:
                torch_dcp(res, a, dst, base, args.repeats)
    finally:
        comm.Barrier()
        if rank == 0:
            shutil.rmtree(base, ignore_errors=True)
            shutil.rmtree(local, ignore_errors=True)
    if rank == 0:
        report(res, args)


def torch_dcp(res: dict, a: np.ndarray, dst: np.ndarray, base: str, repeats: int) -> None:
    """torch.distributed.checkpoint.async_save (thread executor, gloo): the time it blocks the caller."""
    try:
        import torch
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
    except ImportError as exc:
        res["torch"] = f"skipped: {exc}"
        return
    torch.set_num_threads(1)
    port = comm.bcast(_free_port() if rank == 0 else None)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=size)
    try:
        t = torch.from_numpy(a)
        sd = {f"u{rank}": t}  # each rank's own shard under its own key (no de-duplication)
        fut = dcp.async_save(sd, checkpoint_id=os.path.join(base, "dcp-0"),
                             async_checkpointer_type=AsyncCheckpointerType.THREAD)
        fut.result()
        times, floors = [], []
        for i in range(1, repeats + 1):
            floors.append(timed(lambda: np.copyto(dst, a)))
            box = []
            times.append(timed(lambda: box.append(dcp.async_save(
                sd, checkpoint_id=os.path.join(base, f"dcp-{i}"),
                async_checkpointer_type=AsyncCheckpointerType.THREAD))))
            a[:1] += 1.0
            box[0].result()
            comm.Barrier()
        res["torch_version"] = torch.__version__
        res["torch_async_save"] = statistics.median(times)
        res["torch_async_save_ratio"] = statistics.median(x / f for x, f in zip(times, floors))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def report(r: dict, args) -> None:
    mib = r["state_mib"]
    if args.stall_only:
        print(f"\n{r['ranks']} ranks, {mib} MiB state, median of {args.repeats}: np.copyto {r['memcpy']:.4f} s; "
              f"asynchronous save blocks {r['save_async_root']:.4f} s = {r['save_async_root_ratio']:.2f}x the memcpy "
              "measured just before each save (median of the paired ratios)")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(r, f, indent=1)
        return
    gbs = lambda s: mib / 1024 / s  # noqa: E731
    rows = [
        ("np.copyto of the state (memcpy floor)", r["memcpy"], "1.00x memcpy"),
        ("save, blocking (synchronous, to the root)", r["save_sync"], f"{r['save_sync'] / r['memcpy']:.2f}x memcpy"),
        ("save, asynchronous to the root: time save() blocks", r["save_async_root"],
         f"{r['save_async_root'] / r['memcpy']:.2f}x memcpy; {r['save_async_root_ratio']:.2f}x the memcpy "
         "measured just before each save"),
        ("save, asynchronous with L1+L2, flush to L4: time save() blocks", r["save_async_levels"],
         f"{r['save_async_levels'] / r['memcpy']:.2f}x memcpy; {r['save_async_levels_ratio']:.2f}x the memcpy "
         "measured just before each save"),
        ("stencil iteration, alone", r["stencil_alone"], "1.00x"),
        ("stencil iteration, during the background write", r["stencil_during_write"],
         f"{r['stencil_during_write'] / r['stencil_alone']:.2f}x"),
        ("stencil iteration, during the L4 flush", r["stencil_during_flush"],
         f"{r['stencil_during_flush'] / r['stencil_alone']:.2f}x ({r['iterations_during_flush']} iterations)"),
        ("restore from L1 (/dev/shm)", r["restore_L1"], f"{gbs(r['restore_L1']):.2f} GiB/s"),
        ("restore from L4 (root, cold cache)", r["restore_L4_cold"],
         f"{gbs(r['restore_L4_cold']):.2f} GiB/s; L4/L1 = {r['restore_L4_cold'] / r['restore_L1']:.2f}x"),
        ("restore from L4 (root, warm cache)", r["restore_L4_warm"], f"{gbs(r['restore_L4_warm']):.2f} GiB/s"),
    ]
    if "torch_async_save" in r:
        rows.insert(4, (f"torch {r['torch_version']} DCP async_save (thread executor): time it blocks",
                        r["torch_async_save"], f"{r['torch_async_save'] / r['memcpy']:.2f}x memcpy; "
                        f"{r['torch_async_save_ratio']:.2f}x the neighbouring memcpy; "
                        f"{r['torch_async_save'] / r['save_async_root']:.1f}x hpcckpt's asynchronous save"))
    elif "torch" in r:
        print(f"torch DCP comparison {r['torch']}")
    print(f"\n{r['ranks']} ranks, {r['ranks_per_node']} per simulated node, {mib} MiB state, "
          f"median of {args.repeats}\n")
    print("| measurement | seconds | relative |\n|---|---|---|")
    for name, s, rel in rows:
        print(f"| {name} | {s:.4f} | {rel} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)


if __name__ == "__main__":
    main()
