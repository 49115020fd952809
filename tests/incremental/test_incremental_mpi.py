"""Incremental chains under mpiexec: saves of a dynamic state continued across rank-count changes.

Each run restores the newest version (checking it is exactly what its step
held), then saves more steps incrementally; the next run uses another rank
count.  Afterwards every committed version (retention kept some, and whatever
they reference) is read back serially and compared with its step's state.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random

import numpy as np
import pytest

import hpcckpt
from hpcckpt.root.catalog import current, list_versions
from mpitools import run_mpi
from testpaths import TESTS

HERE = TESTS
SCRIPT = os.path.join(HERE, "scripts", "incremental_chain.py")
SEED = int(os.environ.get("HPCCKPT_TEST_SEED", "0"))

pytestmark = pytest.mark.timeout(240)

_spec = importlib.util.spec_from_file_location("incremental_chain", SCRIPT)
chain = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(chain)


def check_version(path: str, seed: int) -> None:
    with hpcckpt.open(path) as view:
        assert view.verify() == [], path
        step = view.values["step"]
        g = chain.global_state(seed, step)
        names = {n for n, v in g.items() if isinstance(v, np.ndarray)}
        assert set(view.variables) == names, (path, sorted(view.variables))
        for name in names:
            got = view.read(name)
            assert got.dtype == g[name].dtype and np.array_equal(got, g[name]), (path, name)


def parse(stdout: str) -> list[tuple]:
    out = []
    for line in stdout.splitlines():
        if line.startswith("SAVED "):
            _, step, kind, written, referenced, dedup = line.split()
            out.append((int(step), kind, int(written), int(referenced), int(dedup)))
    return out


@pytest.mark.parametrize("form, exchange", [("json", "allgather"), ("columnar", "allgather"), ("json", "owners"),
                                            ("columnar", "owners")])
def test_chain_across_rank_counts(tmp_path, form, exchange):
    rng = random.Random(SEED)
    root = str(tmp_path / "ckpt")
    counts = [4, 3, 2, 4] if SEED == 0 else [rng.choice([1, 2, 3, 4]) for _ in range(4)]
    step = 0
    saves = []
    for i, n in enumerate(counts):
        k = 3
        proc = run_mpi(n, SCRIPT, root, step, k, SEED, form, exchange, timeout=120)
        if i:
            assert f"RESTORED {step - 1}" in proc.stdout, proc.stdout
        saves += parse(proc.stdout)
        step += k
    assert [s[0] for s in saves] == list(range(step))
    kinds = [s[1] for s in saves]
    assert kinds[0] == "full" and "incremental" in kinds
    # the first save after each restart on another rank count still reuses the chain (global blocks)
    for first in (3, 6, 9):
        assert saves[first][1] == "incremental" and saves[first][3] > 0, saves[first]
    # a full version stores the zero region once (dedup); incremental ones find it in the chain
    assert all(s[4] > 0 for s in saves if s[1] == "full"), saves
    live = current(list_versions(root))
    assert [e.step for e in live][-3:] == [step - 3, step - 2, step - 1]
    for e in live:
        check_version(e.path, SEED)
        with open(os.path.join(e.path, "metadata.json"), "rb") as f:
            tables = [v["chunks"] for v in json.loads(f.read())["variables"].values()]
        assert all(("data" in t) == (form == "columnar") for t in tables), e.path


FAIL_SCRIPT = r"""
import os, sys, numpy as np
from mpi4py import MPI
import hpcckpt
from hpcckpt.incremental import dedup_owners
C = MPI.COMM_WORLD; r = C.Get_rank(); n = C.Get_size()
d = sys.argv[1]
if sys.argv[2] == "owners":
    dedup_owners.OWNERS_FROM_RANKS = 1
u = np.full((4, 8), float(r))
good = lambda: {"u": hpcckpt.Block(u, (4 * r, 0), (4 * n, 8)), "t": hpcckpt.Ragged(np.arange(r + 3))}
hpcckpt.save(good(), d + "/a", comm=C, incremental=True, block_bytes=64)
bad = {"u": hpcckpt.Block(u, (4 * r, 0), (4 * n, 8)) if r != 1 else "nonsense", "t": hpcckpt.Ragged(np.arange(3))}
for label, state, kw in [("describe", bad, {"incremental": True}), ("base", good(), {"base": d + "/nothing"})]:
    try:
        hpcckpt.save(state, d + "/b", comm=C, **kw)
        line = f"NOERROR {label} {r}"
    except hpcckpt.CheckpointError as exc:
        line = f"ERROR {label} {r} {type(exc).__name__} " + str(exc).replace(chr(10), " ")
    lines = C.gather(line, root=0)  # printed by rank 0 only: no interleaved output
    if r == 0:
        print(*lines, f"EXISTS {label} {os.path.exists(d + '/b')}", sep=chr(10), flush=True)
u[0, 0] = 7  # one block per rank changes; every transport continues the chain
for i, strategy in enumerate(["aggregated", "shared-file", "file-per-rank"]):
    res = hpcckpt.save(good(), d + f"/c{i}", comm=C, base=d + ("/a" if i == 0 else f"/c{i - 1}"), block_bytes=64,
                       strategy=strategy)
    if r == 0:
        print("SAVED", strategy, res.incremental["kind"], res.bytes_written, flush=True)
"""


@pytest.mark.parametrize("exchange", ["allgather", "owners"])
def test_failures_reach_every_rank_and_every_transport_continues_the_chain(tmp_path, exchange):
    """The save's few collectives (gather + bcast, the select stage's allgather or alltoalls, gather + bcast)
    still agree on failures."""
    script = tmp_path / "fail.py"
    script.write_text(FAIL_SCRIPT)
    out = run_mpi(3, str(script), str(tmp_path), exchange, timeout=120).stdout
    assert "NOERROR" not in out, out
    for label, needle in (("describe", "differ between ranks"), ("base", "not a committed checkpoint")):
        lines = [line for line in out.splitlines() if line.startswith(f"ERROR {label} ")]
        assert len(lines) == 3 and all(needle in line for line in lines), out
        assert f"EXISTS {label} False" in out, out
    saved = [line.split() for line in out.splitlines() if line.startswith("SAVED ")]
    assert [s[2] for s in saved] == ["incremental"] * 3, out
    assert int(saved[0][3]) > 0 and int(saved[1][3]) == 0 and int(saved[2][3]) == 0, out
    for i in range(3):
        with hpcckpt.open(str(tmp_path / f"c{i}")) as view:
            assert view.verify() == []
            u = view.read("u")
            assert u[::4, 0].tolist() == [7, 7, 7] and u[1::4, 0].tolist() == [0, 1, 2]  # each rank changed its row 0
            assert view.read("t").tolist() == [0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3, 4]
