"""Checkpoints written by earlier releases stay readable: tests/data/v1 and tests/data/v2 hold format-version-1
and format-version-2 versions.

They were written once by the release before metadata checksums (v1) and by the last one before the columnar
chunk tables of format version 3 (v2), with the same scripts (tests/data/v*/README.md); the arrays are
recomputed here from the same seed and compared exactly (the lossy one within its bound).  An incremental
chain begun by an old release goes on with today's writer: its new versions are format version 3, with
columnar tables, referencing the old versions' blocks.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import hpcckpt
from testpaths import TESTS

DATA = os.path.join(TESTS, "data")
VERSIONS = (1, 2)
SERIAL = ("plain", "lz4", "zstd", "shuffle-zstd", "lossy-abs")
STRATEGIES = ("file-per-rank", "aggregated", "shared-file")


def fixture(version: int, *names: str) -> str:
    return os.path.join(DATA, f"v{version}", *names)


def expected_arrays():
    """The arrays make_v1.py and make_v2.py saved (same generator, same order of draws)."""
    rng = np.random.default_rng(2026)
    u = rng.standard_normal((24, 20))
    rec = np.dtype({"names": ["x", "id"], "formats": ["<f4", "<i8"], "offsets": [0, 8], "itemsize": 16})
    parts = np.zeros(37, rec)
    parts["x"] = rng.standard_normal(37).astype("<f4")
    parts["id"] = np.arange(37) * 7
    be = (np.arange(30, dtype=">i4") - 15).reshape(5, 6)
    return u, parts, be


@pytest.mark.parametrize("version", VERSIONS)
def test_the_files_are_of_their_format_version(version):
    names = [*SERIAL, *(f"mpi3-{s}" for s in STRATEGIES), *(f"chain/step-0000000000{s}" for s in (10, 20, 30))]
    for name in names:
        with open(fixture(version, name, "metadata.json"), "rb") as f:
            assert json.loads(f.read())["format_version"] == version
        assert hpcckpt.open(fixture(version, name)).meta.format_version == version


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", SERIAL)
def test_old_single_versions_read_exactly(version, name):
    u, parts, be = expected_arrays()
    with hpcckpt.open(fixture(version, name)) as view:
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


@pytest.mark.parametrize("version", VERSIONS)
def test_old_incremental_chain_restores_every_step(version, tmp_path):
    root = str(tmp_path / "chain")
    shutil.copytree(fixture(version, "chain"), root)
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


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_old_versions_written_by_three_ranks(version, strategy):
    g = np.arange(9 * 8, dtype="<f8").reshape(9, 8) * 0.5
    ids = np.concatenate([np.arange(r * 5, r * 5 + 3 + r) for r in range(3)])
    with hpcckpt.open(fixture(version, "mpi3-" + strategy)) as view:
        assert view.step == 3 and view.read("g").tobytes() == g.tobytes()
        assert view.read("ids").tolist() == ids.tolist()
        assert view.verify() == []


@pytest.mark.parametrize("version", VERSIONS)
def test_an_old_chain_goes_on_in_format_version_3(version, tmp_path, table_form):
    """Today's incremental save on top of an old chain: a version 3 increment (its tables in each form) that
    references the old versions' blocks; every step, old and new, restores exactly."""
    root = str(tmp_path / "chain")
    shutil.copytree(fixture(version, "chain"), root)
    u, parts, be = expected_arrays()
    for step in (10, 20, 30):
        u[step // 10, :] += step
    history = {}
    ck = hpcckpt.Checkpointer(root, incremental=True, block_bytes=256, track_failures=False)
    for step in (40, 50):
        u[step // 10, :] -= step
        history[step] = u.copy()
        ck.save({"u": hpcckpt.Block(u, offset=(0, 0), global_shape=u.shape),
                 "be": hpcckpt.Block(be, offset=(0, 0), global_shape=be.shape), "parts": hpcckpt.Ragged(parts)},
                step=step)
    assert ck.steps() == [10, 20, 30, 40, 50]
    for step in (40, 50):
        path = os.path.join(root, f"step-{step:012d}")
        with open(os.path.join(path, "metadata.json"), "rb") as f:
            doc = json.loads(f.read())
        assert doc["format_version"] == 3
        assert ("data" in doc["variables"]["u"]["chunks"]) == (table_form == "columnar")
        old = {f"@step-0000000000{s}/data/part-000000.bin" for s in (10, 20, 30)}
        assert old & set(doc["files"]), "the increment references the old versions' blocks"
        with hpcckpt.open(path) as view:
            assert view.read("u").tobytes() == history[step].tobytes() and view.verify() == []
            assert view.meta.variables["u"].chunks.hash is not None
    restored = {}
    for step in (10, 20, 30, 40, 50):
        target = np.zeros_like(u)
        out = ck.restore({"u": hpcckpt.Block(target, offset=(0, 0), global_shape=u.shape),
                          "be": hpcckpt.Block(np.zeros(be.shape, be.dtype), offset=(0, 0), global_shape=be.shape),
                          "parts": hpcckpt.Ragged(np.zeros(0, parts.dtype))}, step=step, strict=False)
        restored[step] = target
        assert out["parts"].local.tobytes() == parts.tobytes()
    ck.close()
    assert all(restored[s].tobytes() == history[s].tobytes() for s in (40, 50))
    base, _, _ = expected_arrays()
    for step in (10, 20, 30):
        base[step // 10, :] += step
        assert restored[step].tobytes() == base.tobytes()
