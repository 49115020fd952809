"""One save or one restore of tracked output files, SIGKILLed before its k-th file-system call (tests/root/test_files_crash.py).

    python crash_files.py WORKDIR save|restore KILL_AT

WORKDIR holds ``ck/`` (the root) and ``out/`` (the tracked files: an
append-only log and an in-place binary series, as :func:`checkpointer` sets
them up).  ``save`` saves step 100 of the state, ``restore`` restores the
newest version.  The process kills itself with SIGKILL just before its
KILL_AT-th call among os.open/write/pwrite/fsync/truncate/ftruncate/replace/
rename/unlink/mkdir (0: never); it prints ``CALLS n`` when it was not killed.
"""

from __future__ import annotations

import os
import signal
import sys

import numpy as np

WRAPPED = ("open", "write", "pwrite", "fsync", "truncate", "ftruncate", "replace", "rename", "unlink", "mkdir")


def checkpointer(workdir: str):
    import hpcckpt
    from hpcckpt.mpi.collective import SerialComm

    out = os.path.join(workdir, "out")
    ck = hpcckpt.Checkpointer(os.path.join(workdir, "ck"), comm=SerialComm(), track_failures=False,
                              files={os.path.join(out, "log.txt"): "append"})
    return ck.track_files(os.path.join(out, "series.bin"), mode="inplace", block_bytes=512)


def state(step: int):
    import hpcckpt

    return {"u": hpcckpt.Block(np.full(8, float(step))), "step": step}


def arm_kill(at: int) -> dict:
    calls = {"n": 0}

    def wrap(fn):
        def wrapped(*args, **kwargs):
            calls["n"] += 1
            if at and calls["n"] >= at:
                os.kill(os.getpid(), signal.SIGKILL)
            return fn(*args, **kwargs)
        return wrapped

    for name in WRAPPED:
        setattr(os, name, wrap(getattr(os, name)))
    return calls


def main(argv) -> int:
    workdir, mode, at = argv[0], argv[1], int(argv[2])
    import hpcckpt

    ck = checkpointer(workdir)
    calls = arm_kill(at)
    if mode == "save":
        ck.save(state(100), 100)
    else:
        ck.restore({"u": hpcckpt.Block(np.zeros(8)), "step": None})
    print(f"CALLS {calls['n']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
