"""hpcckpt.integrations.veros on a small Veros ACC run (Veros 1.7, numpy backend), under mpiexec.

A 4-rank (2x2) run is SIGKILLed right after its checkpoint of iteration 3;
restarted on 4 ranks it ends bitwise equal to an uninterrupted 4-rank run;
restarted on 2 (2x1) and 1 ranks, the restored state is exactly the saved
global state, and the continued run differs from the uninterrupted 4-rank
one by no more than Veros' own runs on 2 and 1 ranks do (measured here).
Also: a SIGTERM on one rank stops every rank after one checkpoint, and the
float64 checkpoint restores into a float32 run only with checkpoint_cast.
Veros' file output is off (diskless mode): its serial h5py wheel cannot write
with the MPI driver.  Each run is its own mpiexec (tests/scripts/veros_acc.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import hpcckpt
from mpitools import mpiexec_path
from testpaths import TESTS

veros = pytest.importorskip("veros", reason="Veros is in the test extra (setup.cfg)")

HERE = TESTS
SCRIPT = os.path.join(HERE, "scripts", "veros_acc.py")
GRID = ("--nx", "16", "--ny", "20")  # ACC on a smaller grid (16 x 20 x 15 cells): the test runs in about 30 s
STEPS, EVERY, KILL = 6, 3, 3
GRIDS = {4: (2, 2), 2: (2, 1), 1: (1, 1)}

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def launch(tmp_path, nranks, root, *extra, every=EVERY):
    """Start one Veros run, checkpointing every ``every`` steps (a Popen; the script's output goes to
    ``root``.log)."""
    px, py = GRIDS[nranks]
    log = open(tmp_path / f"{os.path.basename(root)}.log", "w")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               MPIR_CVAR_CH4_PROGRESS_THROTTLE="1", MPIR_CVAR_POLLS_BEFORE_YIELD="1")
    cmd = [mpiexec_path(), "-n", str(nranks), sys.executable, SCRIPT, str(root), str(px), str(py),
           str(STEPS), str(every), *GRID, *extra]
    return subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT), log


def finish(tmp_path, runs, expect_rc=0) -> dict:
    """Wait for the runs; their logs."""
    logs = {}
    for name, (proc, log) in runs.items():
        try:
            rc = proc.wait(timeout=240)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"Veros run {name} hung")
        log.close()
        logs[name] = out = (tmp_path / f"{name}.log").read_text()
        if expect_rc == 0:
            assert rc == 0, f"{name} exited {rc}:\n{out[-3000:]}"
        else:
            assert rc != 0, f"{name} was to fail:\n{out[-3000:]}"
    return logs


def arrays(root, step=None):
    """Every variable of the newest (or ``step``'s) committed version of ``root``, as global arrays."""
    ck = os.path.join(root)
    versions = sorted(d for d in os.listdir(ck) if d.startswith("step-"))
    path = os.path.join(ck, versions[-1] if step is None else f"step-{step:012d}")
    with hpcckpt.open(path) as view:
        out = {name: view.read(name) for name in view.keys()}
        out.update({k: v for k, v in view.values.items()})
        return view.step, out


NXG, NYG = 16 + 4, 20 + 4  # GRID's padded global sizes (two ghost cells each side)


def interior(a):
    """The array without the two ghost cells at each end of its x and y axes (Veros' axes come first)."""
    if not isinstance(a, np.ndarray) or a.ndim == 0:
        return a
    if a.shape[0] == NXG:
        return a[2:-2, 2:-2] if a.ndim > 1 and a.shape[1] == NYG else a[2:-2]
    return a[2:-2] if a.shape[0] == NYG else a


def maxdiff(a, b):
    """The largest difference of the interiors of any float variable of two states."""
    return max(float(np.max(np.abs(interior(a[k]) - interior(b[k])), initial=0.0))
               for k in a if isinstance(a[k], np.ndarray) and a[k].dtype.kind == "f")


def test_veros_acc_killed_then_restarted_on_4_2_1_ranks(tmp_path):
    runs = {"ref4": launch(tmp_path, 4, tmp_path / "ref4"),
            "sigterm4": launch(tmp_path, 4, tmp_path / "sigterm4", "--sigterm-after", "1"),
            "crash4": launch(tmp_path, 4, tmp_path / "crash4", "--kill-after", str(KILL))}
    crashed = runs.pop("crash4")
    logs = finish(tmp_path, runs)
    finish(tmp_path, {"crash4": crashed}, expect_rc=1)
    step, saved = arrays(tmp_path / "crash4")
    assert step == KILL and int(saved["itt"]) == KILL
    # SIGTERM on rank 1 after iteration 1: a checkpoint of iteration 2 on every rank, then every rank's run()
    # returns there (Veros' own SIGTERM handler, chained by hpcckpt, does not abort one rank)
    assert arrays(tmp_path / "sigterm4")[0] == 2
    for rank in range(4):
        assert f"rank {rank}: run() returned at iteration 2, stop_reason SIGTERM" in logs["sigterm4"]

    runs = {}
    for n in (4, 2, 1):
        shutil.copytree(tmp_path / "crash4", tmp_path / f"restart{n}")
        runs[f"restart{n}"] = launch(tmp_path, n, tmp_path / f"restart{n}", "--dump-restored", tmp_path / f"dump{n}")
    for n in (2, 1):
        runs[f"ref{n}"] = launch(tmp_path, n, tmp_path / f"ref{n}")
    for cast in ("", "--cast"):  # the float64 checkpoint into a float32 run: only with the explicit cast
        shutil.copytree(tmp_path / "crash4", tmp_path / f"f32{cast}")
        runs[f"f32{cast}"] = launch(tmp_path, 1, tmp_path / f"f32{cast}", "--float-type", "float32",
                                    *([cast, "--dump-restored", tmp_path / "dump-f32"] if cast else []))
    refused = runs.pop("f32")
    finish(tmp_path, runs)
    assert "checkpoint_cast=True" in finish(tmp_path, {"f32": refused}, expect_rc=1)["f32"]
    _, as32 = arrays(tmp_path / "dump-f32")
    for name, value in saved.items():
        if isinstance(value, np.ndarray) and value.dtype == np.float64 and value.ndim:
            assert as32[name].dtype == np.float32 and np.array_equal(as32[name], value.astype(np.float32)), name
    assert as32["hpcckpt_veros"]["float_type"] == "float32" and saved["hpcckpt_veros"]["float_type"] == "float64"

    _, ref4 = arrays(tmp_path / "ref4")
    for n in (4, 2, 1):
        step, restored = arrays(tmp_path / f"dump{n}")
        assert step == KILL
        assert restored.keys() == saved.keys()
        for name in saved:  # the restored state is the saved global state, ghost cells at the edges included
            if isinstance(saved[name], np.ndarray):
                assert np.array_equal(restored[name], saved[name]), f"{name} restored on {n} ranks"
        step, final = arrays(tmp_path / f"restart{n}")
        assert step == STEPS and int(final["itt"]) == STEPS  # runlen after a restore: to the first run's end
        if n == 4:
            for name in ref4:  # bitwise, ghost cells included (more than the interiors a restart needs)
                assert np.array_equal(np.asarray(final[name]), np.asarray(ref4[name])), f"{name} not bitwise"
        else:
            _, own = arrays(tmp_path / f"ref{n}")
            veros_spread = maxdiff(own, ref4)  # Veros itself, uninterrupted on n ranks against 4
            print(f"{n} ranks: restarted run - 4-rank run {maxdiff(final, ref4):.3g}, Veros' own {veros_spread:.3g}")
            assert maxdiff(final, ref4) <= veros_spread, (n, maxdiff(final, ref4), veros_spread)


VEROS_DIMS = [("xt", "yt", "zt"), ("xu", "yu", "zw", "timesteps"), ("xt", "yu"), ("yu", "zt"), ("yt",), ("xu",),
              ("zt",), ("yu", "sigma"), ("xt", "yt", "isle")]


@given(px=st.integers(1, 4), py=st.integers(1, 4), cells=st.tuples(st.integers(1, 5), st.integers(1, 5)),
       dims=st.sampled_from(VEROS_DIMS))
@settings(max_examples=60, deadline=None)
def test_parts_tile_the_padded_array_and_repeats_are_replicated(px, py, cells, dims):
    """Every rank's part (own_part) together covers the ghost-padded global array exactly once, counting
    the ranks holding the same part once; parts are shared between ranks exactly when is_replicated says."""
    from veros import runtime_settings
    from veros.variables import get_shape

    from hpcckpt.integrations.veros import is_replicated, own_part

    if "veros.core" in sys.modules:
        pytest.skip("Veros' runtime settings are locked in this process")
    runtime_settings.update(num_proc=(px, py))
    dimensions = {"xt": px * cells[0], "xu": px * cells[0], "yt": py * cells[1], "yu": py * cells[1], "zt": 3,
                  "zw": 3, "timesteps": 3, "sigma": 4, "isle": 2}
    shape = get_shape(dimensions, dims, local=False)
    parts = {}
    for ix in range(px):
        for iy in range(py):
            offset, lidx = own_part(dims, dimensions, proc_idx=(ix, iy))
            size = tuple(n if s.stop is None else s.stop - s.start for s, n in zip(lidx, shape))
            parts.setdefault((offset, size), []).append((ix, iy))
    covered = np.zeros(shape, dtype=int)
    for offset, size in parts:
        covered[tuple(slice(o, o + n) for o, n in zip(offset, size))] += 1
    assert np.all(covered == 1)
    shared = any(len(ranks) > 1 for ranks in parts.values())
    no_x, no_y = (all(d not in axis for d in dims) for axis in (("xt", "xu"), ("yt", "yu")))
    assert is_replicated(dims) == (no_x or no_y)
    assert shared == ((no_x and px > 1) or (no_y and py > 1))  # so a shared part is always declared replicated


def test_checkpoint_keep_prunes_old_versions_and_checkpoint_restore_false_starts_afresh(tmp_path):
    every_step = tmp_path / "every-step"
    finish(tmp_path, {"every-step": launch(tmp_path, 1, every_step, "--keep", "3", every=1)})
    assert sorted(d for d in os.listdir(every_step) if d.startswith("step-")) == \
        [f"step-{k:012d}" for k in range(STEPS - 2, STEPS + 1)]  # saved at every step, the newest 3 kept
    shutil.copytree(every_step, tmp_path / "not-restored")
    finish(tmp_path, {
        "not-restored": launch(tmp_path, 1, tmp_path / "not-restored", "--no-restore", "--no-run",
                               "--dump-restored", tmp_path / "dump-not-restored"),
        "fresh": launch(tmp_path, 1, tmp_path / "fresh", "--no-run", "--dump-restored", tmp_path / "dump-fresh")})
    step, state = arrays(tmp_path / "dump-not-restored")
    fresh_step, fresh = arrays(tmp_path / "dump-fresh")
    assert step == fresh_step == 0 and sorted(state) == sorted(fresh)
    for name, value in fresh.items():  # the setup's own initial state, untouched by the checkpoints there
        assert np.array_equal(np.asarray(state[name]), np.asarray(value)), name
