"""SIGKILL at every file-system call of a save and of a restore of tracked files: each file is old or new, never mixed.

tests/scripts/crash_files.py runs one save (or restore) and kills itself just
before its k-th file-system call; k runs over every call the operation makes
(counted by a run that is not killed; by default the last 8 calls, where the
rollback and the commit happen, and 6 seeded others: HPCCKPT_TEST_EXHAUSTIVE=1
tries every call).  Afterwards every tracked file holds
either its content before the operation or its content at the version, and a
restore (the restart) brings every file to the restored version's exact bytes.
"""

from __future__ import annotations

import importlib.util
import os
import random
import subprocess
import sys

import pytest

from mpitools import ROOT
from testpaths import TESTS

HERE = TESTS
SCRIPT = os.path.join(HERE, "scripts", "crash_files.py")
SEED = int(os.environ.get("HPCCKPT_TEST_SEED", "0"))

_spec = importlib.util.spec_from_file_location("crash_files", SCRIPT)
crash = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(crash)

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


def run(workdir, mode: str, at: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), HPCCKPT_NO_MPI="1")
    return subprocess.run([sys.executable, SCRIPT, str(workdir), mode, str(at)], capture_output=True, text=True,
                          timeout=120, env=env, cwd=ROOT)


def files(workdir) -> dict:
    out = os.path.join(workdir, "out")
    return {n: open(os.path.join(out, n), "rb").read() for n in sorted(os.listdir(out))
            if not n.startswith(".")}  # a temporary rollback copy may be left: it is not a tracked file


def write_step(workdir, rng: random.Random, step: int) -> None:
    out = os.path.join(workdir, "out")
    with open(os.path.join(out, "log.txt"), "a") as f:
        f.write(f"step {step}\n" * rng.randrange(1, 200))
    series = os.path.join(out, "series.bin")
    if not os.path.exists(series):
        open(series, "wb").write(bytes(rng.randrange(256) for _ in range(6000)))
    with open(series, "r+b") as f:
        for _ in range(3):
            f.seek(rng.randrange(6000))
            f.write(bytes([step]) * rng.randrange(1, 900))


def prepare(workdir, seed: int) -> dict:
    """Steps 1..3 saved in process; returns each version's file contents."""
    rng = random.Random(seed)
    os.makedirs(os.path.join(workdir, "out"))
    ck = crash.checkpointer(str(workdir))
    snaps = {}
    for step in (1, 2, 3):
        write_step(workdir, rng, step)
        ck.save(crash.state(step), step)
        snaps[step] = files(workdir)
    ck.close()
    write_step(workdir, rng, 4)  # the run went on after its last checkpoint
    return snaps


def restore_in_process(workdir) -> int:
    import numpy as np

    import hpcckpt

    ck = crash.checkpointer(str(workdir))
    got = ck.restore({"u": hpcckpt.Block(np.zeros(8)), "step": None})
    ck.close()
    return got["step"]


def calls_of(tmp_path, mode: str) -> int:
    work = tmp_path / "count"
    prepare(work, SEED)
    proc = run(work, mode, 0)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.split("CALLS ")[1])


def instants(total: int, mode: str) -> list[int]:
    """Every call with HPCCKPT_TEST_EXHAUSTIVE=1; else the last 8 (the rollback, the commit) and 6 seeded others."""
    if os.environ.get("HPCCKPT_TEST_EXHAUSTIVE"):
        return list(range(1, total + 1))
    rng = random.Random(f"{SEED}-{mode}")
    early = list(range(1, max(1, total - 7)))
    return sorted(rng.sample(early, min(6, len(early)))) + list(range(max(1, total - 7), total + 1))


@pytest.mark.parametrize("mode", ["restore", "save"])
def test_kill_at_every_call_leaves_each_file_old_or_new(tmp_path, mode):
    total = calls_of(tmp_path, mode)
    assert total > 5
    for at in instants(total, mode):
        work = tmp_path / f"{mode}-{at}"
        snaps = prepare(work, SEED)
        before = files(work)
        proc = run(work, mode, at)
        assert proc.returncode == -9, (at, proc.returncode, proc.stdout, proc.stderr)
        now = files(work)
        if mode == "save":  # a save only reads the tracked files
            assert now == before, at
        else:
            for name, content in now.items():
                assert content in (before[name], snaps[3][name]), (at, name)
        step = restore_in_process(work)  # the restart
        assert step in ((3,) if mode == "restore" else (3, 100)), (at, step)
        assert files(work) == (snaps[3] if step == 3 else before), at
