"""``hpcckpt.open`` as h5py does it: ``view["u"]`` is a lazy array whose numpy basic indexing reads only
the chunks the selection needs; a Checkpointer root opens its newest committed version."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hpcckpt
from hpcckpt import Block, CheckpointError, Ragged
from hpcckpt.core.names import METADATA_FILE
from hpcckpt.storage import PosixStorage

SHAPES = {1: (23,), 2: (7, 9), 3: (4, 5, 6)}
ARRAYS = {nd: np.arange(np.prod(s), dtype=np.float64).reshape(s) * 1.5 - 7 for nd, s in SHAPES.items()}


class CountingStorage(PosixStorage):
    """POSIX storage that records every chunk read: each segment of read_segments is one chunk."""

    def __init__(self):
        super().__init__()
        self.segments = []

    def read_segments(self, handle, offset, buffer, name, segments):
        pos = offset
        for nbytes, _ in segments:
            self.segments.append((name, pos, nbytes))
            pos += nbytes
        return super().read_segments(handle, offset, buffer, name, segments)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("view") / "ck")
    state = {f"a{nd}": Block(a) for nd, a in ARRAYS.items()}
    state["p"] = Ragged(ARRAYS[2][:5].astype(np.int32))
    state["time"] = 0.25
    hpcckpt.save(state, path, chunk_bytes=40, step=7)
    return path


def assert_same(got, expected):
    assert type(got) is type(expected), (type(got), type(expected))
    assert np.shape(got) == np.shape(expected) and np.asarray(got).dtype == np.asarray(expected).dtype
    assert np.array_equal(got, expected)


def index_strategy(shape):
    def one_axis(n):
        bound = st.integers(-n - 3, n + 3) | st.none()
        slices = st.builds(slice, bound, bound, st.sampled_from([None, 1, 2, 3, 5, -1, -2, -4]))
        return slices | st.integers(-n, n - 1)

    axes = st.tuples(*[one_axis(n) for n in shape])

    @st.composite
    def build(draw):
        key = list(draw(axes))
        cut = draw(st.integers(0, len(key)))
        form = draw(st.sampled_from(["plain", "prefix", "ellipsis", "newaxis"]))
        if form == "prefix":
            key = key[:cut]
        elif form == "ellipsis":
            key = key[:cut] + [Ellipsis] + key[cut + draw(st.integers(0, len(key) - cut)):]
        elif form == "newaxis":
            key.insert(cut, None)
        return key[0] if len(key) == 1 and draw(st.booleans()) else tuple(key)

    return build()


@pytest.mark.parametrize("nd", [1, 2, 3])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_slicing_matches_numpy(saved, nd, data):
    key = data.draw(index_strategy(SHAPES[nd]))
    with hpcckpt.open(saved) as view:
        assert_same(view[f"a{nd}"][key], ARRAYS[nd][key])


def test_array_like_attributes(saved):
    view = hpcckpt.open(saved)
    u = view["a3"]
    assert (u.shape, u.dtype, u.ndim, u.size, len(u), u.nbytes) == ((4, 5, 6), np.float64, 3, 120, 4, 960)
    assert_same(np.asarray(u), ARRAYS[3])
    assert np.asarray(u, dtype=np.float32).dtype == np.float32
    assert_same(u[...], ARRAYS[3][...])
    assert_same(u[()], ARRAYS[3][()])
    assert [r.shape for r in u] == [(5, 6)] * 4
    assert "'a3'" in repr(u) and "(4, 5, 6)" in repr(u) and "float64" in repr(u)
    assert_same(np.asarray(view["p"])[1:4], ARRAYS[2][1:4].astype(np.int32))
    assert_same(view["p"][1:4], ARRAYS[2][1:4].astype(np.int32))  # Ragged: rows slicing on axis 0
    assert_same(view["p"][::-2, 3], ARRAYS[2][:5].astype(np.int32)[::-2, 3])


def test_out_of_range_and_unsupported_indices(saved):
    u = hpcckpt.open(saved)["a2"]
    for key in [7, -8, (0, 9), (0, -10), (..., 9)]:
        with pytest.raises(IndexError):
            ARRAYS[2][key]
        with pytest.raises(IndexError, match="out of bounds"):
            u[key]
    for key in [(0, 0, 0), (..., 0, ...), [0, 1], np.array([1]), True, "x", 1.5]:
        with pytest.raises(IndexError):
            u[key]


def test_mapping_of_variable_names_and_repr(saved):
    view = hpcckpt.open(saved)
    assert sorted(view) == sorted(view.keys()) == ["a1", "a2", "a3", "p"]
    assert len(view) == 4 and "a1" in view and "time" not in view and view.values == {"time": 0.25}
    text = repr(view)
    assert saved in text and "step 7" in text and "(4, 5, 6) float64" in text and "'p': ragged" in text
    with pytest.raises(KeyError, match=r"'nope'.*'a1', 'a2', 'a3', 'p'"):
        view["nope"]
    with pytest.raises(KeyError, match=r"replicated value.*values\['time'\]"):
        view["time"]


def test_a_small_slice_reads_only_the_chunks_it_needs(saved):
    storage = CountingStorage()
    view = hpcckpt.open(saved, storage=storage)
    var = view.variables["a2"]
    total = len(var.chunks)
    for key, lo, hi in [((slice(2, 4), slice(1, 3)), (2, 1), (4, 3)), ((5, slice(None, None, -3)), (5, 0), (6, 9)),
                        ((slice(-1, None), -1), (6, 8), (7, 9))]:
        storage.segments.clear()
        assert_same(view["a2"][key], ARRAYS[2][key])
        starts, stops = var.chunks.start, var.chunks.start + var.chunks.count
        needed = int(np.all((starts < hi) & (stops > lo), axis=1).sum())
        assert len(storage.segments) == needed < total
    storage.segments.clear()
    view["a2"].shape, len(view["a2"]), repr(view["a2"])
    assert storage.segments == []  # lazy: nothing is read until indexed
    np.asarray(view["a2"])
    assert len(storage.segments) == total


def test_open_root_picks_the_newest_committed_version(tmp_path):
    root = tmp_path / "root"
    ck = hpcckpt.Checkpointer(root, keep=5)
    for step in (3, 10, 4):
        ck.save({"u": Block(np.full(5, float(step))), "step": step}, step=step)
    ck.save({"u": Block(np.full(5, 11.0)), "step": 10}, step=10)  # a revision of step 10 supersedes it
    ck.close()
    os.makedirs(root / "step-000000000099")  # a partial (uncommitted) version is never opened
    with hpcckpt.open(root) as view:
        assert view.step == 10 and view.values["step"] == 10 and np.array_equal(view["u"][:], np.full(5, 11.0))
        version = view.path
    assert os.path.basename(version).startswith("step-000000000010.r")
    assert hpcckpt.open(version).path == version
    assert hpcckpt.open(os.path.join(version, METADATA_FILE)).path == version


def test_open_root_without_committed_version(tmp_path):
    os.makedirs(tmp_path / "root" / "step-000000000001")
    with pytest.raises(CheckpointError, match="no committed version"):
        hpcckpt.open(tmp_path / "root")
    with pytest.raises(CheckpointError):
        hpcckpt.open(tmp_path / "elsewhere")
