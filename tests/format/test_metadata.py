"""The on-disk index (hpcckpt.format.metadata): round trips, and untrusted input that must only ever give
CorruptCheckpointError (never another exception, a hang or a huge allocation)."""

from __future__ import annotations

import copy
import json
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcckpt import CheckpointError, CorruptCheckpointError
from hpcckpt.format.metadata import FORMAT_VERSION, ChunkTable, Metadata, Variable, check_relative_path, parse
from metadata_tools import columnar, sealed

STRUCT = np.dtype([("id", "<i8"), ("pos", "<f4", (3,)), ("flag", "?")])


def valid_metadata() -> Metadata:
    u = Variable("u", "block", np.dtype("<f8"), (4, 6), ChunkTable.from_rows([
        (0, 0, 8 * 12, "0123456789abcdef", (0, 0), (2, 6)),
        (1, 0, 8 * 12, "fedcba9876543210", (2, 0), (2, 6)),
    ], 2))
    p = Variable("p", "ragged", STRUCT, (3,), ChunkTable.from_rows([
        (0, 96, 3 * STRUCT.itemsize, "00000000000000ff", (0,), (3,)),
    ], 1))
    s = Variable("s", "block", np.dtype(">i2"), (), ChunkTable.from_rows([(1, 96, 2, "0000000000000001", (), ())], 0))
    e = Variable("e", "block", np.dtype("<c16"), (0, 5), ChunkTable.empty(2))
    return Metadata(step=7, files=["data/part-000000.bin", "data/part-000001.bin"],
                    variables={"u": u, "p": p, "s": s, "e": e},
                    values={"step": 7, "t": {"$hpcckpt": "float", "value": "nan"}}, nranks=2,
                    created="2024-01-01T00:00:00+00:00", extra={"strategy": "file-per-rank"})


def valid_doc(form: str = "json") -> dict:
    """valid_metadata() as a document, its chunk tables in the JSON-arrays or the columnar form."""
    doc = json.loads(valid_metadata().to_json_bytes())
    del doc["metadata_checksum"]
    if form == "columnar":
        for var in doc["variables"].values():
            var["chunks"] = columnar(var["chunks"], len(var["shape"]))
    return doc


def corrupt(doc) -> bytes:
    """The bytes of a crafted document, sealed (when it is an object, as only objects can be): what refuses
    it is the validation, not the seal."""
    return sealed(doc) if isinstance(doc, dict) else json.dumps(doc).encode()


def test_round_trip(table_form):
    meta = valid_metadata()
    back = parse(meta.to_json_bytes())
    assert back.step == 7 and back.nranks == 2 and back.files == meta.files
    assert back.values == meta.values and back.extra == meta.extra and back.created == meta.created
    assert set(back.variables) == {"u", "p", "s", "e"}
    for name, var in meta.variables.items():
        got = back.variables[name]
        assert (got.kind, got.dtype, got.shape, got.codec) == (var.kind, var.dtype, var.shape, var.codec)
        for col in ("file", "offset", "nbytes", "start", "count"):
            assert np.array_equal(getattr(got.chunks, col), getattr(var.chunks, col))
            assert getattr(got.chunks, col).dtype == np.int64
        assert got.chunks.checksum == var.chunks.checksum
    assert back.variables["u"].nbytes == 4 * 6 * 8 and back.variables["u"].stored_bytes == 192
    assert back.variables["s"].dtype == np.dtype(">i2") and back.variables["s"].dtype.byteorder == ">"
    assert back.variables["p"].dtype == STRUCT
    assert back.to_json_bytes() == meta.to_json_bytes()  # serialisation is a fixed point


def _set(path, value):
    def apply(doc):
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        return doc
    return apply


def _delete(path):
    def apply(doc):
        target = doc
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]
        return doc
    return apply


U = ("variables", "u")
UC = ("variables", "u", "chunks")
MALFORMED = {
    "top level list": lambda d: [d],
    "top level string": lambda d: "hpcckpt",
    "wrong format name": _set(("format",), "zarr"),
    "unknown format version": _set(("format_version",), FORMAT_VERSION + 1),
    "format version string": _set(("format_version",), "1"),
    "format version bool": _set(("format_version",), True),
    "missing format version": _delete(("format_version",)),
    "unknown checksum algorithm": _set(("checksum",), "md5"),
    "step string": _set(("step",), "7"),
    "step float": _set(("step",), 7.0),
    "files not a list": _set(("files",), "data/part-000000.bin"),
    "missing files": _delete(("files",)),
    "path traversal": _set(("files", 0), "../x"),
    "deep traversal": _set(("files", 0), "../../etc/passwd"),
    "traversal in middle": _set(("files", 0), "data/../../x"),
    "absolute path": _set(("files", 0), "/etc/passwd"),
    "dot component": _set(("files", 0), "./data/part-000000.bin"),
    "empty file name": _set(("files", 0), ""),
    "nul in file name": _set(("files", 0), "data/a\x00b"),
    "backslash in file name": _set(("files", 0), "..\\x"),
    "file name number": _set(("files", 0), 3),
    "double slash": _set(("files", 0), "data//part"),
    "nranks zero": _set(("nranks",), 0),
    "nranks negative": _set(("nranks",), -3),
    "nranks string": _set(("nranks",), "2"),
    "created number": _set(("created",), 12),
    "values list": _set(("values",), [1, 2]),
    "extra list": _set(("extra",), []),
    "variables list": _set(("variables",), []),
    "variable not object": _set(U, 5),
    "unknown kind": _set(U + ("kind",), "sparse"),
    "missing kind": _delete(U + ("kind",)),
    "object dtype": _set(U + ("dtype",), "|O"),
    "object field": _set(U + ("dtype",), [["a", "|O"]]),
    "junk dtype": _set(U + ("dtype",), "not a dtype"),
    "dtype number": _set(U + ("dtype",), 8),
    "dtype dict": _set(U + ("dtype",), {"descr": "<f8"}),
    "huge itemsize": _set(U + ("dtype",), "|V99999999999"),
    "field shape huge": _set(U + ("dtype",), [["a", "<f8", [1 << 30]]]),
    "field shape negative": _set(U + ("dtype",), [["a", "<f8", [-1]]]),
    "shape negative": _set(U + ("shape",), [-4, 6]),
    "shape float": _set(U + ("shape",), [4.0, 6]),
    "shape string": _set(U + ("shape",), "4,6"),
    "shape huge": _set(U + ("shape",), [1 << 40, 1 << 40]),
    "shape too many dims": _set(U + ("shape",), [1] * 40),
    "shape bool": _set(U + ("shape",), [True, 6]),
    "ragged 0-d": lambda d: _set(("variables", "s", "kind"), "ragged")(d),
    "unknown codec": _set(U + ("codec",), {"id": "pickle"}),
    "codec string": _set(U + ("codec",), "none"),
    "chunks list": _set(UC, []),
    "missing chunk column": _delete(UC + ("checksum",)),
    "chunk outside shape": _set(UC + ("start",), [0, 0, 3, 0]),
    "chunk count mismatch": _set(UC + ("count",), [2, 6, 2, 5]),
    "length mismatch": _set(UC + ("nbytes",), [96, 95]),
    "column length mismatch": _set(UC + ("offset",), [0]),
    "start length mismatch": _set(UC + ("start",), [0, 0, 2]),
    "negative offset": _set(UC + ("offset",), [0, -8]),
    "negative start": _set(UC + ("start",), [0, 0, -2, 0]),
    "negative count": _set(UC + ("count",), [2, 6, -2, -6]),
    "huge offset": _set(UC + ("offset",), [0, 1 << 70]),
    "huge unsigned": _set(UC + ("offset",), [0, (1 << 64) - 1]),
    "float offsets": _set(UC + ("offset",), [0.0, 1.5]),
    "string offsets": _set(UC + ("offset",), ["0", "0"]),
    "nested offsets": _set(UC + ("offset",), [[0], [0]]),
    "bool offsets": _set(UC + ("offset",), [False, True]),
    "file index out of range": _set(UC + ("file",), [0, 2]),
    "file index negative": _set(UC + ("file",), [0, -1]),
    "checksum short": _set(UC + ("checksum",), ["0123", "fedcba9876543210"]),
    "checksum not hex": _set(UC + ("checksum",), ["0123456789abcdeg", "fedcba9876543210"]),
    "checksum number": _set(UC + ("checksum",), [1, 2]),
    "checksum none": _set(UC + ("checksum",), [None, "fedcba9876543210"]),
    "checksum 0x prefix": _set(UC + ("checksum",), ["0x23456789abcdef", "fedcba9876543210"]),
    "checksum sign": _set(UC + ("checksum",), ["+123456789abcdef", "fedcba9876543210"]),
    "checksum underscore": _set(UC + ("checksum",), ["0123_56789abcdef", "fedcba9876543210"]),
    "checksum upper case": _set(UC + ("checksum",), ["0123456789ABCDEF", "fedcba9876543210"]),
    "checksum non-ascii digits": _set(UC + ("checksum",), ["\u0661" * 16, "fedcba9876543210"]),
    "checksum lengths that add up": _set(UC + ("checksum",), ["0123456789abcde", "fedcba98765432100"]),
    "hash short": _set(UC + ("hash",), ["0" * 31, "f" * 32]),
    "hash lengths that add up": _set(UC + ("hash",), ["0" * 31, "f" * 33]),
    "hash upper case": _set(UC + ("hash",), ["A" * 32, "f" * 32]),
    "hash number": _set(UC + ("hash",), [1, "f" * 32]),
    "chunks cover too little": lambda d: _set(UC, {k: v[:len(v) // 2] for k, v in d["variables"]["u"]["chunks"].items()})(d),
    "name both value and variable": _set(("values", "u"), 1),
    "empty variable name": lambda d: d["variables"].update({"": d["variables"]["u"]}) or d,
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_metadata_is_corrupt(case):
    doc = MALFORMED[case](valid_doc())
    with pytest.raises(CorruptCheckpointError):
        parse(corrupt(doc), source="meta.json")


@pytest.mark.parametrize("raw", [b"", b"{", b"\xff\xfe\x00", b"null", b"[]", b"1e999999", b"NaN", b'{"a": NaN}',
                                 b'{"a": Infinity}', b"[" * 100000 + b"]" * 100000, b'"\\ud800"'])
def test_not_json_is_corrupt(raw):
    with pytest.raises(CorruptCheckpointError):
        parse(raw)


def test_nan_constant_inside_valid_document():
    raw = sealed(valid_metadata().to_json_bytes().replace(b'"step":7', b'"step":NaN'))
    with pytest.raises(CorruptCheckpointError, match="not valid JSON"):
        parse(raw)


def test_error_names_source_and_variable():
    doc = _set(UC + ("start",), [0, 0, 3, 0])(valid_doc())
    with pytest.raises(CorruptCheckpointError, match=r"meta\.json.*'u'.*outside"):
        parse(corrupt(doc), source="meta.json")
    doc = _set(("format_version",), 99)(valid_doc())
    with pytest.raises(CorruptCheckpointError, match="format version 99 is not supported"):
        parse(corrupt(doc))


@pytest.mark.parametrize("name", ["data/part-000001.bin", "a", "a/b/c.bin", "..a", "a..", "a/.b"])
def test_relative_paths_accepted(name):
    assert check_relative_path(name) == name


@pytest.mark.parametrize("name", ["..", "../x", "a/../../x", "/abs", "a/./b", "a/", "", "a\\b", "a\x00", "a//b", None, 5])
def test_relative_paths_rejected(name):
    with pytest.raises(CorruptCheckpointError):
        check_relative_path(name)


# -- fuzz: any mutation of valid metadata gives a Metadata or a CheckpointError, nothing else

JSON_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70),
                        st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20),
                        st.sampled_from(["..", "../x", "/etc/passwd", "|O", "<f8", ">i4", "V8", "0123456789abcdef"]))
JSON_VALUES = st.recursive(JSON_LEAVES, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                                 st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                           max_leaves=10)


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzz_structural_mutations(data):
    doc = valid_doc(data.draw(st.sampled_from(["json", "columnar"])))
    for _ in range(data.draw(st.integers(1, 3))):
        paths = [p for p in _paths(doc) if p]
        path = data.draw(st.sampled_from(paths))
        target = doc
        for key in path[:-1]:
            target = target[key]
        action = data.draw(st.sampled_from(["replace", "delete", "wrap"]))
        if action == "replace":
            target[path[-1]] = data.draw(JSON_VALUES)
        elif action == "delete":
            del target[path[-1]]
        else:
            target[path[-1]] = [target[path[-1]]]
    try:
        meta = parse(sealed(doc))
    except CheckpointError:
        return
    # whatever was accepted is self-consistent
    for var in meta.variables.values():
        assert var.chunks.start.shape == var.chunks.count.shape == (len(var.chunks), len(var.shape))
        assert int(np.prod(var.chunks.count, axis=1).sum() if var.shape else len(var.chunks)) == \
            int(np.prod(var.shape)) if var.shape else True
        assert np.all(var.chunks.file < len(meta.files))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_fuzz_byte_mutations(data):
    raw = bytearray(valid_metadata().to_json_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        kind = data.draw(st.sampled_from(["flip", "delete", "insert"]))
        if kind == "flip":
            raw[pos] = data.draw(st.integers(0, 255))
        elif kind == "delete":
            del raw[pos]
        else:
            raw[pos:pos] = data.draw(st.binary(min_size=1, max_size=3))
    try:
        parse(bytes(raw))
    except CheckpointError:
        pass


def test_large_chunk_index_parses():
    """100,000 chunks: the timing target (< 1 s) is a benchmark (bench/); here it must just parse correctly."""
    n = 100_000
    rows = [(i % 4, (i // 4) * 80, 80, format(i, "016x"), (i, 0), (1, 10)) for i in range(n)]
    meta = Metadata(step=1, files=[f"data/part-{k:06d}.bin" for k in range(4)],
                    variables={"u": Variable("u", "block", np.dtype("<f8"), (n, 10), ChunkTable.from_rows(rows, 2))},
                    values={}, nranks=4, created="now")
    raw = meta.to_json_bytes()
    t0 = time.perf_counter()
    back = parse(raw)
    elapsed = time.perf_counter() - t0
    assert len(back.variables["u"].chunks) == n
    assert back.variables["u"].chunks.checksum[n - 1] == format(n - 1, "016x")
    assert back.variables["u"].chunks.start[n - 1].tolist() == [n - 1, 0]
    print(f"parsed {n} chunks in {elapsed:.3f} s")


def test_mutations_do_not_share_state():
    a, b = valid_doc(), valid_doc()
    MALFORMED["path traversal"](a)
    assert b["files"][0] == "data/part-000000.bin" and copy.deepcopy(b) == valid_doc()


@pytest.mark.parametrize("hashes, ok", [
    (["0" * 32, "mix128:" + "a" * 32], True),  # host (xxh3_128) and device (mix128) blocks side by side
    (["0" * 32, "mix128:" + "a" * 31], False),
    (["0" * 32, "xxh3:" + "a" * 32], False),
    (["0" * 32, "MIX128:" + "a" * 32], False),
    (["0" * 32, 5], False),
])
def test_content_hash_column_accepts_host_and_device_hashes_only(hashes, ok):
    doc = valid_doc()
    doc["variables"]["u"]["chunks"]["hash"] = hashes
    if ok:
        assert parse(corrupt(doc)).variables["u"].chunks.hash == hashes
    else:
        with pytest.raises(CorruptCheckpointError, match="column 'hash' is malformed"):
            parse(corrupt(doc))
