"""Replicated values and dtype descriptors as JSON (hpcckpt.core.encoding): round trips and refusals."""

from __future__ import annotations

import base64
import json
import math

import numpy as np
from numpy.lib.recfunctions import repack_fields
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hpcckpt
from metadata_tools import rewrite_metadata
from hpcckpt import CheckpointError, CorruptCheckpointError
from hpcckpt.core.encoding import (MAX_INT_DIGITS, MAX_VALUE_ARRAY_BYTES, MAX_VALUE_DEPTH, decode_value, dtype_from_json,
                              dtype_to_json, encode_value)

STRUCT = np.dtype([("id", "<i8"), ("pos", ">f4", (3,)), ("nested", [("a", "u1"), ("b", "<c8")])])
DTYPES = ["<i1", "<u2", ">i4", "<i8", "<f2", "<f4", ">f8", "<c8", ">c16", "?", "<M8[ns]", "<m8[s]", "|S5",
          "|V4", STRUCT, np.dtype({"names": ["x", "y"], "formats": ["<i4", "<f8"], "offsets": [0, 8], "itemsize": 24})]


def through_json(value):
    return decode_value(json.loads(json.dumps(encode_value(value), allow_nan=False)))


def same(a, b):
    """Exact equality including type, dtype, NaN and signed zero."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, (np.ndarray, np.generic)):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert packed(a) == packed(b)
    elif isinstance(a, float):
        assert (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            same(a[k], b[k])
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)
    else:
        assert a == b


def packed(a):
    """The bytes of an array or scalar without the padding of structured dtypes (padding is not data)."""
    a = np.asarray(a)
    if a.dtype.names is not None:
        a = repack_fields(np.ascontiguousarray(a))
    return a.tobytes()


PLAIN = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(1 << 80), 1 << 80), st.floats(), st.text(max_size=10)),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=6).filter(lambda k: k != "$hpcckpt"), inner, max_size=4)),
    max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(PLAIN)
def test_plain_values_round_trip(value):
    same(through_json(value), value)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), -0.0, 1e308, 5e-324,
                                   [1.0, float("nan"), {"x": float("-inf")}]])
def test_non_finite_floats(value):
    same(through_json(value), value)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_numpy_scalars_and_arrays_round_trip(dtype):
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 256, size=dtype.itemsize * 6, dtype=np.uint8)
    arr = raw.view(dtype).reshape(2, 3)
    same(through_json(arr), arr)
    same(through_json(arr[0, 1]), arr[0, 1])
    # non-contiguous and Fortran-ordered arrays come back C-ordered with the same elements
    f = np.asfortranarray(arr)
    same(through_json(f), np.ascontiguousarray(f))
    same(through_json(arr[:, ::2]), np.ascontiguousarray(arr[:, ::2]))


def test_numpy_scalar_types():
    same(through_json(np.array(["ab", "\u00e9z"], "<U3")), np.array(["ab", "\u00e9z"], "<U3"))
    for value in [np.str_("h\u00e9"), np.float64("inf"), np.float64(-0.0), np.float64(1.5), np.int64(2**62),np.float32(1.5), np.int64(-3), np.bool_(True), np.complex128(1 - 2j), np.datetime64("2024-01-02", "D"),
                  np.float64("nan"), np.uint64(2**64 - 1)]:
        same(through_json(value), value)
    same(through_json(np.zeros((0, 3), np.int16)), np.zeros((0, 3), np.int16))
    same(through_json(np.array(4.5)), np.array(4.5))


def test_tuples_come_back_as_lists():
    assert through_json((1, (2, 3))) == [1, [2, 3]]


@pytest.mark.parametrize("value, match", [
    (object(), "cannot store a object"),
    ({1: 2}, "dict keys must be strings"),
    ({"a": {(1, 2): 3}}, "dict keys must be strings"),
    ({"$hpcckpt": 1}, "reserved"),
    (np.zeros(3, object), "Python objects"),
    (np.zeros(MAX_VALUE_ARRAY_BYTES // 8 + 1), "too large"),
    ({1.5, 2.5}, "cannot store a set"),
    (b"bytes", "cannot store a bytes"),
    ([1, lambda: 0], r"value\[1\]"),
])
def test_refused_values(value, match):
    with pytest.raises(CheckpointError, match=match):
        encode_value(value)


def test_largest_allowed_array():
    arr = np.arange(MAX_VALUE_ARRAY_BYTES // 8, dtype=np.float64)
    same(through_json(arr), arr)


@pytest.mark.parametrize("obj", [
    {"$hpcckpt": "float", "value": "1.5"},
    {"$hpcckpt": "float"},
    {"$hpcckpt": "scalar", "dtype": "<f8", "data": "AAAA"},
    {"$hpcckpt": "scalar", "dtype": "|O", "data": "AAAAAAAAAAA="},
    {"$hpcckpt": "scalar", "dtype": "<f8", "data": "not base64!"},
    {"$hpcckpt": "ndarray", "dtype": "<f8", "shape": [2], "data": "AAAAAAAAAAA="},
    {"$hpcckpt": "ndarray", "dtype": "<f8", "shape": [-1], "data": ""},
    {"$hpcckpt": "ndarray", "dtype": "<f8", "shape": "2", "data": ""},
    {"$hpcckpt": "ndarray", "dtype": "<f8", "shape": [1 << 40, 1 << 40], "data": ""},
    {"$hpcckpt": "ndarray", "dtype": [["a", "|O"]], "shape": [1], "data": "AAAAAAAAAAA="},
    {"$hpcckpt": "ndarray", "dtype": 5, "shape": [1], "data": "AAAAAAAAAAA="},
    {"$hpcckpt": "pickle", "data": "gASVAAAAAA=="},
    {"$hpcckpt": None},
    [{"$hpcckpt": "float", "value": "nan()"}],
])
def test_malformed_tagged_values(obj):
    with pytest.raises(CorruptCheckpointError):
        decode_value(obj)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["$hpcckpt", "value", "dtype", "data", "shape"]),
                       st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=12),
                                 st.sampled_from(["float", "scalar", "ndarray", "<f8", "|O", "AAAAAAAAAAA=", "nan"]),
                                 st.lists(st.integers(-2, 4), max_size=3)), min_size=1))
def test_fuzz_tagged_values(obj):
    try:
        decode_value(obj)
    except CheckpointError:
        pass


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dtype_descriptors_round_trip(dtype):
    dtype = np.dtype(dtype)
    back = dtype_from_json(json.loads(json.dumps(dtype_to_json(dtype))))
    assert back == dtype and back.itemsize == dtype.itemsize
    assert back.byteorder == dtype.byteorder or dtype.itemsize == 1 or dtype.names


def test_dtype_refusals():
    with pytest.raises(CheckpointError):
        dtype_to_json(np.dtype(object))
    with pytest.raises(CheckpointError):
        dtype_to_json(np.dtype([("a", "O"), ("b", "<f8")]))
    for bad in ["|O", [["a", "|O"]], "junk", 3, None, {"a": 1}, [["a"]], [[1, "<f8"]], [["a", "<f8", [-1]]],
                [["a", "<f8", "3"]], "|V99999999999", [[["t", 5], "<f8"]], "(2,)<f8", ">(2,3)i4"]:
        with pytest.raises(CorruptCheckpointError):
            dtype_from_json(bad)


# ---------------------------------------------------------------- integers beyond int64
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def json_ints(doc):
    """Every JSON integer in an encoded value."""
    if isinstance(doc, bool):
        return []
    if isinstance(doc, int):
        return [doc]
    if isinstance(doc, list):
        return [i for v in doc for i in json_ints(v)]
    if isinstance(doc, dict):
        return [i for v in doc.values() for i in json_ints(v)]
    return []


@pytest.mark.parametrize("value", [2**63, -2**63 - 1, 2**70, -2**70, 10**MAX_INT_DIGITS - 1, -(10**MAX_INT_DIGITS - 1)],
                         ids=lambda v: f"{'-' if v < 0 else ''}{len(str(abs(v)))}-digits")
def test_big_ints_are_tagged_decimal_text(value):
    assert encode_value(value) == {"$hpcckpt": "int", "value": str(value)}
    assert encode_value([value]) == [{"$hpcckpt": "int", "value": str(value)}]
    same(through_json(value), value)


@pytest.mark.parametrize("value", [0, -1, INT64_MIN, INT64_MAX, 2**53 + 1])
def test_int64_ints_stay_plain(value):
    assert encode_value(value) == value and type(encode_value(value)) is int
    same(through_json(value), value)


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.integers(), lambda inner: st.lists(inner, max_size=3), max_leaves=8))
def test_any_int_round_trips_and_json_holds_only_int64(value):
    doc = encode_value(value)
    assert all(INT64_MIN <= i <= INT64_MAX for i in json_ints(doc))
    same(through_json(value), value)


def test_too_many_digits_is_refused_naming_the_value(tmp_path):
    with pytest.raises(CheckpointError, match=f"'n'.*more than {MAX_INT_DIGITS} decimal digits"):
        encode_value({"n": -(10**MAX_INT_DIGITS)}, "'n'")
    with pytest.raises(CheckpointError, match=f"'huge'.*more than {MAX_INT_DIGITS}"):
        hpcckpt.save({"huge": 10**MAX_INT_DIGITS}, str(tmp_path / "ck"))


def test_plain_big_ints_of_old_files_still_decode():
    assert decode_value(2**70) == 2**70 and decode_value([-(2**64)]) == [-(2**64)]


@pytest.mark.parametrize("obj", [
    {"$hpcckpt": "int", "value": "5"},  # fits int64: a writer never tags it
    {"$hpcckpt": "int", "value": "-9223372036854775808"},
    {"$hpcckpt": "int", "value": 2**70},  # not a string
    {"$hpcckpt": "int", "value": "1e30"},
    {"$hpcckpt": "int", "value": "+99999999999999999999"},
    {"$hpcckpt": "int", "value": "0099999999999999999999"},  # leading zeros (docs/format.md 3.4)
    {"$hpcckpt": "int", "value": " 99999999999999999999"},
    {"$hpcckpt": "int", "value": "99999999999999999999\n"},
    {"$hpcckpt": "int", "value": "99_999_999_999_999_999_999"},
    {"$hpcckpt": "int", "value": "\u0663" * 25},  # Arabic-Indic digits: int() accepts them, the format does not
    {"$hpcckpt": "int", "value": "--99999999999999999999"},
    {"$hpcckpt": "int", "value": ""},
    {"$hpcckpt": "int", "value": "9" * (MAX_INT_DIGITS + 1)},
    {"$hpcckpt": "int", "value": "-" + "9" * (MAX_INT_DIGITS + 1)},
    {"$hpcckpt": "int"},
    {"$hpcckpt": "int", "value": "99999999999999999999", "extra": 1},
])
def test_malformed_tagged_ints(obj):
    with pytest.raises(CorruptCheckpointError, match="malformed replicated value"):
        decode_value(obj)


def test_longest_tagged_int_decodes():
    assert decode_value({"$hpcckpt": "int", "value": "-" + "9" * MAX_INT_DIGITS}) == -(10**MAX_INT_DIGITS - 1)


# ---------------------------------------------------------------- nesting depth
def nested(depth: int, leaf=1, kind="list"):
    """``leaf`` inside ``depth`` lists (or dicts)."""
    for _ in range(depth):
        leaf = [leaf] if kind == "list" else {"k": leaf}
    return leaf


@pytest.mark.parametrize("kind", ["list", "dict"])
def test_deepest_allowed_nesting_round_trips(kind):
    value = nested(MAX_VALUE_DEPTH, np.arange(3.0), kind)  # a tagged array is a leaf, not a level
    same(through_json(value), value)


@pytest.mark.parametrize("kind", ["list", "dict"])
def test_deeper_nesting_is_refused_on_save(tmp_path, kind):
    with pytest.raises(CheckpointError, match=f"nest more than {MAX_VALUE_DEPTH} deep"):
        encode_value(nested(MAX_VALUE_DEPTH + 1, kind=kind))
    with pytest.raises(CheckpointError, match=f"'deep'.*nest more than {MAX_VALUE_DEPTH} deep"):
        hpcckpt.save({"deep": nested(600, kind=kind)}, str(tmp_path / "ck"))
    assert not (tmp_path / "ck" / "metadata.json").exists()


def test_a_value_containing_itself_is_refused():
    cycle = []
    cycle.append(cycle)
    with pytest.raises(CheckpointError, match="contains itself"):
        encode_value({"a": cycle})


@pytest.mark.parametrize("depth", [MAX_VALUE_DEPTH + 1, 600, 100_000])
def test_deeper_nesting_is_refused_on_read(depth):
    with pytest.raises(CorruptCheckpointError, match=f"nest more than {MAX_VALUE_DEPTH} deep"):
        decode_value(nested(depth), "'v'")


def test_crafted_deep_metadata_is_a_corrupt_checkpoint(tmp_path):
    """Values nested 600 deep in metadata.json raised RecursionError from open() and load()."""
    path = str(tmp_path / "ck")
    hpcckpt.save({"v": 1}, path)
    rewrite_metadata(path, lambda meta: meta["values"].update(v=nested(600)))
    with pytest.raises(CorruptCheckpointError, match="'v'.*nest more than"):
        hpcckpt.open(path)
    with pytest.raises(CorruptCheckpointError, match="'v'.*nest more than"):
        hpcckpt.load({"v": None}, path)


# ---------------------------------------------------------------- any JSON: a value or CorruptCheckpointError
TAG_KEYS = st.sampled_from(["$hpcckpt", "value", "dtype", "data", "shape"]) | st.text(max_size=4)
JSON_LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8),
    st.sampled_from(["int", "float", "scalar", "ndarray", "nan", "-inf", "<f8", ">i8", "|O", "(2,)<f8", "AAAAAAAAAAA=",
                     "", "-", "99999999999999999999", "-9223372036854775809", "12", "9" * 4301]))
JSON_TREES = st.recursive(JSON_LEAVES, lambda inner: st.lists(inner, max_size=4)
                          | st.dictionaries(TAG_KEYS, inner, max_size=5), max_leaves=25)


@settings(max_examples=500, deadline=None)
@given(JSON_TREES, st.integers(0, 2 * MAX_VALUE_DEPTH) | st.sampled_from([MAX_VALUE_DEPTH + 1, 20_000]))
def test_decode_gives_a_value_or_corrupt_checkpoint_error(tree, depth):
    """20,000 levels: beyond the recursion limit that hypothesis raises while a test runs."""
    doc = nested(depth, json.loads(json.dumps(tree)))
    try:
        decode_value(doc)
    except CorruptCheckpointError:
        pass


@pytest.mark.parametrize("obj", [
    {"$hpcckpt": "float", "value": "nan", "extra": 1},
    {"$hpcckpt": "scalar", "dtype": "<f8", "data": "AAAAAAAA8D8=", "shape": []},
    {"$hpcckpt": "ndarray", "dtype": "<u1", "shape": [1], "data": "AA==", "x": 0},
    {"$hpcckpt": "ndarray", "dtype": "<u1", "data": "AA=="},
    {"$hpcckpt": ["int"], "value": "1"},
])
def test_tagged_values_have_exactly_their_keys(obj):
    with pytest.raises(CorruptCheckpointError, match="malformed replicated value"):
        decode_value(obj)


def test_a_replicated_array_over_the_limit_is_refused_on_read():
    raw = np.zeros(MAX_VALUE_ARRAY_BYTES + 1, np.uint8)
    obj = {"$hpcckpt": "ndarray", "dtype": "|u1", "shape": [raw.size],
           "data": base64.b64encode(raw.tobytes()).decode()}
    with pytest.raises(CorruptCheckpointError, match="more than a replicated value holds"):
        decode_value(obj)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40), st.lists(st.tuples(st.integers(0, 63), st.sampled_from("AB+/=\n")), max_size=3),
       st.sampled_from(["", "=", "==", "===="]))
def test_canonical_base64_is_the_one_spelling_of_its_bytes(raw, edits, tail):
    """b64decode_canonical takes the encoder's text back to its bytes, and any text it accepts is exactly the
    encoder's text of what it returns: a bit set before the padding, extra padding, a stray character, refused."""
    from hpcckpt.core.encoding import b64decode_canonical

    text = base64.b64encode(raw).decode()
    assert b64decode_canonical(text) == raw
    other = list(text) or ["A"]
    for pos, char in edits:
        other[pos % len(other)] = char
    other = "".join(other) + tail
    try:
        got = b64decode_canonical(other)
    except ValueError:
        return
    assert base64.b64encode(got).decode() == other
