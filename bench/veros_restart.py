"""hpcckpt against Veros' own restart files: the same Veros state, the same run (docs/performance.md).

    python bench/veros_restart.py [--ranks 1 2 4] [--nx 60 --ny 84] [--reps 5] [--json out.json]

For each rank count, one ``mpiexec -n N`` of this script (``--worker``) sets up
Veros' ACC setup on an ``nx x ny x 15`` grid (ACC's domain, cells and time
steps refined by ``nx / 30``) (process grid 1x1, 2x1, 2x2), runs
two steps, then alternates, ``reps`` times: Veros' ``write_restart``,
hpcckpt's save of the same variables (hpcckpt.integrations.veros:
``checkpoint_state``, plus ``itt``), the same with ``codec="zstd"`` (Veros
gzips its restart file on one process), Veros' ``read_restart``, hpcckpt's
restore (``restore_state``).  Times are wall seconds between barriers,
medians; bytes are the files on disk.  Page cache warm for both.  Veros'
restart on more than one rank needs h5py built with MPI (``driver="mpio"``);
without it that column is empty and Veros runs in diskless mode there.  On
Debian 12, Debian's MPI build serves (docs/performance.md, "Veros"):

    apt-get install python3-h5py-mpi            # HDF5 and h5py for OpenMPI, Debian's Python
    /usr/bin/python3 -m venv --system-site-packages V
    echo numpy==1.24.2 > keep-numpy.txt          # Debian's numpy, which its h5py is built against
    V/bin/pip install -c keep-numpy.txt veros==1.7.0 "mpi4py>=4.1" xxhash tqdm numcodecs
    V/bin/pip uninstall -y h5py                 # pip's serial h5py would hide Debian's
    V/bin/python bench/veros_restart.py --mpiexec "/usr/bin/mpiexec.openmpi --oversubscribe --allow-run-as-root"
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

GRIDS = {1: (1, 1), 2: (2, 1), 4: (2, 2)}


def worker(args) -> None:
    import h5py

    from veros import runtime_settings

    px, py = GRIDS[args.nranks]
    parallel_h5 = args.nranks == 1 or h5py.get_config().mpi
    runtime_settings.update(num_proc=(px, py), diskless_mode=not parallel_h5, loglevel="error")

    from veros import restart, veros_routine
    from veros.setups.acc import acc

    import hpcckpt
    from hpcckpt.integrations.veros import checkpoint_state, restore_state

    class Bench(acc.ACCSetup):
        @veros_routine
        def set_parameter(self, state):
            super().set_parameter(state)
            state.settings.nx, state.settings.ny = args.nx, args.ny
            state.settings.restart_output_filename = "veros-restart.h5"
            state.settings.restart_input_filename = ""
            refine = args.nx / 30  # ACC's domain (30 x 42 cells of 2 degrees) on a finer grid
            state.settings.dt_mom /= refine
            state.settings.dt_tracer /= refine

        @veros_routine
        def set_grid(self, state):
            super().set_grid(state)
            vs, refine = state.variables, args.nx / 30
            vs.dxt, vs.dyt = vs.dxt / refine, vs.dyt / refine

    sim = Bench()
    sim.setup()
    for _ in range(2):
        sim.step(sim.state)
    comm = runtime_settings.mpi_comm
    state, settings = sim.state, sim.state.settings

    def timed(fn) -> float:
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        comm.Barrier()
        return time.perf_counter() - t0

    def veros_load():
        with settings.unlock():
            settings.restart_input_filename = "veros-restart.h5"
        restart.read_restart(state)

    times = {k: [] for k in ("veros_save", "hpcckpt_save", "zstd_save", "veros_load", "hpcckpt_load", "zstd_load")}
    opts = dict(comm=comm, keep=1, handle_signals=False, track_failures=False)
    with hpcckpt.Checkpointer("hpcckpt-ckpt", **opts) as ck, \
            hpcckpt.Checkpointer("hpcckpt-zstd", codec="zstd", **opts) as cz:
        for rep in range(args.reps):
            if parallel_h5:
                times["veros_save"].append(timed(lambda: restart.write_restart(state, force=True)))
            times["hpcckpt_save"].append(timed(lambda: ck.save(checkpoint_state(state, 0.0), step=rep + 2)))
            times["zstd_save"].append(timed(lambda: cz.save(checkpoint_state(state, 0.0), step=rep + 2)))
            if parallel_h5:
                times["veros_load"].append(timed(veros_load))
            times["hpcckpt_load"].append(timed(lambda: restore_state(ck, state, cast=False)))
            times["zstd_load"].append(timed(lambda: restore_state(cz, state, cast=False)))

    def version_bytes(root):
        version = os.path.join(root, sorted(d for d in os.listdir(root) if d.startswith("step-"))[-1])
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(version) for f in fs)

    if comm.Get_rank() == 0:
        out = {k: statistics.median(v) if v else None for k, v in times.items()}
        out["hpcckpt_bytes"], out["zstd_bytes"] = version_bytes("hpcckpt-ckpt"), version_bytes("hpcckpt-zstd")
        out["veros_bytes"] = os.path.getsize("veros-restart.h5") if parallel_h5 else None
        with open(args.out, "w") as f:
            json.dump(out, f)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--nx", type=int, default=60)
    p.add_argument("--ny", type=int, default=84)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--mpiexec", default=os.path.join(os.path.dirname(sys.executable), "mpiexec"),
                   help="the launcher and its flags, one string (default: the mpiexec next to this Python)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--nranks", type=int, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.path.dirname(here) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    rows, results = [], {}
    for n in args.ranks:
        work = tempfile.mkdtemp(prefix=f"bench-veros-{n}-")
        try:
            out = os.path.join(work, "result.json")
            subprocess.run([*shlex.split(args.mpiexec), "-n", str(n), sys.executable, os.path.abspath(__file__), "--worker",
                            "--nranks", str(n), "--nx", str(args.nx), "--ny", str(args.ny),
                            "--reps", str(args.reps), "--out", out], cwd=work, env=env, check=True,
                           stdout=subprocess.DEVNULL)
            with open(out) as f:
                r = results[n] = json.load(f)
        finally:
            shutil.rmtree(work, ignore_errors=True)

        def cell(key, fmt):
            return "n/a (no MPI h5py)" if r[key] is None else fmt(r[key])

        sec, mb = "{:.3f}".format, (lambda b: f"{b / 1e6:.1f}")
        rows.append([n, "x".join(map(str, GRIDS[n]))] + [cell(k, f) for k, f in (
            ("veros_save", sec), ("hpcckpt_save", sec), ("zstd_save", sec), ("veros_load", sec),
            ("hpcckpt_load", sec), ("zstd_load", sec), ("veros_bytes", mb), ("hpcckpt_bytes", mb),
            ("zstd_bytes", mb))])
    sys.path.insert(0, here)
    from benchutil import print_table

    print(f"Veros ACC {args.nx}x{args.ny}x15, medians of {args.reps}")
    print_table(["ranks", "grid", "Veros save s", "hpcckpt save s", "hpcckpt zstd save s", "Veros load s",
                 "hpcckpt load s", "hpcckpt zstd load s", "Veros MB", "hpcckpt MB", "hpcckpt zstd MB"], rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"nx": args.nx, "ny": args.ny, "reps": args.reps, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
