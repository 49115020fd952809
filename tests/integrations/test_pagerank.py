"""apps/pagerank.py under mpiexec: a partitioned graph, incremental checkpoints, SIGKILL and restart on 2/3/4 ranks.

The guarantee tested: the final rank vector is bitwise identical, after the
same number of iterations, on every rank count and whether or not the run was
killed and restarted (on the same or another rank count); it matches a dense
direct solve of the PageRank equations.  On disk: the edges are written by
the first version only; every later version on the same rank count writes
exactly the rank vector (8 bytes per vertex) and references the edge blocks;
after a restart on another rank count the first save rewrites at most the
edge block under each old or new rank boundary (a block the old layout stored
as two pieces is whole now, and one a new boundary cuts is two new pieces).
The default policy saves often when the failure history says failures are
frequent, and not before the end when it has none; SIGUSR1 makes a checkpoint
and a clean stop; a checkpoint of another graph or an unreadable edge file is
one CheckpointError on every rank.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import hpcckpt
from hpcckpt.root.catalog import current, list_versions
from hpcckpt.storage.metadata_file import read_metadata
from hpcckpt.policy import FailureHistory
from mpitools import ROOT, mpiexec_path, run_mpi

APP = os.path.join(ROOT, "apps", "pagerank.py")
sys.path.insert(0, os.path.join(ROOT, "apps"))
import pagerank  # noqa: E402  (the app's generator, for the dense reference)

SCALE, BLOCK = 9, 2048
N = 1 << SCALE
COMMON = ["--scale", SCALE, "--edge-factor", 16, "--tol", "1e-12", "--block-bytes", BLOCK, "--keep", 3]
ENV = {"MPIR_CVAR_CH4_PROGRESS_THROTTLE": "1", "MPIR_CVAR_POLLS_BEFORE_YIELD": "1", "PYTHONUNBUFFERED": "1"}

pytestmark = pytest.mark.timeout(600)


def app(nranks: int, *args, check: bool = True):
    return run_mpi(nranks, APP, *COMMON, *args, env=ENV, check=check, timeout=240)


def saves(stdout: str) -> list[tuple[int, str, int, int]]:
    """The ``SAVED iteration kind written total`` lines of rank 0."""
    out = []
    for line in stdout.splitlines():
        if line.startswith("[pagerank] SAVED "):
            _, _, it, kind, written, total = line.split()
            out.append((int(it), kind, int(written), int(total)))
    return out


def final(path) -> tuple[np.ndarray, int]:
    with hpcckpt.open(str(path)) as view:
        assert view.verify() == []
        return view.read("rank"), view.values["iteration"]


def data_bytes(version: str) -> int:
    """Bytes of the data files a version wrote itself (on disk, its own directory)."""
    d = os.path.join(version, "data")
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))


def dense_pagerank(edges: np.ndarray, n: int, d: float = 0.85) -> np.ndarray:
    """PageRank by a direct solve of x = (1-d)/n + d M x (dangling columns spread evenly): an independent check."""
    a = np.zeros((n, n))
    keep = edges["src"] != edges["dst"]
    a[edges["dst"][keep], edges["src"][keep]] = 1.0  # duplicates count once
    out = a.sum(axis=0)
    m = np.where(out > 0, a / np.maximum(out, 1.0), 1.0 / n)
    return np.linalg.solve(np.eye(n) - d * m, np.full(n, (1.0 - d) / n))


def test_matches_a_direct_solve_for_a_generated_and_a_file_graph(tmp_path):
    edges = pagerank.rmat_edges(SCALE, 0, 16 * N, 1)
    app(2, "--root", tmp_path / "gen", "--out", tmp_path / "gen-out")
    x, _ = final(tmp_path / "gen-out")
    assert x.shape == (N,) and abs(x.sum() - 1.0) < 1e-12
    assert np.abs(x - dense_pagerank(edges, N)).sum() < 1e-10

    # the same edges as a text edge list, read on 3 ranks (vertices 0 .. max id)
    text = tmp_path / "edges.txt"
    np.savetxt(text, np.stack([edges["src"], edges["dst"]], axis=1), fmt="%d", header="src dst")
    app(3, "--root", tmp_path / "file", "--graph", text, "--out", tmp_path / "file-out")
    n_file = int(max(edges["src"].max(), edges["dst"].max())) + 1
    y, _ = final(tmp_path / "file-out")
    assert np.abs(y - dense_pagerank(edges, n_file)).sum() < 1e-10


def test_killed_then_restarted_on_2_3_4_ranks_is_bitwise_identical_and_never_rewrites_the_edges(tmp_path):
    ref = app(2, "--root", tmp_path / "ref", "--every", 4, "--out", tmp_path / "ref-out")
    x_ref, it_ref = final(tmp_path / "ref-out")
    s_ref = saves(ref.stdout)
    assert it_ref > 8 and [s[0] for s in s_ref[:-1]] == list(range(4, it_ref, 4)), s_ref
    # the first version writes the edges and the ranks; every later one only the ranks (8 bytes per vertex)
    assert s_ref[0][1] == "full" and s_ref[0][2] == s_ref[0][3] > 8 * N * 10
    assert all(kind == "incremental" and written == 8 * N for _, kind, written, _ in s_ref[1:]), s_ref
    ref_live = current(list_versions(str(tmp_path / "ref")))
    with hpcckpt.open(ref_live[-1].path) as view:
        ref_edges = view.read("edges")
    assert np.all(np.diff(ref_edges["dst"]) >= 0)  # globally sorted by target: the same rows on any rank count

    killed = app(3, "--root", tmp_path / "ck", "--every", 4, "--kill-rank", 1, "--kill-after-saves", 2, check=False)
    assert killed.returncode != 0 and "SIGKILL to myself after iteration 8" in killed.stdout, killed.stdout
    assert [s[0] for s in saves(killed.stdout)] == [4, 8]
    first = current(list_versions(str(tmp_path / "ck")))[0].path

    for nranks in (2, 3, 4):
        root = tmp_path / f"restart-{nranks}"
        shutil.copytree(tmp_path / "ck", root)
        run = app(nranks, "--root", root, "--every", 4, "--out", tmp_path / f"out-{nranks}")
        assert f"RESTORED 8 from {root}/step-000000000008 (saved by 3 ranks, on {nranks})" in run.stdout, run.stdout
        x, it = final(tmp_path / f"out-{nranks}")
        assert it == it_ref and x.dtype == x_ref.dtype and x.tobytes() == x_ref.tobytes(), nranks  # bitwise

        after = saves(run.stdout)
        assert [s[0] for s in after] == [s[0] for s in s_ref if s[0] > 8]
        assert all(kind == "incremental" for _, kind, _, _ in after)
        # edge bytes rewritten by the first save after the restart: none on the same rank count; on another,
        # at most the block under each rank boundary, old (now whole again) or new (cut in two pieces);
        # none at all by the saves after it
        edge_bytes = after[0][2] - 8 * N
        assert edge_bytes == 0 if nranks == 3 else 0 < edge_bytes <= (3 - 1 + nranks - 1) * BLOCK, (nranks, after)
        assert all(written == 8 * N for _, _, written, _ in after[1:]), after
        live = current(list_versions(str(root)))
        assert live[0].path.endswith(os.path.basename(first))  # the version holding the edges is still kept
        for e in live[1:]:
            info = read_metadata(e.path).extra["incremental"]
            assert info["kind"] == "incremental"
            # by bytes on disk: the version's own data files hold the rank vector (plus any rewritten edge blocks)
            assert data_bytes(e.path) == info["written_bytes"]
        last = live[-1].path
        assert data_bytes(last) == 8 * N
        assert any(f.startswith(f"@{os.path.basename(first)}/") for f in read_metadata(last).files)
        with hpcckpt.open(last) as view:
            assert view.read("edges").tobytes() == ref_edges.tobytes()


def seed_failures(root, count: int, exposure: float) -> None:
    """A failure history under ``root``: ``count`` earlier runs that each died ``exposure`` s after starting.

    The last one is left open: the app's start counts it as a failure.
    """
    history = FailureHistory.load(str(root))
    t = time.time() - 10 * count * exposure
    for _ in range(count):
        history.job_start(t, persist=False)  # closes the previous open run as a failure
        history.heartbeat(t + exposure, persist=False)
        t += 2 * exposure
    history.save()  # the last run is still open: the app's start counts it as a failure too


def test_the_default_policy_saves_often_when_failures_are_frequent_and_not_when_they_are_rare(tmp_path):
    args = ["--tol", "1e-300", "--max-iter", 40, "--sleep", 0.05, "--mtbf", 0.01]
    rare = app(2, "--root", tmp_path / "rare", *args, "--out", tmp_path / "rare-out")
    os.makedirs(tmp_path / "often")
    seed_failures(tmp_path / "often", 20, 0.5)
    often = app(2, "--root", tmp_path / "often", *args, "--out", tmp_path / "often-out")
    # no failure seen: the MTBF estimate grows with the run's own exposure and, with no measured cost yet
    # (30 s assumed), Daly's interval outlasts the 2 s run: only the final checkpoint
    assert [s[0] for s in saves(rare.stdout)] == [40]
    # 20 failures after 0.5 s each: MTBF about 0.5 s, a save within the first second, then Daly's interval
    # from the measured (small) cost: several saves, the later ones incremental
    got = saves(often.stdout)
    assert len(got) >= 3 and got[-1][0] == 40, got
    assert all(kind == "incremental" and written == 8 * N for _, kind, written, _ in got[1:]), got
    with open(tmp_path / "often" / "failure_history.json") as f:
        assert sum(1 for r in json.load(f)["runs"] if r.get("failed")) == 20
    assert final(tmp_path / "rare-out")[0].tobytes() == final(tmp_path / "often-out")[0].tobytes()


def test_a_checkpoint_of_another_graph_is_one_clear_error_on_every_rank(tmp_path):
    app(2, "--root", tmp_path / "ck", "--every", 4, "--max-iter", 4)
    bad = app(3, "--root", tmp_path / "ck", "--seed", 2, check=False)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "raised on all 3 ranks" in bad.stderr and "'seed': 1" in bad.stderr and "'seed': 2" in bad.stderr
    versions = [e.step for e in current(list_versions(str(tmp_path / "ck")))]
    assert versions == [4]  # nothing lost, nothing written

    broken = tmp_path / "broken.txt"
    broken.write_text("0 1\n1 2\n2\n")
    bad = app(2, "--root", tmp_path / "other", "--graph", broken, check=False)
    assert bad.returncode == 1 and "raised on all 2 ranks" in bad.stderr and "broken.txt" in bad.stderr, bad.stderr


def test_sigusr1_under_the_default_policy_checkpoints_stops_cleanly_and_resumes_bitwise(tmp_path):
    args = ["--tol", "1e-300", "--max-iter", 60]
    app(2, "--root", tmp_path / "ref", *args, "--out", tmp_path / "ref-out")
    cmd = [mpiexec_path(), "-n", "4", sys.executable, APP, *map(str, COMMON), *map(str, args),
           "--root", str(tmp_path / "ck"), "--sleep", "0.05"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=ROOT, **ENV), start_new_session=True)
    watchdog = threading.Timer(180, lambda: os.killpg(proc.pid, signal.SIGKILL))
    watchdog.start()
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            found = re.search(r"pids ([\d ]+)$", line.strip())
            if found:
                break
        else:
            pytest.fail("pagerank did not print its pids:\n" + "".join(lines))
        # the handlers are in place before the pids are printed, and the app checks for a stop after each
        # iteration: it stops after its first iteration at the earliest, whenever the signal comes
        for pid in map(int, found.group(1).split()):
            os.kill(pid, signal.SIGUSR1)
        output = "".join(lines) + proc.stdout.read()
        rc = proc.wait()
    finally:
        watchdog.cancel()
    assert rc == 0, output
    stopped = re.search(r"stopping \(SIGUSR1\) after iteration (\d+) with a checkpoint", output)
    assert stopped, output
    it = int(stopped.group(1))
    assert 0 < it < 60 and [(s[0], s[1]) for s in saves(output)] == [(it, "full")], output
    assert [e.step for e in current(list_versions(str(tmp_path / "ck")))] == [it]  # the signal's checkpoint only

    resumed = app(3, "--root", tmp_path / "ck", *args, "--out", tmp_path / "out")
    assert f"RESTORED {it} " in resumed.stdout, resumed.stdout
    assert final(tmp_path / "out")[0].tobytes() == final(tmp_path / "ref-out")[0].tobytes()
