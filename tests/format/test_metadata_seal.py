"""The metadata checksum (seal): no byte of a committed metadata.json can change unnoticed.

Without a seal, random bit flips in metadata.json can silently change what
a restore returns; these tests flip every byte position and cut the file at every
length, and require a CorruptCheckpointError each time, then check the read paths
(open, load, Checkpointer.restore) treat a damaged metadata file like damaged data.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

import hpcckpt
from hpcckpt import CheckpointError, CorruptCheckpointError
from hpcckpt.format.metadata import SEAL_LENGTH, SEAL_PREFIX, parse
from hpcckpt.core.names import METADATA_FILE
from metadata_tools import columnar, json_columns, read_doc, sealed


def small_state(k: int = 0):
    u = np.arange(12.0).reshape(3, 4) + k
    parts = np.zeros(3, [("x", "<f4"), ("id", "<i8")])
    parts["id"] = [5, 6, 7]
    return {"u": hpcckpt.Block(u, offset=(0, 0), global_shape=u.shape), "parts": hpcckpt.Ragged(parts),
            "step": 3 + k, "dt": 0.5, "name": "run", "rng": np.arange(4, dtype="<u8")}


@pytest.fixture
def version(tmp_path, table_form):
    """A small version, its chunk tables in each form (the seal covers a columnar block like any other byte)."""
    path = str(tmp_path / "v")
    hpcckpt.save(small_state(), path, chunk_bytes=32, step=3)
    with open(os.path.join(path, METADATA_FILE), "rb") as f:
        return path, f.read()


def test_the_writer_seals_the_metadata(version):
    _, raw = version
    assert raw.startswith(SEAL_PREFIX) and raw[SEAL_LENGTH - 2:SEAL_LENGTH] == b'",'
    assert parse(raw).step == 3


@pytest.mark.parametrize("mask", [0x01, 0x20, 0x80, 0xFF])
def test_every_flipped_byte_is_refused(version, mask):
    _, raw = version
    silent = []
    for i in range(len(raw)):
        bad = bytearray(raw)
        bad[i] ^= mask
        try:
            parse(bytes(bad), source="m")
        except CorruptCheckpointError:
            continue
        silent.append(i)
    assert silent == [], f"{len(silent)} of {len(raw)} flips with mask {mask:#x} were accepted"


def test_every_truncation_is_refused(version):
    _, raw = version
    accepted = []
    for n in range(len(raw)):
        try:
            parse(raw[:n])
        except CorruptCheckpointError:
            continue
        accepted.append(n)
    assert accepted == []


def test_valid_json_edits_are_refused(version):
    """What the adversarial reader did: edits that leave valid JSON and passed `hpcckpt verify`."""
    path, raw = version
    chunks = read_doc(path)["variables"]["u"]["chunks"]
    if "data" in chunks:  # columnar: a different base64 character in the block
        data = chunks["data"].encode()
        swapped = raw.replace(data, data[:10] + (b"A" if data[10:11] != b"A" else b"B") + data[11:])
    else:  # JSON: two chunks' starts exchanged
        starts = chunks["start"]
        assert len(starts) >= 4 and starts[0:2] != starts[2:4]
        text = ",".join(map(str, starts)).encode()
        swapped = raw.replace(text, ",".join(map(str, starts[2:4] + starts[0:2] + starts[4:])).encode())
    edits = [swapped,
             raw.replace(b'"<f8"', b'"<i8"'),  # the dtype
             raw.replace(b'"name":"run"', b'"name":"rum"'),  # a value
             raw.replace(b'"u":{', b'"v":{'),  # a variable renamed
             raw[:SEAL_LENGTH] + raw[SEAL_LENGTH:].replace(b'"format_version":3', b'"format_version":2'),
             raw.replace(SEAL_PREFIX, b'{"metadata_checksun":"')]  # the seal's key itself
    for bad in edits:
        assert bad != raw
        with pytest.raises(CorruptCheckpointError, match="checksum|seal"):
            parse(bad)


def test_an_unsealed_version_2_document_is_refused(version):
    path, raw = version
    unsealed = b"{" + raw[SEAL_LENGTH:]
    with pytest.raises(CorruptCheckpointError, match="must start with its checksum"):
        parse(unsealed)
    assert parse(sealed(unsealed)).step == 3  # the same document, sealed again, is fine


def test_duplicate_keys_are_refused(version):
    _, raw = version
    doubled = raw.replace(b'"step":3,', b'"step":3,"step":4,', 1)
    with pytest.raises(CorruptCheckpointError, match="appears twice"):
        parse(sealed(doubled))


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(step=-1), "step"),
    (lambda d: d.update(step=1 << 63), "step"),
    (lambda d: d["variables"]["u"].update(dtype="=f8"), "byte order"),
    (lambda d: d["variables"]["u"].update(dtype="f8"), "byte order"),
    (lambda d: d["variables"]["u"].update(dtype="|f8"), "byte order"),
    (lambda d: d["variables"]["u"].update(scale=2), "unknown keys"),
    (lambda d: d["variables"]["u"]["chunks"].update(stride=[1]), "unknown columns|exactly the keys"),
])
def test_rules_behind_the_seal(version, edit, message):
    path, _ = version
    doc = read_doc(path)
    edit(doc)
    with pytest.raises(CorruptCheckpointError, match=message):
        parse(sealed(doc))


def test_start_plus_count_overflow_is_refused(version):
    """start + count wrapped around int64 and passed the bounds check."""
    path, _ = version
    doc = read_doc(path)
    stored = doc["variables"]["u"]["chunks"]
    chunks = json_columns(stored, 2)
    chunks["start"][0] = (1 << 62) - 1
    chunks["count"][0] = (1 << 62) - 1
    doc["variables"]["u"]["chunks"] = columnar(chunks, 2) if "data" in stored else chunks
    with pytest.raises(CorruptCheckpointError, match="outside"):
        parse(sealed(doc))


def test_open_and_load_name_the_damaged_metadata(version):
    path, raw = version
    bad = bytearray(raw)
    bad[len(raw) // 2] ^= 0x04
    with open(os.path.join(path, METADATA_FILE), "wb") as f:
        f.write(bad)
    for read in (lambda: hpcckpt.open(path), lambda: hpcckpt.load(small_state(), path)):
        with pytest.raises(CorruptCheckpointError, match=r"metadata\.json.*checksum"):
            read()


def test_restore_falls_back_past_a_damaged_metadata_file(tmp_path):
    root = str(tmp_path / "root")
    ck = hpcckpt.Checkpointer(root, track_failures=False)
    ck.save(small_state(0), step=1)
    ck.save(small_state(1), step=2)
    newest = os.path.join(root, "step-000000000002", METADATA_FILE)
    with open(newest, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0x01]))
    target = small_state(5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = ck.restore(target)
    assert out["step"] == 3 and np.array_equal(target["u"].local, np.arange(12.0).reshape(3, 4))
    assert any("step-000000000002" in str(w.message) and "checksum" in str(w.message) for w in caught)
    ck.close()


@pytest.mark.timeout(30)
def test_metadata_that_is_a_fifo_or_a_device_is_refused_without_blocking(version):
    path, _ = version
    meta = os.path.join(path, METADATA_FILE)
    os.remove(meta)
    os.mkfifo(meta)
    with pytest.raises(CorruptCheckpointError, match="FIFO"):
        hpcckpt.open(path)
    os.remove(meta)
    os.symlink("/dev/zero", meta)
    with pytest.raises(CorruptCheckpointError, match="character device"):
        hpcckpt.open(path)


def test_metadata_reads_are_bounded_by_bytes_read(version, monkeypatch):
    path, raw = version
    import hpcckpt.storage.metadata_file

    monkeypatch.setattr(hpcckpt.storage.metadata_file, "MAX_METADATA_BYTES", len(raw) - 1)
    with pytest.raises(CorruptCheckpointError, match="longer than"):
        hpcckpt.open(path)
    monkeypatch.setattr(hpcckpt.storage.metadata_file, "MAX_METADATA_BYTES", len(raw))
    assert hpcckpt.open(path).step == 3


def test_a_missing_checkpoint_is_a_plain_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError, match="no committed checkpoint") as info:
        hpcckpt.open(tmp_path / "nothing")
    assert not isinstance(info.value, CorruptCheckpointError)


def test_deeply_nested_extra_is_refused(version):
    """Nested 900 deep, ``extra`` parsed but then broke the broadcast of the parsed metadata (pickle recursion)."""
    path, _ = version
    doc = read_doc(path)
    deep: list = []
    for _ in range(900):
        deep = [deep]
    doc["extra"]["deep"] = deep
    with pytest.raises(CorruptCheckpointError, match="extra"):
        parse(sealed(doc))
    doc["extra"]["deep"] = [[[{"a": [1]}]]]
    assert parse(sealed(doc)).extra["deep"] == [[[{"a": [1]}]]]


def test_reading_metadata_allocates_about_its_size(version):
    """os.read allocates what it is asked for: asking for the 256 MiB limit cost 256 MiB per metadata read."""
    import tracemalloc

    path, raw = version
    tracemalloc.start()
    try:
        hpcckpt.open(path).close()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak


@pytest.mark.parametrize("edit", [lambda d: d["variables"]["u"].update(shape=[1 << 70, 0]),
                                  lambda d: d.update(nranks=1 << 64)])
def test_integers_beyond_the_documented_range_are_refused(version, edit):
    """docs/format.md: every integer of the metadata outside values lies in [0, 2^62) (int64 readers)."""
    path, _ = version
    doc = read_doc(path)
    edit(doc)
    with pytest.raises(CorruptCheckpointError, match="shape|nranks"):
        parse(sealed(doc))
