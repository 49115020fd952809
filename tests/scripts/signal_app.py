"""A time loop that saves often and stops on SIGINT/SIGTERM/SIGUSR1 or the halt file; for the launcher tests.

argv: ROOT NSTEPS [--cells N] [--every K] [--sleep S] [--app-handler none|record|exit].
Every cell of the global int64 field ``u`` equals the step, so every committed
version can be checked exactly.  Resumes from the newest checkpoint; rank 0
prints ``ready PID0 PID1 ...`` once the loop runs.  ``--app-handler``
installs an application SIGTERM handler after the Checkpointer, as Veros'
``run()`` does: ``record`` only counts its calls, ``exit`` raises SystemExit
(Veros' signals_to_exception).  Each rank prints how it stopped.
"""

import argparse
import signal
import os
import sys
import time

import numpy as np
from mpi4py import MPI

import hpcckpt
from hpcckpt.policy import FixedSteps

p = argparse.ArgumentParser()
p.add_argument("root")
p.add_argument("nsteps", type=int)
p.add_argument("--cells", type=int, default=1200)
p.add_argument("--every", type=int, default=1)
p.add_argument("--sleep", type=float, default=0.005)
p.add_argument("--app-handler", choices=("none", "record", "exit"), default="none")
args = p.parse_args()

comm = MPI.COMM_WORLD
rank = comm.rank
G = args.cells
lo, hi = rank * G // comm.size, (rank + 1) * G // comm.size
u = np.zeros(hi - lo, dtype=np.int64)
step = 0
ck = hpcckpt.Checkpointer(args.root, comm=comm, keep=2, policy=FixedSteps(args.every), handle_signals=True)
ck.register(lambda: {"u": hpcckpt.Block(u, (lo,), (G,)), "step": step})
if ck.latest() is not None:
    step = ck.restore({"u": hpcckpt.Block(u, (lo,), (G,)), "step": 0})["step"]

app_calls = []
if args.app_handler == "record":
    signal.signal(signal.SIGTERM, lambda signum, frame: app_calls.append(signum))
elif args.app_handler == "exit":
    def stop_now(signum, frame):
        app_calls.append(signum)
        raise SystemExit(f"rank {rank}: the application's handler stops at signal {signum}")
    signal.signal(signal.SIGTERM, stop_now)

pids = comm.gather(os.getpid(), root=0)
if rank == 0:
    print("ready", *pids, flush=True)
try:
    while step < args.nsteps:
        u += 1  # one unit of work per step: every cell equals the step
        step += 1
        time.sleep(args.sleep)
        ck.maybe_save(step)
        if ck.should_exit():
            print(f"rank {rank} stopped cleanly at step {step} ({ck.stop_reason}); "
                  f"application handler calls {len(app_calls)}", flush=True)
            break
except SystemExit as exc:
    print(f"rank {rank} left by SystemExit after step {step}, checkpoint {getattr(ck.last_result, 'path', None)}: {exc}", flush=True)
    ck.close()
    sys.exit(3)
ck.close()
lowest = comm.allreduce(int(u.min()), op=MPI.MIN)
if rank == 0:
    print(f"final step {step} min {lowest}", flush=True)
