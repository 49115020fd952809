"""Replicated values and dtype descriptors as JSON (hpcckpt.encoding): round trips and refusals."""

from __future__ import annotations

import json
import math

import numpy as np
from numpy.lib.recfunctions import repack_fields
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcckpt import CheckpointError, CorruptCheckpointError
from hpcckpt.encoding import MAX_VALUE_ARRAY_BYTES, decode_value, dtype_from_json, dtype_to_json, encode_value

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
                [["a", "<f8", "3"]], "|V99999999999", [[["t", 5], "<f8"]]]:
        with pytest.raises(CorruptCheckpointError):
            dtype_from_json(bad)
