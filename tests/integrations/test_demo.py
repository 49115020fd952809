"""The demo app end to end: apps/demo.py passes, and heat2d stops cleanly on SIGUSR1 and resumes bitwise.

These run mpiexec themselves (serial pytest, not under ``-m mpi``): the
mpiexec next to this Python, i.e. the venv's MPICH.  They skip when there is
none.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest
from testpaths import TESTS

HERE = TESTS
ROOT = os.path.dirname(HERE)
DEMO = os.path.join(ROOT, "apps", "demo.py")
HEAT2D = os.path.join(ROOT, "apps", "heat2d.py")

pytestmark = pytest.mark.slow


def mpiexec() -> str:
    path = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(path):
        pytest.skip(f"no mpiexec next to {sys.executable}; run the suite through `python3 dev.py test`")
    return path


def env() -> dict:
    out = dict(os.environ, PYTHONUNBUFFERED="1")
    out["PYTHONPATH"] = ROOT + os.pathsep + out.get("PYTHONPATH", "")
    # more ranks than cores on small CI machines: let waiting MPICH ranks yield the core
    out.setdefault("MPIR_CVAR_CH4_PROGRESS_THROTTLE", "1")
    out.setdefault("MPIR_CVAR_POLLS_BEFORE_YIELD", "1")
    return out


def heat2d(nranks: int, *args, timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = [mpiexec(), "-n", str(nranks), sys.executable, HEAT2D, *map(str, args)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env(), cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(cmd)} hung for {timeout} s: {exc.stdout!r} {exc.stderr!r}")
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def same_final_state(a: str, b: str) -> None:
    import hpcckpt

    va, vb = hpcckpt.open(a), hpcckpt.open(b)
    ua, ub = va.read("u"), vb.read("u")
    assert ua.dtype == ub.dtype and ua.shape == ub.shape
    assert ua.tobytes() == ub.tobytes(), f"{int((ua != ub).sum())} cells differ"
    ta, tb = np.sort(va.read("tracers"), order="id"), np.sort(vb.read("tracers"), order="id")
    assert ta.tobytes() == tb.tobytes()
    assert va.values == vb.values


@pytest.mark.timeout(400)
def test_demo_passes(tmp_path):
    mpiexec()
    cmd = [sys.executable, DEMO, "--workdir", str(tmp_path / "demo")]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=360, env=env(), cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the demo did not finish in 360 s; output so far:\n{exc.stdout}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "\nPASS" in proc.stdout, out
    assert re.search(r"the job failed after .* mpiexec exited with status [1-9]", proc.stdout.replace("\n", " ")), out
    assert re.search(r"restored step \d+ .* on a 3 x 1 process grid", proc.stdout.replace("\n", " ")), out


@pytest.mark.timeout(300)
def test_sigusr1_checkpoints_exits_cleanly_and_resumes_bitwise(tmp_path):
    launcher = mpiexec()
    size, steps = 64, 400
    common = ["--nx", size, "--ny", size + 8, "--steps", steps, "--every", 1000, "--tracers", 40]
    root, out, ref = tmp_path / "ckpt", tmp_path / "final", tmp_path / "reference"

    # the reference: one rank, never interrupted
    heat2d(1, "--root", tmp_path / "ref-ckpt", "--out", ref, *common)

    # 4 ranks (a 2 x 2 grid), slowed down so that the signal surely arrives mid-run
    cmd = [launcher, "-n", "4", sys.executable, HEAT2D, "--root", str(root), "--sleep", "0.01",
           *map(str, common)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env(),
                            cwd=ROOT, start_new_session=True)
    watchdog = threading.Timer(120, lambda: os.killpg(proc.pid, signal.SIGKILL))
    watchdog.start()
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            m = re.search(r"pids ([\d ]+)$", line.strip())
            if m:
                pids = [int(p) for p in m.group(1).split()]
                break
        else:
            pytest.fail("heat2d did not print its pids:\n" + "".join(lines))
        assert len(pids) == 4
        threading.Event().wait(1.0)  # let it compute some steps first
        for pid in pids:  # as SLURM's scancel -s USR1 or a forwarded --signal would
            os.kill(pid, signal.SIGUSR1)
        rest = proc.stdout.read()
        rc = proc.wait()
    finally:
        watchdog.cancel()
    output = "".join(lines) + rest
    assert rc == 0, output
    m = re.search(r"stopping \(SIGUSR1\): stopped cleanly after step (\d+)", output)
    assert m, output
    stopped = int(m.group(1))
    assert 0 < stopped < steps, output

    import hpcckpt

    versions = [d for d in os.listdir(root) if d.startswith("step-")]
    assert versions == [f"step-{stopped:012d}"], versions  # the signal's checkpoint, and no other
    assert hpcckpt.open(root / versions[0]).values["step"] == stopped

    # resume on 3 ranks (a 3 x 1 grid), unslowed, to the end
    resumed = heat2d(3, "--root", root, "--out", out, *common)
    assert f"restored step {stopped} " in resumed.stdout, resumed.stdout
    same_final_state(str(ref), str(out))


@pytest.mark.timeout(400)
@pytest.mark.parametrize("before,after", [(4, 3), (2, 4)])
def test_heat2d_resized_while_running_ends_bitwise_as_an_uninterrupted_run(tmp_path, before, after):
    """--resize-step/--resize-to: shrink in-process (4 -> 3) or grow by Comm_spawn (2 -> 4) at step 12."""
    common = ["--nx", 40, "--ny", 48, "--steps", 30, "--every", 7, "--tracers", 40, "--quiet"]
    ref, out = str(tmp_path / "ref"), str(tmp_path / "out")
    heat2d(1, "--root", tmp_path / "ref-ckpt", "--out", ref, *common)
    proc = heat2d(before, "--root", tmp_path / "ckpt", "--out", out, *common, "--resize-step", 12,
                  "--resize-to", after, timeout=300)
    assert f"resized from {before} to {after} ranks in memory" in proc.stdout, proc.stdout
    same_final_state(ref, out)
    import hpcckpt

    assert hpcckpt.open(out).meta.nranks == after
    with hpcckpt.open(str(tmp_path / "ckpt")) as view:  # the Checkpointer went on saving on the new ranks
        assert view.meta.nranks == after and view.meta.step == 30
