#!/usr/bin/env python3
"""The hpcckpt demo: crash an MPI run, restart it on a different number of ranks, get the same bits.

``python3 dev.py demo`` runs this file (with the project's virtual environment
first on PATH).  It runs apps/heat2d.py three times under mpiexec:

1. on 4 ranks, uninterrupted: the reference answer;
2. on 4 ranks again, but one rank kills itself with a real SIGKILL part-way
   through: mpiexec reports the failure, and the checkpoints already committed
   survive;
3. on 3 ranks (a different process grid), restarting from the newest
   checkpoint, to the end;

then it compares the final state of runs 1 and 3 bit for bit and prints PASS
or FAIL (exit status 0 or 1).  Everything is written under ``--workdir``
(default ``demo-run/`` beside this repository), which is cleared at the start
and left behind so that you can look at the checkpoints afterwards.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
HEAT2D = os.path.join(HERE, "heat2d.py")
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

import hpcckpt  # noqa: E402
from hpcckpt.root.catalog import current, list_versions  # noqa: E402

WIDTH = 78


def say(text: str = "") -> None:
    for para in text.split("\n"):
        print(textwrap.fill(para, WIDTH) if para else "", flush=True)


def banner(title: str) -> None:
    print("\n" + "=" * WIDTH + f"\n{title}\n" + "=" * WIDTH, flush=True)


def find_mpiexec() -> str | None:
    """The mpiexec installed next to this Python (the venv's MPICH), else the first one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return beside if os.path.exists(beside) else shutil.which("mpiexec")


def child_env(nranks: int) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    if nranks > (os.cpu_count() or 1):
        # More ranks than cores: let MPICH ranks that wait for a message yield the core instead of
        # spinning on it (other MPI libraries ignore these variables).
        env.setdefault("MPIR_CVAR_CH4_PROGRESS_THROTTLE", "1")
        env.setdefault("MPIR_CVAR_POLLS_BEFORE_YIELD", "1")
    return env


def run_mpi(mpiexec: str, nranks: int, args: list[str], timeout: float) -> tuple[int, str, float]:
    """Run heat2d under mpiexec, echoing its output indented; (exit status, output, seconds)."""
    cmd = [mpiexec, "-n", str(nranks), sys.executable, HEAT2D, *args]
    print("  $ " + " ".join(os.path.relpath(c, ROOT) if c.startswith(ROOT + os.sep) else c for c in cmd), flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env=child_env(nranks), start_new_session=True)
    timed_out = threading.Event()

    def kill_group() -> None:
        timed_out.set()
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    watchdog = threading.Timer(timeout, kill_group)
    watchdog.start()
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.strip():
                print("    | " + line.rstrip(), flush=True)
        rc = proc.wait()
    finally:
        watchdog.cancel()
    if timed_out.is_set():
        print(f"    (no result after {timeout:.0f} s: stopped it; treating this as a hang)", flush=True)
        rc = -9999
    return rc, "".join(lines), time.perf_counter() - t0


def shown(path: str) -> str:
    """A path as the user would type it: relative when it is below the current directory."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def cli_command() -> str | None:
    """How to call the hpcckpt command from the user's shell (None if this checkout has no CLI yet)."""
    if importlib.util.find_spec("hpcckpt.cli") is None:
        return None
    script = os.path.join(os.path.dirname(sys.executable), "hpcckpt")
    if os.path.exists(script):
        return shown(script)
    return f"{shown(sys.executable)} -m hpcckpt"


def grid_of(output: str) -> str:
    m = re.search(r"on a (\d+) x (\d+) process grid", output)
    return f"{m.group(1)} x {m.group(2)}" if m else "?"


def committed_steps(root: str) -> list[int]:
    return [e.step for e in current(list_versions(root))]


def compare(reference: str, restarted: str) -> list[str]:
    """Bitwise differences between two final states (empty when identical)."""
    a, b = hpcckpt.open(reference), hpcckpt.open(restarted)
    problems = []
    ua, ub = a.read("u"), b.read("u")
    if ua.shape != ub.shape or ua.dtype != ub.dtype:
        problems.append(f"u: {ua.shape} {ua.dtype} against {ub.shape} {ub.dtype}")
    elif ua.tobytes() != ub.tobytes():
        diff = ua.view(np.uint64) != ub.view(np.uint64)
        problems.append(f"u: {int(diff.sum())} of {ua.size} cells differ (largest difference "
                        f"{float(np.abs(ua - ub).max()):.3g})")
    # the tracers are stored in rank order, which depends on the decomposition: compare them by id
    ta, tb = np.sort(a.read("tracers"), order="id"), np.sort(b.read("tracers"), order="id")
    if ta.tobytes() != tb.tobytes():
        problems.append(f"tracers: {len(ta)} against {len(tb)} rows, or different values")
    for key in ("step", "params"):
        if a.values.get(key) != b.values.get(key):
            problems.append(f"{key}: {a.values.get(key)!r} against {b.values.get(key)!r}")
    return problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", default=os.path.join(ROOT, "demo-run"), help="where the runs write (cleared first)")
    p.add_argument("--size", type=int, default=256, help="the grid has SIZE x SIZE cells")
    p.add_argument("--steps", type=int, default=300, help="steps of the whole run")
    p.add_argument("--every", type=int, default=50, help="checkpoint every this many steps")
    p.add_argument("--ranks", type=int, default=4, help="ranks of the first two runs")
    p.add_argument("--restart-ranks", type=int, default=3, help="ranks of the restarted run")
    p.add_argument("--timeout", type=float, default=120, help="seconds after which a run counts as hung")
    args = p.parse_args(argv)
    if args.steps < 2 * args.every or args.every < 1:
        p.error("--steps must be at least twice --every")

    mpiexec = find_mpiexec()
    if mpiexec is None:
        print("FAIL: no mpiexec next to this Python or on PATH (run the demo through `python3 dev.py demo`)")
        return 1
    work = os.path.abspath(args.workdir)
    if os.path.isdir(work):
        foreign = set(os.listdir(work)) - {"reference", "crashed"}
        if foreign:  # never delete what an earlier demo did not write
            print(f"FAIL: {work} holds files the demo did not write ({sorted(foreign)[:3]}); "
                  "pick another --workdir")
            return 1
        shutil.rmtree(work)
    os.makedirs(work)
    ref_root, ref_out = os.path.join(work, "reference", "ckpt"), os.path.join(work, "reference", "final")
    run_root, run_out = os.path.join(work, "crashed", "ckpt"), os.path.join(work, "crashed", "final")
    # crash between two checkpoints, a bit past the middle, so that some work is really lost
    kill_step = min((args.steps // 2 // args.every) * args.every + max(1, 2 * args.every // 5), args.steps - 1)
    kill_rank = min(2, args.ranks - 1)
    common = ["--nx", str(args.size), "--ny", str(args.size), "--steps", str(args.steps),
              "--every", str(args.every), "--keep", "3"]
    t_start = time.perf_counter()

    banner("hpcckpt demo: crash an MPI run, restart it on fewer ranks, get the same bits")
    say(f"apps/heat2d.py solves the heat equation on a {args.size} x {args.size} grid for {args.steps} "
        f"time steps. It splits the grid into rectangles, one per MPI rank, and neighbouring ranks swap "
        f"their edge cells every step. Every {args.every} steps it saves a checkpoint with hpcckpt: each "
        "rank writes its own rectangle, and the checkpoint describes the data as one global array, so any "
        "number of ranks can read it back.")
    say(f"\nmpiexec: {mpiexec}\nfiles:   {work}")

    # ---------------------------------------------------------------- 1: reference
    banner(f"Step 1 of 4: the reference run, {args.ranks} ranks, never interrupted")
    say("This is the answer we expect. It also saves checkpoints, in its own directory.")
    rc, out, secs = run_mpi(mpiexec, args.ranks, ["--root", ref_root, "--out", ref_out, *common], args.timeout)
    if rc != 0:
        say(f"\nFAIL: the reference run exited with status {rc}; see its output above.")
        return 1
    say(f"-> finished in {secs:.1f} s on a {grid_of(out)} process grid; final state saved in {ref_out}")

    # ---------------------------------------------------------------- 2: crash
    banner(f"Step 2 of 4: the same run, {args.ranks} ranks, but rank {kill_rank} is killed after step {kill_step}")
    say(f"Rank {kill_rank} sends itself SIGKILL, as if its node had died: no Python cleanup, no goodbye to "
        "the other ranks. mpiexec notices and stops the whole job.")
    rc, out, secs = run_mpi(mpiexec, args.ranks, ["--root", run_root, "--kill-rank", str(kill_rank),
                                                  "--kill-step", str(kill_step), "--quiet", *common], args.timeout)
    steps = committed_steps(run_root)
    if rc == 0:
        say(f"\nFAIL: the job should have failed, but mpiexec exited 0 after {secs:.1f} s.")
        return 1
    say(f"-> the job failed after {secs:.1f} s: mpiexec exited with status {rc} (non-zero: the job crashed; "
        "its banner may name whichever rank it noticed first).")
    if not steps:
        say("\nFAIL: no committed checkpoint survived the crash.")
        return 1
    say(f"   Committed checkpoints left in {os.path.relpath(run_root, work)}: steps "
        f"{', '.join(map(str, steps))} (only the newest 3 are kept). The newest is step {steps[-1]}; "
        f"the {kill_step - steps[-1]} steps computed after it were lost with the crash and will be "
        "recomputed.")

    # ---------------------------------------------------------------- 3: restart
    banner(f"Step 3 of 4: restart on {args.restart_ranks} ranks from the newest checkpoint")
    say(f"Same command and checkpoint directory, but {args.restart_ranks} ranks instead of {args.ranks}, so the "
        "grid is cut into different rectangles. heat2d finds the checkpoint, and hpcckpt gives each rank "
        "exactly its new rectangle (and an even share of the tracer particles), reading only the pieces "
        "it needs.")
    rc, out, secs = run_mpi(mpiexec, args.restart_ranks, ["--root", run_root, "--out", run_out, *common],
                            args.timeout)
    if rc != 0:
        say(f"\nFAIL: the restarted run exited with status {rc}; see its output above.")
        return 1
    m = re.search(r"restored step (\d+) from (\S+)", out)
    if not m:
        say("\nFAIL: the restarted run did not restore a checkpoint.")
        return 1
    say(f"-> restored step {m.group(1)} ({os.path.relpath(m.group(2), work)}) on a {grid_of(out)} process "
        f"grid and finished the remaining {args.steps - int(m.group(1))} steps in {secs:.1f} s.")

    # ---------------------------------------------------------------- 4: compare
    banner("Step 4 of 4: compare the restarted result with the reference, bit for bit")
    problems = compare(ref_out, run_out)
    total = time.perf_counter() - t_start
    if problems:
        say("The final states differ:")
        for line in problems:
            say("  - " + line)
        say(f"\nFAIL ({total:.1f} s in all)")
        return 1
    u = hpcckpt.open(ref_out).read("u")
    say(f"The final temperature field ({u.shape[0]} x {u.shape[1]} float64 values) and the 'dose' of every "
        "tracer particle are bitwise identical to the uninterrupted run, although that run used "
        f"{args.ranks} ranks throughout and this one was killed, lost work, and finished on "
        f"{args.restart_ranks} ranks.")
    cli = cli_command()
    if cli:
        say("\nLook around (the files stay until the next demo):")
        for cmd, what in ((f"ls {shown(run_root)}", "the checkpoints of the crashed run"),
                          (f"inspect {shown(run_out)}", "what one checkpoint holds"),
                          (f"verify {shown(run_root)}", "check every checksum")):
            print(f"  {cli} {cmd:<40} # {what}", flush=True)
    say(f"\nPASS ({total:.1f} s in all)")
    return 0


if __name__ == "__main__":
    with hpcckpt.report_errors():  # one process: a CheckpointError is one line, anything else its traceback
        sys.exit(main())
