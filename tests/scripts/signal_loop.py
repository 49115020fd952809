"""A loop that checkpoints through Checkpointer.maybe_save and stops cleanly on SIGUSR1/SIGTERM.

argv: ROOT NSTEPS.  Resumes from the newest checkpoint; prints 'ready' once
running, and at the end the step it stopped at and the sum of its field.
"""

import sys
import time

import numpy as np
from mpi4py import MPI

import hpcckpt
from hpcckpt.policy import FixedSteps

comm = MPI.COMM_WORLD
root, nsteps = sys.argv[1], int(sys.argv[2])
G = 12  # global length, split evenly over however many ranks run
lo, hi = comm.rank * G // comm.size, (comm.rank + 1) * G // comm.size
u = np.zeros(hi - lo, dtype=np.int64)
ck = hpcckpt.Checkpointer(root, comm=comm, policy=FixedSteps(10**6), handle_signals=True)
state = {"u": hpcckpt.Block(u, (lo,), (G,)), "step": 0}
if ck.latest() is not None:
    state = ck.restore(state)
    print(f"rank {comm.rank} resumed at step {state['step']}", flush=True)
if comm.rank == 0:
    print("ready", flush=True)
step = state["step"]
while step < nsteps:
    u += 1  # one unit of work per step
    step += 1
    time.sleep(0.005)
    state["step"] = step
    ck.maybe_save(state, step)
    if ck.should_exit():
        print(f"rank {comm.rank} stopped cleanly at step {step}", flush=True)
        break
ck.close()
total = comm.allreduce(int(u.sum()))
if comm.rank == 0:
    print(f"final step {step} total {total}", flush=True)
