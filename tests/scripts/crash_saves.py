"""A loop of Checkpointer saves that a test kills with SIGKILL (driven by tests/saving/test_crash.py).

    mpiexec -n N python crash_saves.py ROOT MODE NSTEPS [KILL_RANK KILL_AT]

MODE "save": restore the newest committed step if there is one (checking its
data), then save steps start..start+NSTEPS-1 with data derived from the step;
print "SAVED k" (rank 0) after each save returns.  Each rank writes its pid to
ROOT/../pids/<rank> first so that the test can kill it from outside.  With
KILL_RANK/KILL_AT, that rank SIGKILLs itself just before its KILL_AT-th
file-system call among write/fsync/replace/rename/unlink/rmdir/mkdir (inside a
data write, before an fsync, before the metadata rename, during retention...),
having written ROOT/../pids/killed ("<call> call <k>"); a run that ends first
writes the number of calls it made to ROOT/../pids/unkilled.

The save strategy comes from HPCCKPT_TEST_STRATEGY (default file-per-rank);
HPCCKPT_TEST_OPTIONS (JSON) adds Checkpointer options, e.g. asynchronous,
incremental and ``"local_dir": true`` (node-local levels in ROOT/../local);
``"files": true`` tracks two output files in ROOT/..: ``out.log``, to which
rank 0 appends ``step k`` before saving step k, and ``field.bin``, which it
rewrites in place with step k's bytes; a restore of step k checks both
rolled back to that content.

MODE "restore": restore the newest committed step, check its data exactly,
print "RESTORED k", then save step k+1 (which must clean leftovers) and print
"SAVED k+1".
"""

from __future__ import annotations

import json
import os
import signal
import sys

import numpy as np

SHAPE = (64, 96)


def global_data(step: int) -> np.ndarray:
    return (np.arange(SHAPE[0] * SHAPE[1], dtype=np.float64).reshape(SHAPE) * 1.5 + step * 1e6)


def rows(n: int, r: int):
    return r * SHAPE[0] // n, (r + 1) * SHAPE[0] // n


def state_for(comm, step: int):
    import hpcckpt

    lo, hi = rows(comm.Get_size(), comm.Get_rank())
    g = global_data(step)
    return {"u": hpcckpt.Block(g[lo:hi].copy(), (lo, 0), SHAPE),
            "p": hpcckpt.Ragged(np.full((comm.Get_rank() + 1, 3), step, np.int64)), "step": step}


def restore(comm, ck) -> int | None:
    import hpcckpt

    step = ck.latest()
    if step is None:
        return None
    lo, hi = rows(comm.Get_size(), comm.Get_rank())
    out = np.zeros((hi - lo, SHAPE[1]))
    got = ck.restore({"u": hpcckpt.Block(out, (lo, 0), SHAPE), "p": hpcckpt.Ragged(), "step": None})
    if ck.engine is not None and ck.engine.node is not None:  # the newest restorable on this rank count
        assert got["step"] <= step, (got["step"], step)
        step = got["step"]
    assert got["step"] == step, (got["step"], step)
    assert np.array_equal(out, global_data(step)[lo:hi]), f"rank {comm.Get_rank()}: data of step {step} differ"
    assert np.all(got["p"].local == step), "ragged rows of another step"
    return step


def output_files(root: str) -> tuple[str, str]:
    base = os.path.dirname(os.path.abspath(root))
    return os.path.join(base, "out.log"), os.path.join(base, "field.bin")


def write_outputs(root: str, step: int) -> None:
    """Rank 0, before the save of ``step``: that step's output."""
    log, field = output_files(root)
    with open(log, "a") as f:
        f.write(f"step {step}\n")
    with open(field, "r+b" if os.path.exists(field) else "wb") as f:
        f.write(bytes([step % 256]) * (1000 + 37 * step))


def check_outputs(root: str, first: int, step: int) -> None:
    """Rank 0, after a restore of ``step``: the outputs as they were at its save (the run started at ``first``)."""
    log, field = output_files(root)
    with open(log) as f:
        assert f.read() == "".join(f"step {k}\n" for k in range(first, step + 1)), "out.log not rolled back"
    with open(field, "rb") as f:
        data = f.read()
    assert data[:1000 + 37 * step] == bytes([step % 256]) * (1000 + 37 * step), "field.bin not rolled back"


def arm_kill(at: int, marks: str) -> dict:
    """SIGKILL this process just before its ``at``-th file-system call, after writing ``marks``/killed (through
    Python's own file objects, which the wrapped calls do not count); the call counter."""
    calls = {"n": 0}

    def wrap(fn):
        def wrapped(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] >= at:
                with open(os.path.join(marks, "killed"), "w") as f:
                    f.write(f"{fn.__name__} call {calls['n']}")
                os.kill(os.getpid(), signal.SIGKILL)
            return fn(*args, **kwargs)
        return wrapped

    for name in ("write", "pwrite", "fsync", "replace", "rename", "unlink", "rmdir", "mkdir"):
        if hasattr(os, name):
            setattr(os, name, wrap(getattr(os, name)))
    return calls


def main(argv) -> int:
    from mpi4py import MPI

    import hpcckpt

    comm = MPI.COMM_WORLD
    root, mode, nsteps = argv[1], argv[2], int(argv[3])
    pid_dir = os.path.join(os.path.dirname(os.path.abspath(root)), "pids")
    os.makedirs(pid_dir, exist_ok=True)
    with open(os.path.join(pid_dir, str(comm.Get_rank())), "w") as f:
        f.write(str(os.getpid()))
    comm.Barrier()
    strategy = os.environ.get("HPCCKPT_TEST_STRATEGY", "file-per-rank")
    options = json.loads(os.environ.get("HPCCKPT_TEST_OPTIONS", "{}"))
    if options.get("local_dir") is True:
        options["local_dir"] = os.path.join(os.path.dirname(os.path.abspath(root)), "local")
    files = options.pop("files", False)
    if files:
        log, field = output_files(root)
        options["files"] = {log: "append", field: "inplace"}
    ck = hpcckpt.Checkpointer(root, comm=comm, keep=2, chunk_bytes=8192, strategy=strategy, **options)
    step = restore(comm, ck)
    if files and step is not None and comm.Get_rank() == 0:
        check_outputs(root, 0, step)
    if mode == "restore":
        if comm.Get_rank() == 0:
            print(f"RESTORED {step}", flush=True)
    calls = arm_kill(int(argv[5]), pid_dir) if len(argv) > 5 and comm.Get_rank() == int(argv[4]) else None
    start = 0 if step is None else step + 1
    for k in range(start, start + nsteps):
        if files and comm.Get_rank() == 0:
            write_outputs(root, k)
        ck.save(state_for(comm, k), step=k)
        if comm.Get_rank() == 0:
            print(f"SAVED {k}", flush=True)
    ck.close()
    if calls is not None:  # the schedule fell after the run's last call: how many it made
        with open(os.path.join(pid_dir, "unkilled"), "w") as f:
            f.write(str(calls["n"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
