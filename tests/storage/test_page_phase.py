"""Chunks stored at their memory's page phase, and reads at a short copy distance: same bytes, same checks."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hpcckpt
from hpcckpt.core.checksum import PIECE
from hpcckpt.errors import CorruptCheckpointError
from hpcckpt.mpi.collective import SerialComm
from hpcckpt.storage import posix
from hpcckpt.storage.metadata_file import read_metadata

COMM = SerialComm()
PAGE = 4096
NBYTES = 3 * posix._READ_STEP + 4 * PIECE  # several read steps, over the size chunks are placed from


def at_phase(nbytes: int, phase: int) -> np.ndarray:
    """A uint8 array of ``nbytes`` whose first byte lies ``phase`` bytes into a page."""
    room = np.zeros(nbytes + 2 * PAGE, np.uint8)
    lead = (phase - room.ctypes.data) % PAGE
    return room[lead:lead + nbytes]


def pattern(nbytes: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 1 << 40), st.integers(0, PAGE - 1), st.integers(1, 3 * PIECE))
def test_phase_gap_puts_the_chunk_at_its_memory_phase(position, phase, nbytes):
    buffer = at_phase(nbytes, phase)
    gap = posix.phase_gap(position, buffer)
    if nbytes < posix._PHASED_MIN:
        assert gap == 0
    else:
        assert 0 <= gap < PAGE and (position + gap) % PAGE == phase


def test_phase_gap_of_a_read_only_buffer():
    buffer = at_phase(NBYTES, 16)
    buffer.flags.writeable = False
    assert posix.phase_gap(0, buffer) == 16 and posix.phase_gap(PAGE + 20, buffer) == PAGE - 4


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 5 * PIECE), st.integers(1, PIECE))
def test_write_steps_cut_the_buffer_in_order_at_the_given_first_length(total, first):
    steps = posix._steps(total, first)
    edges = [0] + [hi for _, hi in steps]
    assert [lo for lo, _ in steps] == edges[:-1] and edges[-1] == total
    assert all(0 < hi - lo <= PIECE for lo, hi in steps)
    assert all((hi - first) % PIECE == 0 for _, hi in steps[:-1])


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 1 << 40), st.integers(0, 3 * (1 << 20)), st.integers(0, 9 * (1 << 20)))
def test_read_steps_cover_the_range_in_order_ramp_up_and_start_on_the_files_pages(offset, start, length):
    stop = start + length
    steps = list(posix._read_steps(offset, start, stop))
    edges = [start] + [b for _, b in steps]
    assert [a for a, _ in steps] == edges[:-1] and edges[-1] == stop and all(a < b for a, b in steps)
    assert all((offset + a) % PAGE == 0 for a, _ in steps[1:])
    sizes = [b - a for a, b in steps]
    assert not sizes or sizes[0] <= posix._FIRST_READ_STEP
    assert all(n <= min(posix._FIRST_READ_STEP << k, posix._READ_STEP) for k, n in enumerate(sizes))
    full = sizes[1:-1]  # every step but the first and the last is as long as the ramp allows
    assert all(n == min(posix._FIRST_READ_STEP << (k + 1), posix._READ_STEP) for k, n in enumerate(full))


def test_reads_after_the_first_start_on_the_files_pages_and_fill_every_byte(tmp_path, monkeypatch):
    data = pattern(NBYTES + 5000)
    path = tmp_path / "f"
    data.tofile(path)
    offsets = []
    real = os.preadv

    def spy(fd, buffers, offset, *rest):
        offsets.append(offset)
        return real(fd, buffers, offset, *rest)

    from hpcckpt.core.checksum import hexdigest, new_hasher
    hasher = new_hasher()
    out = at_phase(NBYTES, 16)
    fd = os.open(path, os.O_RDONLY)
    try:
        monkeypatch.setattr(os, "preadv", spy)
        posix.read_segments(fd, 5000, out, "f", [(NBYTES, hasher)])
    finally:
        os.close(fd)
    assert np.array_equal(out, data[5000:])
    assert len(offsets) > 3 and all(o % PAGE == 0 for o in offsets[1:])
    expected = new_hasher()
    expected.update(data[5000:].tobytes())
    assert hexdigest(hasher) == hexdigest(expected)


@pytest.mark.parametrize("position", [0, 16, 2048, PIECE - 16])
def test_write_all_from_a_position_inside_a_page_writes_and_hashes_every_byte(tmp_path, position):
    from hpcckpt.core.checksum import hexdigest, new_hasher

    data = pattern(NBYTES + 123)
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        os.write(fd, bytes(position))
        hasher = new_hasher()
        assert posix.write_all(fd, data, hasher) == data.nbytes
        got = np.empty_like(data)
        posix.read_exact(fd, position, got, "f", expected := new_hasher())
    finally:
        os.close(fd)
    assert np.array_equal(got, data) and hexdigest(hasher) == hexdigest(expected)


def save_at(path, phase: int, seed: int = 0) -> np.ndarray:
    """Save one array of NBYTES whose memory starts ``phase`` bytes into a page; return it."""
    data = at_phase(NBYTES, phase)
    data[...] = pattern(NBYTES, seed)
    hpcckpt.save({"small": hpcckpt.Block(np.arange(7.0)), "u": hpcckpt.Block(data)}, path, comm=COMM)
    return data


@pytest.mark.parametrize("phase", [0, 16, 2064])
def test_a_saved_chunk_starts_at_its_memory_page_phase_and_loads_exactly(tmp_path, phase):
    path = str(tmp_path / "v")
    data = save_at(path, phase)
    chunks = read_metadata(path).variables["u"].chunks
    assert len(chunks) == 1 and int(chunks.offset[0]) % PAGE == phase
    out = at_phase(NBYTES, phase)
    hpcckpt.load({"small": hpcckpt.Block(np.empty(7)), "u": hpcckpt.Block(out)}, path, comm=COMM)
    assert np.array_equal(out, data)


def flip_byte(path: str, at: int) -> None:
    meta = read_metadata(path)
    chunks = meta.variables["u"].chunks
    with open(os.path.join(path, meta.files[int(chunks.file[0])]), "r+b") as f:
        f.seek(int(chunks.offset[0]) + at)
        byte = f.read(1)
        f.seek(int(chunks.offset[0]) + at)
        f.write(bytes([byte[0] ^ 0x40]))


@pytest.mark.parametrize("at", [0, posix._READ_STEP - 1, 2 * posix._READ_STEP + 5, NBYTES - 1])
@pytest.mark.parametrize("gaps", [True, False])
@pytest.mark.parametrize("distance", [0, 16, 40, PAGE - 16])
def test_a_flipped_byte_is_refused_on_every_read_path(tmp_path, monkeypatch, at, gaps, distance):
    """The target lies ``distance`` bytes past the chunk's file offset modulo the page: 0 (phases agree,
    read as it is), 16 and 40 (short: read further on and moved back), PAGE - 16 (far: read as it is);
    ``gaps=False`` writes the layout without gaps (chunks back to back from offset 0)."""
    if not gaps:
        monkeypatch.setattr(posix, "_PHASED_MIN", 1 << 62)
    path = str(tmp_path / "v")
    data = save_at(path, 16)
    stored = int(read_metadata(path).variables["u"].chunks.offset[0])
    assert (stored % PAGE == 16) == gaps
    out = at_phase(NBYTES, (stored + distance) % PAGE)
    moves = []
    real_memmove = posix._memmove
    monkeypatch.setattr(posix, "_memmove", lambda view: (moves.append(len(view)), real_memmove(view))[1])
    hpcckpt.load({"small": hpcckpt.Block(np.empty(7)), "u": hpcckpt.Block(out)}, path, comm=COMM)
    assert np.array_equal(out, data)
    assert (NBYTES in moves) == (0 < distance < 64)  # the short distances take the read-further-on path
    flip_byte(path, at)
    with pytest.raises(CorruptCheckpointError, match="fails its checksum"):
        hpcckpt.load({"small": hpcckpt.Block(np.empty(7)), "u": hpcckpt.Block(out)}, path, comm=COMM)
