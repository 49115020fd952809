"""apps/particles.py under mpiexec: incremental checkpoints of growing, migrating particles over a static field.

An uninterrupted run on 2 ranks is the reference; another run stops at step 17
on 3 ranks and is resumed on 2.  The final field must be bitwise equal and the
particles the same set (compared as tables sorted by id); the versions after
the first are incremental, including the first save after the restart on
another rank count (the chain continues across the change).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import hpcckpt
from hpcckpt.root.catalog import current, list_versions
from hpcckpt.storage.metadata_file import read_metadata
from mpitools import ROOT, run_mpi

APP = os.path.join(ROOT, "apps", "particles.py")
COMMON = ["--ny", "96", "--nx", "128", "--particles", "40", "--inject", "4", "--steps", "30", "--every", "5",
          "--block-bytes", "2048", "--keep", "3"]

pytestmark = pytest.mark.timeout(300)


def saves(stdout: str) -> list[tuple[int, str, int, int]]:
    out = []
    for line in stdout.splitlines():
        if line.startswith("[particles] SAVED "):
            _, _, step, kind, written, total = line.split()
            out.append((int(step), kind, int(written), int(total)))
    return out


def final(path: str):
    with hpcckpt.open(path) as view:
        assert view.verify() == [], path
        field = view.read("field")
        particles = view.read("particles")
        return field, np.sort(particles, order="id"), view.values["step"]


def test_restart_on_another_rank_count_matches_an_uninterrupted_run(tmp_path):
    ref = run_mpi(2, APP, "--root", tmp_path / "ref", "--out", tmp_path / "ref-out", *COMMON)
    first = run_mpi(3, APP, "--root", tmp_path / "ck", "--stop-at", 17, *COMMON)
    second = run_mpi(2, APP, "--root", tmp_path / "ck", "--out", tmp_path / "ck-out", *COMMON)
    assert "RESTORED 17" in second.stdout, second.stdout

    f_ref, p_ref, step_ref = final(str(tmp_path / "ref-out"))
    f_got, p_got, step_got = final(str(tmp_path / "ck-out"))
    assert step_ref == step_got == 30
    assert f_ref.dtype == f_got.dtype and f_ref.tobytes() == f_got.tobytes()  # bitwise
    assert len(p_ref) == 40 + 30 * 4  # the total grew by --inject per step
    assert np.array_equal(p_ref["id"], np.arange(len(p_ref)))
    assert p_ref.dtype == p_got.dtype and p_ref.tobytes() == p_got.tobytes()  # the same particle set, bit for bit
    # the field did change (near the particles), but not everywhere
    f0 = ((np.arange(96)[:, None] * 131 + np.arange(128)[None, :] * 71) % 97) / 97.0
    changed = np.count_nonzero(f_ref != f0)
    assert 0 < changed < f_ref.size // 2, changed

    s_ref, s1, s2 = saves(ref.stdout), saves(first.stdout), saves(second.stdout)
    assert [s[0] for s in s_ref] == [5, 10, 15, 20, 25, 30]
    assert [s[0] for s in s1] == [5, 10, 15, 17] and [s[0] for s in s2] == [20, 25, 30]
    for run in (s_ref, s1 + s2):
        assert run[0][1] == "full"
        assert all(kind == "incremental" for _, kind, _, _ in run[1:]), run
        assert all(written < total // 2 for _, _, written, total in run[1:]), run
    # the versions kept on disk say so in their metadata, and each restores exactly its state
    live = current(list_versions(str(tmp_path / "ck")))
    assert [e.step for e in live][-3:] == [20, 25, 30]
    for e in live:
        info = read_metadata(e.path).extra["incremental"]
        assert info["kind"] == ("full" if e.step == 5 else "incremental"), (e.name, info)
        assert (info["base"] is None) == (info["kind"] == "full")
    info = read_metadata(live[-1].path).extra["incremental"]
    assert info["depth"] == 6 and info["referenced_bytes"] > 0
    with hpcckpt.open(live[-1].path) as view:
        assert view.verify() == []
        assert view.read("field").tobytes() == f_ref.tobytes()
        assert np.sort(view.read("particles"), order="id").tobytes() == p_ref.tobytes()
