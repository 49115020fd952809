#!/usr/bin/env python
"""hpcckpt against torch DCP over fsspec/s3fs on a local Ceph object gateway: save and load, paired ratios, and
hpcckpt's S3 requests per version and per load.

Its own virtual environment (torch is no dependency of hpcckpt, and s3fs pins
botocore through aiobotocore; hpcckpt's conditional writes need boto3 >= 1.35,
so let pip pick the boto3 that aiobotocore's botocore allows):

    python3 -m venv /tmp/benchenv
    /tmp/benchenv/bin/pip install torch==2.13.0 s3fs numpy mpi4py mpich xxhash tqdm numcodecs
    /tmp/benchenv/bin/pip install "boto3>=1.35,<1.44" "botocore==1.43.117"  # the botocore aiobotocore 3.10 allows
    /tmp/benchenv/bin/pip install --no-deps -e .

Run WITHOUT mpiexec: it starts the gateway (tests/support/ceph_gateway.py:
Debian's ceph packages must be installed), one mpiexec job per rank count, and
stops the gateway at the end:

    flock /tmp/hpcckpt-bench.lock /tmp/benchenv/bin/python bench/object_store.py --ranks 1 2 --size-mib 64 --repeats 3

Each rank holds ``--size-mib`` MiB of float64 rows of one array split by rows.
Per repeat, in an order that alternates, each method saves a fresh version into
the bucket and loads it back on the same ranks (every loaded byte compared);
then, for N >= 2 ranks, a second job of N - 1 ranks loads every version again
(a reshard: each rank's rows span pieces that different writers saved):

* ``hpcckpt``: ``hpcckpt.save``/``hpcckpt.load`` of an ``s3://`` path (its
  default strategy, ``auto``), through one S3Storage per rank whose request
  counters are summed over the ranks.
* ``dcp``: ``torch.distributed.checkpoint.save``/``load`` of a DTensor sharded by
  rows, with ``FsspecWriter``/``FsspecReader`` on an ``s3://`` path (s3fs).

Times are the slowest rank's (barriers around each phase); ``ratio`` is the
median of per-repeat hpcckpt/dcp time ratios (below 1: hpcckpt faster).  The
gateway's OSD keeps objects in memory (memstore), so this measures request and
protocol costs, not disks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
NCOLS = 1024
BUCKET = "bench"


def rows_of(nrows: int, size: int, rank: int) -> tuple[int, int]:
    """The rows of ``rank``: torch's Shard(0) split (blocks of ceil(nrows / size) rows, the last ones shorter),
    which DTensor.from_local expects and hpcckpt takes as any other split."""
    block = -(-nrows // size)
    return min(rank * block, nrows), min((rank + 1) * block, nrows)


def total_rows(mib_per_rank: int, saved_ranks: int) -> int:
    """The array's rows: ``mib_per_rank`` MiB of float64 rows on each of the ranks that saved it."""
    return mib_per_rank * (1 << 20) * saved_ranks // (8 * NCOLS)


class Hpcckpt:
    name = "hpcckpt"

    def __init__(self):
        from hpcckpt.storage.s3 import S3Storage

        self.storage = S3Storage()

    def save(self, path, comm, arr, lo, nrows):
        import hpcckpt

        hpcckpt.save({"u": hpcckpt.Block(arr, (lo, 0), (nrows, NCOLS))}, path, comm, storage=self.storage)

    def load(self, path, comm, out, lo, nrows):
        import hpcckpt

        hpcckpt.load({"u": hpcckpt.Block(out, (lo, 0), (nrows, NCOLS))}, path, comm, storage=self.storage)

    def take_requests(self) -> dict:
        got = dict(self.storage.requests)
        self.storage.requests.clear()
        return got


class TorchDCP:
    name = "dcp"

    def __init__(self, comm):
        import socket

        import torch
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor import DTensor, Shard

        torch.set_num_threads(1)
        self.torch, self.dist, self.dcp, self.DTensor, self.Shard = torch, dist, dcp, DTensor, Shard
        self.Reader, self.Writer = FsspecReader, FsspecWriter
        port = None
        if comm.Get_rank() == 0:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(comm.bcast(port, root=0)),
                          RANK=str(comm.Get_rank()), WORLD_SIZE=str(comm.Get_size()))
        dist.init_process_group("gloo", rank=comm.Get_rank(), world_size=comm.Get_size())
        self.mesh = DeviceMesh("cpu", list(range(comm.Get_size())))

    def _dt(self, arr, nrows):
        return self.DTensor.from_local(self.torch.from_numpy(arr), self.mesh, [self.Shard(0)], run_check=False,
                                       shape=(nrows, NCOLS), stride=(NCOLS, 1))

    def save(self, path, comm, arr, lo, nrows):
        self.dcp.save({"u": self._dt(arr, nrows)}, storage_writer=self.Writer(path))

    def load(self, path, comm, out, lo, nrows):
        self.dcp.load({"u": self._dt(out, nrows)}, storage_reader=self.Reader(path))

    def close(self):
        self.dist.destroy_process_group()


def worker(args) -> None:
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    nrows = total_rows(args.size_mib, args.saved_by or size)
    lo, hi = rows_of(nrows, size, rank)
    arr = np.arange(lo * NCOLS, hi * NCOLS, dtype=np.float64).reshape(hi - lo, NCOLS)
    out = np.empty_like(arr)
    methods = [Hpcckpt(), TorchDCP(comm)]
    if args.saved_by:
        reshard(args, comm, methods, arr, out, lo, nrows)
        return
    times = {m.name: {"save": [], "load": []} for m in methods}
    requests = {"save": [], "load": []}
    run = args.run

    for rep in range(args.repeats):
        order = methods if rep % 2 == 0 else methods[::-1]
        for m in order:
            path = f"s3://{BUCKET}/{run}/{m.name}-{size}-{rep}"
            times[m.name]["save"].append(_timed(comm, lambda: m.save(path, comm, arr, lo, nrows)))
            if isinstance(m, Hpcckpt):
                requests["save"].append(_summed(comm, m.take_requests()))
            out[...] = -1
            times[m.name]["load"].append(_timed(comm, lambda: m.load(path, comm, out, lo, nrows)))
            if isinstance(m, Hpcckpt):
                requests["load"].append(_summed(comm, m.take_requests()))
            if not np.array_equal(out, arr):
                raise SystemExit(f"{m.name}: rank {rank} loaded wrong bytes")
    methods[1].close()
    if rank == 0:
        print(json.dumps({"ranks": size, "mib_per_rank": args.size_mib, "times": times, "requests": requests}))


def _timed(comm, fn) -> float:
    """The slowest rank's time of ``fn()``, started together."""
    from mpi4py import MPI

    comm.Barrier()
    t0 = time.perf_counter()
    fn()
    return comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)


def reshard(args, comm, methods, arr, out, lo, nrows) -> None:
    """Load every version the job of ``args.saved_by`` ranks saved, on this job's ranks, in the same alternating
    order; print the times and hpcckpt's requests per load as one JSON line (rank 0)."""
    import numpy as np

    size = comm.Get_size()
    times: dict = {m.name: {"reshard": []} for m in methods}
    requests: dict = {"reshard": []}
    for rep in range(args.repeats):
        for m in (methods if rep % 2 == 0 else methods[::-1]):
            path = f"s3://{BUCKET}/{args.run}/{m.name}-{args.saved_by}-{rep}"
            out[...] = -1
            times[m.name]["reshard"].append(_timed(comm, lambda: m.load(path, comm, out, lo, nrows)))
            if isinstance(m, Hpcckpt):
                requests["reshard"].append(_summed(comm, m.take_requests()))
            if not np.array_equal(out, arr):
                raise SystemExit(f"{m.name}: rank {comm.Get_rank()} loaded wrong bytes after the reshard")
    methods[1].close()
    if comm.Get_rank() == 0:
        print(json.dumps({"ranks": size, "saved_by": args.saved_by, "mib_per_rank": args.size_mib,
                          "times": times, "requests": requests}))


def _summed(comm, counts: dict) -> dict:
    total: dict = {}
    for part in comm.gather(counts, root=0) or ():
        for kind, n in part.items():
            total[kind] = total.get(kind, 0) + n
    return total


def report(result: dict) -> None:
    t = result["times"]
    phases = list(t["hpcckpt"])
    saved = f", saved by {result['saved_by']}" if "saved_by" in result else ""
    print(f"\n{result['ranks']} rank(s){saved}, {result['mib_per_rank']} MiB per saving rank, "
          f"{len(t['hpcckpt'][phases[0]])} repeats")
    print(f"{'phase':8} {'hpcckpt s':>10} {'dcp s':>10} {'ratio':>7}")
    for phase in phases:
        a, b = t["hpcckpt"][phase], t["dcp"][phase]
        ratio = statistics.median(x / y for x, y in zip(a, b))
        print(f"{phase:8} {statistics.median(a):10.3f} {statistics.median(b):10.3f} {ratio:7.2f}")
    for phase in phases:
        counts = result["requests"][phase][-1]
        print(f"hpcckpt requests per {'version' if phase == 'save' else phase}: {sum(counts.values())} "
              f"({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--size-mib", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write every timing and count here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--run", help=argparse.SUPPRESS)  # the versions' prefix in the bucket
    parser.add_argument("--saved-by", type=int, help=argparse.SUPPRESS)  # a reshard job: the saving job's ranks
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    sys.path.insert(0, os.path.join(REPO, "tests", "support"))
    from ceph_gateway import CephGateway

    gateway = CephGateway(osd_bytes=max(2 << 30, 4 * args.size_mib * max(args.ranks) * args.repeats << 20))
    results = []
    try:
        gateway.start()
        env = dict(os.environ, **gateway.environment(), PYTHONPATH=REPO)
        import boto3

        boto3.client("s3", endpoint_url=gateway.endpoint, aws_access_key_id=gateway.access_key,
                     aws_secret_access_key=gateway.secret_key, region_name="us-east-1").create_bucket(Bucket=BUCKET)
        run = uuid.uuid4().hex[:8]
        for n in args.ranks:
            jobs = [(n, [])] + ([(n - 1, ["--saved-by", str(n)])] if n >= 2 else [])
            for ranks, extra in jobs:
                results.append(_job(env, ranks, args, run, extra))
                report(results[-1])
    finally:
        gateway.stop()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def _job(env: dict, ranks: int, args, run: str, extra: list) -> dict:
    """One mpiexec job of the worker; its JSON line."""
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    cmd = [mpiexec, "-n", str(ranks), sys.executable, os.path.abspath(__file__), "--worker", "--run", run,
           "--size-mib", str(args.size_mib), "--repeats", str(args.repeats), *extra]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
