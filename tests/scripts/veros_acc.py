"""A small Veros ACC run with hpcckpt's Veros mixin (tests/integrations/test_veros.py, bench/veros.py).

    veros_acc.py ROOT PX PY STEPS EVERY [--kill-after ITT] [--dump-restored DUMPROOT] [--float-type T] [--cast]
                 [--keep K] [--no-restore] [--no-run]

Runs ``STEPS`` tracer steps in all (counted from the first start: a restore
continues to the same end), checkpointing into ROOT every ``EVERY`` steps and
at the end.  ``--kill-after ITT``: rank 1 (or 0 on one rank) SIGKILLs itself
right after the checkpoint of iteration ITT; ``--sigterm-after ITT``: rank 1
sends itself SIGTERM after iteration ITT (the run is to stop after a
checkpoint at the next boundary, on every rank, exit status 0).  ``--dump-restored DUMPROOT``:
after the restore, save the restored state (as this run's decomposition
holds it) into DUMPROOT, before any step.  ``--keep K``: checkpoint_keep;
``--no-restore``: checkpoint_restore=False; ``--no-run``: stop after the setup
(and the dump).  Veros' own file output is off
(diskless mode): its h5py wheel cannot write files with the MPI driver.
"""

from __future__ import annotations

import argparse
import os
import signal

parser = argparse.ArgumentParser()
parser.add_argument("root")
parser.add_argument("px", type=int)
parser.add_argument("py", type=int)
parser.add_argument("steps", type=int)
parser.add_argument("every", type=int)
parser.add_argument("--kill-after", type=int)
parser.add_argument("--sigterm-after", type=int)
parser.add_argument("--dump-restored")
parser.add_argument("--float-type", default="float64")
parser.add_argument("--cast", action="store_true")
parser.add_argument("--keep", type=int)
parser.add_argument("--no-restore", action="store_true")
parser.add_argument("--no-run", action="store_true")
parser.add_argument("--nx", type=int, default=30)
parser.add_argument("--ny", type=int, default=42)
parser.add_argument("--nz", type=int, default=15)
args = parser.parse_args()

from veros import runtime_settings  # noqa: E402

runtime_settings.update(num_proc=(args.px, args.py), diskless_mode=True, float_type=args.float_type,
                        loglevel="warning")

from veros import veros_routine  # noqa: E402
from veros.setups.acc import ACCSetup  # noqa: E402

import hpcckpt  # noqa: E402
from hpcckpt.integrations.veros import Checkpointing, checkpoint_state  # noqa: E402

DT = 86400 / 2.0  # ACC's dt_tracer


class Run(Checkpointing, ACCSetup):
    @veros_routine
    def set_parameter(self, state):
        super().set_parameter(state)
        settings = state.settings
        settings.nx, settings.ny, settings.nz = args.nx, args.ny, args.nz
        settings.runlen = args.steps * DT
        settings.checkpoint_dir = args.root
        settings.checkpoint_frequency = args.every * DT
        settings.checkpoint_cast = args.cast
        settings.checkpoint_restore = not args.no_restore
        if args.keep is not None:
            settings.checkpoint_keep = args.keep

    def step(self, state):
        super().step(state)
        rank = runtime_settings.mpi_comm.Get_rank()
        if args.sigterm_after is not None and int(state.variables.itt) == args.sigterm_after and rank == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        if args.kill_after is not None and int(state.variables.itt) == args.kill_after:
            if runtime_settings.mpi_comm.Get_rank() == min(1, runtime_settings.mpi_comm.Get_size() - 1):
                os.kill(os.getpid(), signal.SIGKILL)


sim = Run()
sim.setup()
if args.dump_restored:
    with hpcckpt.Checkpointer(args.dump_restored, comm=runtime_settings.mpi_comm) as dump:
        dump.save(checkpoint_state(sim.state, 0.0), int(sim.state.variables.itt))
if args.no_run:
    raise SystemExit(0)
sim.run()
print(f"rank {runtime_settings.mpi_comm.Get_rank()}: run() returned at iteration {int(sim.state.variables.itt)}, "
      f"stop_reason {sim.stop_reason}", flush=True)
