"""Run pytest on every rank, with only rank 0 printing to the console.

Ranks share stdout under mpiexec; interleaved reports are unreadable.  Ranks
other than 0 write theirs to ``.mpi-logs/rank-N.log``; any rank's non-zero
exit makes mpiexec fail, so a failure on another rank is still seen (read
its log).
"""

import os
import sys

import pytest
from mpi4py import MPI

rank = MPI.COMM_WORLD.Get_rank()
if rank != 0:
    os.makedirs(".mpi-logs", exist_ok=True)
    log = open(os.path.join(".mpi-logs", f"rank-{rank}.log"), "w")
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
rc = pytest.main(sys.argv[1:])
if rank != 0 and rc not in (0, 5):
    sys.__stderr__.write(f"rank {rank}: pytest failed; see .mpi-logs/rank-{rank}.log\n")
sys.exit(0 if rc == 5 else rc)
