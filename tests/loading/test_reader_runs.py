"""The reader's direct path: which chunks go straight into the target, coalesced runs, and their verification."""

from __future__ import annotations

import os

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

import hpcckpt
from hpcckpt.mpi.collective import SerialComm
from hpcckpt.core.checksum import checksum, checksum_from_xxh3_128
from hpcckpt.errors import CorruptCheckpointError
from hpcckpt.storage.metadata_file import read_metadata
from hpcckpt.loading.reader import ChunkReader, coalesce, direct_targets
from hpcckpt.storage.posix import confined_path

COMM = SerialComm()


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.integers(0, 600), st.integers(600, 1 << 16)), st.integers(0, 2**32 - 1))
def test_checksum_from_content_hash_matches_checksum(nbytes, seed):
    data = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
    derived = checksum_from_xxh3_128(xxhash.xxh3_128_hexdigest(data), nbytes)
    assert derived == (checksum(data) if nbytes > 240 else None)


@st.composite
def boxes_in_target(draw):
    """A C-ordered target box in a global array, and chunk boxes near it (inside, straddling or outside)."""
    ndim = draw(st.integers(1, 3))
    shape = [draw(st.integers(1, 5)) for _ in range(ndim)]
    box_start = [draw(st.integers(0, 3)) for _ in range(ndim)]
    chunks = []
    for _ in range(draw(st.integers(1, 8))):
        start = [draw(st.integers(0, b + n)) for b, n in zip(box_start, shape)]
        count = [draw(st.integers(1, 5)) for _ in range(ndim)]
        chunks.append((start, count))
    return shape, box_start, chunks


@settings(max_examples=300, deadline=None)
@given(boxes_in_target(), st.sampled_from([1, 4, 8]))
def test_direct_targets_agree_with_numpy_views(case, itemsize):
    shape, box_start, chunks = case
    out = np.zeros(shape, dtype=f"V{itemsize}")
    starts = np.asarray([c[0] for c in chunks], np.int64)
    counts = np.asarray([c[1] for c in chunks], np.int64)
    mask, offsets = direct_targets(starts, counts, box_start, shape, itemsize)
    for i, (start, count) in enumerate(chunks):
        rel = [s - b for s, b in zip(start, box_start)]
        inside = all(r >= 0 and r + n <= m for r, n, m in zip(rel, count, shape))
        if not inside:
            assert not mask[i]
            continue
        view = out[tuple(slice(r, r + n) for r, n in zip(rel, count))]
        assert bool(mask[i]) == view.flags.c_contiguous, (shape, start, count)
        if mask[i]:
            assert offsets[i] == view.__array_interface__["data"][0] - out.__array_interface__["data"][0]


@st.composite
def chunk_runs(draw):
    """Chunks in target order: file index, file offset, size, target offset (gaps and jumps allowed)."""
    n = draw(st.integers(0, 12))
    file, offset, nbytes, target = [], [], [], []
    pos = {0: 0, 1: 0}
    t = 0
    for _ in range(n):
        f = draw(st.integers(0, 1))
        size = draw(st.integers(1, 4))
        pos[f] += draw(st.sampled_from([0, 0, 1, -1]))
        t += draw(st.sampled_from([0, 0, 0, 2]))
        file.append(f)
        offset.append(max(0, pos[f]))
        nbytes.append(size)
        target.append(t)
        pos[f] = offset[-1] + size
        t += size
    return tuple(np.asarray(c, np.int64) for c in (file, offset, nbytes, target))


@settings(max_examples=300, deadline=None)
@given(chunk_runs())
def test_coalesce_cuts_exactly_where_adjacency_breaks(case):
    file, offset, nbytes, target = case
    runs = coalesce(file, offset, nbytes, target)
    assert [i for a, b in runs for i in range(a, b)] == list(range(len(file)))  # a partition, in order

    def follows(i):
        return (file[i] == file[i - 1] and offset[i] == offset[i - 1] + nbytes[i - 1]
                and target[i] == target[i - 1] + nbytes[i - 1])

    for a, b in runs:
        assert all(follows(i) for i in range(a + 1, b))
        assert a == 0 or not follows(a)


def _saved(tmp_path, chunk_bytes=4096):
    """A 64 KiB array saved serially in 16 chunks stored back to back in one file."""
    u = np.arange(64 * 128, dtype=np.float64).reshape(64, 128)
    path = str(tmp_path / "v")
    hpcckpt.save({"u": hpcckpt.Block(u)}, path, comm=COMM, chunk_bytes=chunk_bytes)
    meta = read_metadata(path)
    assert len(meta.variables["u"].chunks) == 16 and len(meta.files) == 1
    return u, path, meta


def test_adjacent_chunks_are_read_in_one_run(tmp_path, monkeypatch):
    u, path, meta = _saved(tmp_path)
    runs = []
    original = ChunkReader._read_run
    monkeypatch.setattr(ChunkReader, "_read_run", lambda self, var, run, dest: (runs.append(run),
                                                                                 original(self, var, run, dest)))
    out = np.empty_like(u)
    with ChunkReader(path, meta) as reader:
        reader.read_into(meta.variables["u"], (0, 0), u.shape, out)
    assert np.array_equal(out, u)
    assert runs == [list(range(16))]
    runs.clear()
    part = np.empty((40, 128))  # chunks cut by the box edges go through the scratch buffer
    with ChunkReader(path, meta) as reader:
        reader.read_into(meta.variables["u"], (10, 0), (50, 128), part, skip={5})
    assert np.array_equal(part[:10], u[10:20]) and np.array_equal(part[14:], u[24:50])  # chunk 5: rows 20..23
    assert runs == [[3, 4], [6, 7, 8, 9, 10, 11]]


@pytest.mark.parametrize("how", ["bitflip", "truncate"])
def test_damage_inside_a_coalesced_run_names_file_and_chunk(tmp_path, how):
    u, path, meta = _saved(tmp_path)
    chunks = meta.variables["u"].chunks
    k = 9  # in the middle of the one run
    data = os.path.join(path, meta.files[0])
    offset = int(chunks.offset[k])
    with open(data, "r+b") as f:
        if how == "bitflip":
            f.seek(offset + 100)
            byte = f.read(1)
            f.seek(offset + 100)
            f.write(bytes([byte[0] ^ 1]))
        else:
            f.truncate(offset + 10)
    expected = "fails its checksum" if how == "bitflip" else "is truncated"
    with pytest.raises(CorruptCheckpointError, match=f"{os.path.basename(data)}.*{expected}") as err:
        hpcckpt.load({"u": hpcckpt.Block(np.empty_like(u))}, path, comm=COMM)
    assert f"offset {offset}" in str(err.value) or f"{offset}..{offset + int(chunks.nbytes[k])}" in str(err.value)


def test_confined_path_with_a_roots_cache_resolves_like_without(tmp_path):
    root = tmp_path / "root"
    for name in ("v1", "v2"):
        (root / name / "data").mkdir(parents=True)
        (root / name / "data" / "f.bin").write_bytes(b"x")
        (root / name / "metadata.json").write_text("{}")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f.bin").write_bytes(b"secret")
    os.symlink(outside, root / "v1" / "escape")
    os.symlink(root / "v2" / "data" / "f.bin", root / "v2" / "data" / "link.bin")  # a link that stays inside
    roots: dict = {}
    for name in ("data/f.bin", "@v1/data/f.bin", "data/link.bin", "@v1/data/missing.bin", "data/f.bin"):
        assert confined_path(str(root / "v2"), name, roots) == confined_path(str(root / "v2"), name)
    assert set(roots) == {None, "v1"}
    with pytest.raises(CorruptCheckpointError, match="outside"):
        confined_path(str(root / "v2"), "@v1/escape/f.bin", roots)
