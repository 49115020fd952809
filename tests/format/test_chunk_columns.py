"""The columnar chunk table of format version 3 (hpcckpt.format.chunk_columns): exact round trips of both forms, and
every damaged block one CorruptCheckpointError naming the variable (never another exception, a huge allocation
or wrong data).

The damaged blocks are built here, column by column, with the layout of docs/format.md section 3.3.1, and sealed
again (tests/support/metadata_tools.py), so that what refuses them is the block's own checks, not the metadata seal.
"""

from __future__ import annotations

import base64
import json
import struct
import zlib

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcckpt import CorruptCheckpointError
from hpcckpt.format import chunk_columns
from hpcckpt.format.chunk_columns import COLUMNAR_MIN_CHUNKS, HexDigests, column_names
from hpcckpt.format.metadata import ChunkTable, Metadata, Variable, parse
from metadata_tools import sealed

ROWS = 6


def table(n: int = ROWS, hashes: bool = False, tagged=()) -> ChunkTable:
    """``n`` chunks of 1 x 4 float64 rows of a (n, 4) array, in files 0 and 1; distinct checksums and hashes."""
    rng = np.random.default_rng(n)
    sums = [format(int(x), "016x") for x in rng.integers(0, 1 << 64, n, dtype=np.uint64, endpoint=False)]
    rows = [(k % 2, 32 * k, 32, sums[k], (k, 0), (1, 4)) for k in range(n)]
    t = ChunkTable.from_rows(rows, 2)
    if hashes:
        t.hash = [("mix128:" if k in tagged else "") + format((k + 1) * 0x9E3779B97F4A7C15, "032x")[-32:]
                  for k in range(n)]
    return t


def metadata(t: ChunkTable) -> Metadata:
    u = Variable("u", "block", np.dtype("<f8"), (len(t), 4), t)
    return Metadata(step=1, files=["data/part-000000.bin", "data/part-000001.bin"], variables={"u": u},
                    values={}, nranks=2, created="2026-12-01T00:00:00+00:00")


def doc_of(meta: Metadata) -> dict:
    doc = json.loads(meta.to_json_bytes())
    del doc["metadata_checksum"]
    return doc


def block(cols: np.ndarray, *, magic=chunk_columns.MAGIC, version=1, ncols=None, nrows=None, digest=None,
          trailing=b"", level=1) -> str:
    """A columnar ``data`` string of the uint64 columns ``cols`` (ncols, rows), header fields overridable."""
    body = np.ascontiguousarray(cols, "<u8").tobytes()
    header = struct.pack("<8sIIQQ", magic, version, cols.shape[0] if ncols is None else ncols,
                         cols.shape[1] if nrows is None else nrows,
                         xxhash.xxh3_64_intdigest(body) if digest is None else digest)
    return base64.b64encode(zlib.compress(header + body, level) + trailing).decode()


def columns_of(t: ChunkTable) -> np.ndarray:
    """The columns as docs/format.md lists them, computed here from the table's strings (not chunk_columns)."""
    cols = [t.file, t.offset, t.nbytes, [int(c, 16) for c in t.checksum], *t.start.T, *t.count.T]
    if t.hash is not None:
        plain = [h.split(":")[-1] for h in t.hash]
        cols += [[int(h[:16], 16) for h in plain], [int(h[16:], 16) for h in plain],
                 [int(h.startswith("mix128:")) for h in t.hash]]
    return np.array([np.asarray(c, dtype=np.uint64) for c in cols], dtype=np.uint64).reshape(len(cols), len(t))


def test_the_writer_switches_form_at_the_threshold():
    small, big = doc_of(metadata(table(COLUMNAR_MIN_CHUNKS - 1))), doc_of(metadata(table(COLUMNAR_MIN_CHUNKS)))
    assert "file" in small["variables"]["u"]["chunks"] and small["format_version"] == 3
    chunks = big["variables"]["u"]["chunks"]
    assert set(chunks) == {"columns", "rows", "data"} and chunks["rows"] == COLUMNAR_MIN_CHUNKS
    assert chunks["columns"] == ["file", "offset", "nbytes", "checksum", "start_0", "start_1", "count_0", "count_1"]


def test_the_threshold_counts_every_chunk_of_the_version():
    """Four variables that reach the threshold together are columnar, each: they would parse as slowly as one."""
    def four_variables(rows: int) -> Metadata:
        meta = metadata(table(rows))
        meta.variables = {name: Variable(name, "block", np.dtype("<f8"), (rows, 4), table(rows)) for name in "abcd"}
        return meta

    below, at = four_variables(COLUMNAR_MIN_CHUNKS // 4 - 1), four_variables(COLUMNAR_MIN_CHUNKS // 4)
    assert all("file" in v["chunks"] for v in doc_of(below)["variables"].values())
    assert all(set(v["chunks"]) == {"columns", "rows", "data"} for v in doc_of(at)["variables"].values())
    assert parse(at.to_json_bytes()).variables["d"].chunks.checksum == at.variables["d"].chunks.checksum


@pytest.mark.parametrize("hashes, tagged", [(False, ()), (True, ()), (True, (1, 4))])
def test_the_block_is_the_documented_layout(table_form, hashes, tagged):
    """Decoded by hand (zlib, struct, numpy): the header and each column hold what the JSON form would."""
    t = table(hashes=hashes, tagged=tagged)
    entry = doc_of(metadata(t))["variables"]["u"]["chunks"]
    if table_form == "json":
        assert entry["checksum"] == t.checksum and entry.get("hash") == t.hash
        return
    assert entry["columns"] == column_names(2, hashes) and entry["rows"] == ROWS
    raw = zlib.decompress(base64.b64decode(entry["data"], validate=True))
    magic, version, ncols, nrows, digest = struct.unpack("<8sIIQQ", raw[:32])
    assert (magic, version, ncols, nrows) == (b"HCKCOLS\0", 1, len(entry["columns"]), ROWS)
    assert digest == xxhash.xxh3_64_intdigest(raw[32:])
    assert np.array_equal(np.frombuffer(raw[32:], "<u8").reshape(ncols, ROWS), columns_of(t))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 40), ndim=st.integers(0, 3), hashes=st.booleans(), data=st.data())
def test_round_trip_is_exact(n, ndim, hashes, data):
    """Any table, encoded and decoded: the same columns, the same strings (hypothesis)."""
    n = 1 if ndim == 0 else n
    ints = st.integers(0, (1 << 62) - 1)
    col = lambda k: np.array(data.draw(st.lists(ints, min_size=k, max_size=k)), np.int64).reshape(k)  # noqa: E731
    start, count = (np.array(data.draw(st.lists(st.lists(ints, min_size=ndim, max_size=ndim), min_size=n,
                                                max_size=n)), np.int64).reshape(n, ndim) for _ in range(2))
    words = st.integers(0, (1 << 64) - 1)
    t = ChunkTable(col(n), col(n), col(n), [format(w, "016x") for w in data.draw(st.lists(words, min_size=n,
                                                                                        max_size=n))], start, count)
    if hashes:
        t.hash = [("mix128:" if data.draw(st.booleans()) else "") + format(w, "032x")
                  for w in data.draw(st.lists(st.integers(0, (1 << 128) - 1), min_size=n, max_size=n))]
    back = chunk_columns.decode(json.loads(json.dumps(chunk_columns.encode(t))), ndim)
    for key in ("file", "offset", "nbytes", "start", "count"):
        assert back[key].dtype == np.int64 and np.array_equal(back[key], getattr(t, key).reshape(back[key].shape))
    assert list(back["checksum"]) == t.checksum and [back["checksum"][k] for k in range(n)] == t.checksum
    assert (back["hash"] is None) == (t.hash is None)
    if hashes:
        assert list(back["hash"]) == t.hash and [back["hash"][k] for k in range(n)] == t.hash


def test_parse_gives_the_same_table_in_both_forms(table_form):
    t = table(hashes=True, tagged=(2,))
    got = parse(metadata(t).to_json_bytes()).variables["u"].chunks
    for key in ("file", "offset", "nbytes", "start", "count"):
        assert np.array_equal(getattr(got, key), getattr(t, key)) and getattr(got, key).dtype == np.int64
    assert got.checksum == t.checksum and got.hash == t.hash and list(got.hash) == t.hash
    assert isinstance(got.checksum, HexDigests) == (table_form == "columnar")
    again = parse(parse(metadata(t).to_json_bytes()).to_json_bytes())  # rewritten (compaction): same bytes
    assert again.to_json_bytes() == metadata(t).to_json_bytes()
    assert list(again.variables["u"].chunks.checksum) == t.checksum


def test_hexdigests_behave_like_the_list_they_stand_for():
    t = table(hashes=True, tagged=(0, 5))
    h = HexDigests.from_strings(t.hash, 2, tagged=True)
    assert len(h) == ROWS and h[5] == t.hash[5] and h[-1] == t.hash[-1] and h[1:3] == t.hash[1:3]
    assert h == t.hash and list(h) == t.hash and h != t.hash[:-1] and t.hash[0].startswith("mix128:")
    with pytest.raises(IndexError):
        h[ROWS]


def _with_chunks(edit) -> bytes:
    """The sealed metadata of :func:`table` in the columnar form, its chunk entry changed by ``edit``."""
    doc = doc_of(metadata(table()))
    t = table()
    doc["variables"]["u"]["chunks"] = {"columns": column_names(2, False), "rows": ROWS, "data": block(columns_of(t))}
    entry = doc["variables"]["u"]["chunks"]
    out = edit(entry, columns_of(t))
    if out is not None:
        doc["variables"]["u"]["chunks"] = out
    return sealed(doc)


def _set_data(**kw):
    return lambda e, cols: e.update(data=block(cols, **kw))


def _cols(change):
    def edit(e, cols):
        change(cols)
        e["data"] = block(cols)
    return edit


DAMAGED = {
    "the crafted block is fine": (lambda e, cols: None, None),
    "an unknown key": (lambda e, cols: e.update(codec="zlib"), "exactly the keys"),
    "a key missing": (lambda e, cols: e.pop("rows") and None, "exactly the keys"),
    "JSON and columnar keys mixed": (lambda e, cols: e.update(file=[0] * ROWS), "exactly the keys"),
    "columns reordered": (lambda e, cols: e.update(columns=column_names(2, False)[::-1]), "the columns must be"),
    "a column missing": (lambda e, cols: e.update(columns=column_names(2, False)[:-1]), "the columns must be"),
    "columns for another ndim": (lambda e, cols: e.update(columns=column_names(3, False)), "the columns must be"),
    "columns not a list": (lambda e, cols: e.update(columns="file,offset"), "the columns must be"),
    "rows negative": (lambda e, cols: e.update(rows=-1), "rows must be"),
    "rows a string": (lambda e, cols: e.update(rows="6"), "rows must be"),
    "rows a bool": (lambda e, cols: e.update(rows=True), "rows must be"),
    "rows more than the block": (lambda e, cols: e.update(rows=ROWS + 1), "inflates to"),
    "rows fewer than the block": (lambda e, cols: e.update(rows=ROWS - 1), "inflates to"),
    "rows absurd (no allocation)": (lambda e, cols: e.update(rows=1 << 60), "would be"),
    "data not a string": (lambda e, cols: e.update(data=[1, 2]), "ASCII base64"),
    "data not ASCII": (lambda e, cols: e.update(data="\u00e9" + e["data"]), "ASCII base64"),
    "base64 with a bad character": (lambda e, cols: e.update(data="*" + e["data"][1:]), "not valid base64"),
    "base64 with a newline": (lambda e, cols: e.update(data=e["data"][:8] + "\n" + e["data"][8:]), "not valid base64"),
    "base64 cut (bad padding)": (lambda e, cols: e.update(data=e["data"][:-1]), "not valid base64"),
    "base64 cut at a quantum": (lambda e, cols: e.update(data=e["data"][:-8]), "inflates to|zlib"),
    "base64 without padding": (lambda e, cols: e.update(data=e["data"].rstrip("=")) if e["data"].endswith("=")
                               else e.update(data=e["data"][:-1]), "not valid base64"),
    "not a zlib stream": (lambda e, cols: e.update(data=base64.b64encode(b"x" * 64).decode()), "zlib"),
    "raw deflate without the zlib header": (lambda e, cols: e.update(
        data=base64.b64encode(base64.b64decode(e["data"])[2:-4]).decode()), "zlib"),
    "a flipped byte in the stream": (lambda e, cols: e.update(data=base64.b64encode(
        bytes(b ^ (0x10 if i == 20 else 0) for i, b in enumerate(base64.b64decode(e["data"])))).decode()),
        "zlib|checksum|inflates"),
    "trailing bytes after the stream": (_set_data(trailing=b"\0"), "trailing"),
    "two streams back to back": (lambda e, cols: e.update(data=base64.b64encode(
        base64.b64decode(e["data"]) * 2).decode()), "trailing"),
    "wrong magic": (_set_data(magic=b"HCKCOLS1"), "does not start with"),
    "block version 2": (_set_data(version=2), "block version 2"),
    "header column count wrong": (lambda e, cols: e.update(columns=column_names(2, False), rows=ROWS,
                                                           data=block(cols, ncols=7)), "header says"),
    "header row count wrong": (_set_data(nrows=ROWS + 1), "header says"),
    "body hash wrong": (_set_data(digest=12345), "fails its checksum"),
    "offset of 2^62": (_cols(lambda c: c.__setitem__((1, 2), 1 << 62)), "outside"),
    "start of 2^64 - 1 (-1 as int64)": (_cols(lambda c: c.__setitem__((4, 0), (1 << 64) - 1)), "outside"),
    "count of 2^63": (_cols(lambda c: c.__setitem__((7, 5), 1 << 63)), "outside"),
    "a file not listed": (_cols(lambda c: c.__setitem__((0, 3), 2)), "not listed"),
    "a chunk outside the shape": (_cols(lambda c: c.__setitem__((4, 5), 6)), "outside its global shape"),
    "a length that does not match": (_cols(lambda c: c.__setitem__((2, 1), 31)), "does not match its extent"),
    "chunks cover too little": (_cols(lambda c: (c.__setitem__((6, 0), 0), c.__setitem__((2, 0), 0))), "cover"),
}


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_a_damaged_block_is_one_corrupt_error(case):
    edit, message = DAMAGED[case]
    raw = _with_chunks(edit)
    if message is None:
        assert list(parse(raw).variables["u"].chunks.checksum) == table().checksum
        return
    with pytest.raises(CorruptCheckpointError, match=message) as info:
        parse(raw, source="meta.json")
    assert "meta.json" in str(info.value) and "'u'" in str(info.value)


def test_hash_columns_are_checked():
    t = table(hashes=True)
    doc = doc_of(metadata(t))
    cols = columns_of(t)
    cols[-1, 2] = 2
    doc["variables"]["u"]["chunks"] = {"columns": column_names(2, True), "rows": ROWS, "data": block(cols)}
    with pytest.raises(CorruptCheckpointError, match="hash_kind must be 0 or 1"):
        parse(sealed(doc))
    doc["variables"]["u"]["chunks"]["columns"] = column_names(2, False) + ["hash_hi", "hash_lo"]
    with pytest.raises(CorruptCheckpointError, match="the columns must be"):
        parse(sealed(doc))


@pytest.mark.parametrize("version", [1, 2])
def test_a_columnar_table_needs_format_version_3(version):
    doc = doc_of(metadata(table()))
    doc["format_version"] = version
    doc["variables"]["u"]["chunks"] = chunk_columns.encode(table())
    raw = sealed(doc) if version == 2 else json.dumps(doc).encode()
    with pytest.raises(CorruptCheckpointError, match="needs format version 3"):
        parse(raw)


def test_a_zip_bomb_is_refused_before_it_is_inflated():
    """A tiny stream that would inflate to 1 GiB + 1: refused from its announced size, nothing allocated."""
    doc = doc_of(metadata(table()))
    rows = (chunk_columns.MAX_BLOCK_BYTES - 32) // 64 + 1
    doc["variables"]["u"]["chunks"] = {"columns": column_names(2, False), "rows": rows,
                                       "data": base64.b64encode(zlib.compress(b"\0" * (1 << 20))).decode()}
    with pytest.raises(CorruptCheckpointError, match="would be"):
        parse(sealed(doc))
    doc["variables"]["u"]["chunks"]["rows"] = 1000  # announced small, inflates to more: stopped at the size
    with pytest.raises(CorruptCheckpointError, match="inflates to"):
        parse(sealed(doc))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_fuzz_the_decoded_block(data):
    """Any change to the block's bytes (the body hash fixed up, so the checks behind it are reached) gives the
    same table or a CorruptCheckpointError, nothing else."""
    t = table()
    raw = bytearray(struct.pack("<8sIIQQ", chunk_columns.MAGIC, 1, 8, ROWS, 0) + columns_of(t).astype("<u8").tobytes())
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        raw[pos] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        raw[24:32] = struct.pack("<Q", xxhash.xxh3_64_intdigest(bytes(raw[32:])))
    doc = doc_of(metadata(t))
    doc["variables"]["u"]["chunks"] = {"columns": column_names(2, False), "rows": ROWS,
                                       "data": base64.b64encode(zlib.compress(bytes(raw), 1)).decode()}
    try:
        got = parse(sealed(doc)).variables["u"].chunks
    except CorruptCheckpointError:
        return
    assert np.all(got.file < 2) and np.all((got.start >= 0) & (got.count >= 0))
    assert int(np.prod(got.count, axis=1).sum()) == ROWS * 4


def test_the_blocks_of_one_file_are_bounded_together(monkeypatch):
    """Each block within its own bound, but together over MAX_TOTAL_BYTES (lowered here to 1.5 blocks): the
    metadata.json is refused from the tables' claims, before any block is inflated (the first one's data is
    not even base64 here)."""
    doc = doc_of(metadata(table()))
    doc["variables"]["u"]["chunks"] = chunk_columns.encode(table())
    doc["variables"]["w"] = {**doc["variables"]["u"], "chunks": chunk_columns.encode(table())}
    one = chunk_columns.decoded_size(doc["variables"]["u"]["chunks"], 2)
    assert len(parse(sealed(doc)).variables) == 2
    monkeypatch.setattr(chunk_columns, "MAX_TOTAL_BYTES", one * 3 // 2)
    doc["variables"]["u"]["chunks"]["data"] = "not base64!"
    with pytest.raises(CorruptCheckpointError, match=rf"would decode to {2 * one} bytes together, more than "
                                                     rf"{one * 3 // 2}"):
        parse(sealed(doc))
