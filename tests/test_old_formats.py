"""Checkpoints written by earlier releases stay readable: tests/data/v1 holds format-version-1 versions.

They were written once by the release before metadata checksums (tests/data/v1/README.md has the
scripts); the arrays are recomputed here from the same seed and compared exactly (the lossy one
within its bound).
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import hpcckpt

DATA = os.path.join(os.path.dirname(__file__), "data", "v1")
SERIAL = ("plain", "lz4", "zstd", "shuffle-zstd", "lossy-abs")


def expected_arrays():
    """The arrays make_v1.py saved (same generator, same order of draws)."""
    rng = np.random.default_rng(2026)
    u = rng.standard_normal((24, 20))
    rec = np.dtype({"names": ["x", "id"], "formats": ["<f4", "<i8"], "offsets": [0, 8], "itemsize": 16})
    parts = np.zeros(37, rec)
    parts["x"] = rng.standard_normal(37).astype("<f4")
    parts["id"] = np.arange(37) * 7
    be = (np.arange(30, dtype=">i4") - 15).reshape(5, 6)
    return u, parts, be


def test_the_files_are_format_version_1():
    for name in SERIAL:
        with open(os.path.join(DATA, name, "metadata.json"), "rb") as f:
            assert json.loads(f.read())["format_version"] == 1


@pytest.mark.parametrize("name", SERIAL)
def test_version_1_single_versions_read_exactly(name):
    u, parts, be = expected_arrays()
    with hpcckpt.open(os.path.join(DATA, name)) as view:
        got = view.read("u")
        if name == "lossy-abs":
            assert np.max(np.abs(got - u)) <= 1e-3
        else:
            assert got.tobytes() == u.tobytes()
        assert view.read("parts").dtype == parts.dtype and view.read("parts").tobytes() == parts.tobytes()
        assert np.array_equal(view.read("be"), be)
        values = view.values
        assert values["step"] == 7 and values["time"] == 0.25 and values["name"] == "heat"
        assert np.isnan(values["nan"]) and values["nested"] == {"a": [1, 2, {"b": None}]} and values["flag"] is True
        assert values["scalar"] == np.float32(1.5) and values["scalar"].dtype == np.float32
        assert values["small"].dtype == np.dtype("<u2") and values["small"].tolist() == [[0, 1, 2], [3, 4, 5]]
        assert view.verify() == []


def test_version_1_incremental_chain_restores_every_step(tmp_path):
    root = str(tmp_path / "chain")
    shutil.copytree(os.path.join(DATA, "chain"), root)
    u, parts, be = expected_arrays()
    ck = hpcckpt.Checkpointer(root, track_failures=False)
    assert ck.steps() == [10, 20, 30]
    for step in (10, 20, 30):
        u[step // 10, :] += step
        target = np.zeros_like(u)
        state = {"u": hpcckpt.Block(target, offset=(0, 0), global_shape=u.shape),
                 "be": hpcckpt.Block(np.zeros(be.shape, be.dtype), offset=(0, 0), global_shape=be.shape),
                 "parts": hpcckpt.Ragged(np.zeros(0, parts.dtype))}
        out = ck.restore(state, step=step, strict=False)
        assert target.tobytes() == u.tobytes()
        assert out["parts"].local.tobytes() == parts.tobytes()
    ck.close()


@pytest.mark.parametrize("strategy", ["file-per-rank", "aggregated", "shared-file"])
def test_version_1_written_by_three_ranks(strategy):
    g = np.arange(9 * 8, dtype="<f8").reshape(9, 8) * 0.5
    ids = np.concatenate([np.arange(r * 5, r * 5 + 3 + r) for r in range(3)])
    with hpcckpt.open(os.path.join(DATA, "mpi3-" + strategy)) as view:
        assert view.step == 3 and view.read("g").tobytes() == g.tobytes()
        assert view.read("ids").tolist() == ids.tolist()
        assert view.verify() == []
