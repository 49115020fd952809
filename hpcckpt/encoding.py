"""JSON encodings of dtypes and of replicated values: data only, never pickle.

Dtypes are written as numpy's array-protocol descriptors (``"<f8"``, or a list
of ``[name, descr(, shape)]`` fields for structured dtypes), the same text the
``.npy`` format uses, so a reader in another language can decode them.  Dtypes
that would need pickling (object fields) are refused in both directions.

Replicated values are plain JSON, with three tagged forms (objects whose only
tag key is ``"$hpcckpt"``): non-finite floats, numpy scalars and small numpy
arrays (base64 of the C-ordered bytes).
"""

from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np

from .errors import CheckpointError, CorruptCheckpointError

TAG = "$hpcckpt"
#: Largest numpy array accepted as a replicated value; bigger ones belong in a Block.
MAX_VALUE_ARRAY_BYTES = 1 << 20
_MAX_ITEMSIZE = 1 << 24


def dtype_to_json(dtype: np.dtype):
    """The JSON form of a dtype (raises CheckpointError for dtypes that need pickling)."""
    dtype = np.dtype(dtype)
    if dtype.hasobject:
        raise CheckpointError(f"dtype {dtype} holds Python objects, which hpcckpt does not store (no pickle)")
    return _listify(np.lib.format.dtype_to_descr(dtype))


def dtype_from_json(descr) -> np.dtype:
    """Parse an untrusted dtype descriptor; CorruptCheckpointError when it is not a plain data dtype."""
    try:
        dtype = np.lib.format.descr_to_dtype(_tuplify(descr))
    except Exception as exc:  # numpy raises TypeError, ValueError, KeyError... for junk
        raise CorruptCheckpointError(f"invalid dtype descriptor {str(descr)[:80]!r}: {exc}") from None
    if dtype.hasobject:
        raise CorruptCheckpointError(f"dtype {descr!r} holds Python objects; refused (no pickle)")
    if dtype.itemsize > _MAX_ITEMSIZE:
        raise CorruptCheckpointError(f"dtype {str(descr)[:80]!r} has an implausible item size {dtype.itemsize}")
    return dtype


def _listify(descr):
    if isinstance(descr, (list, tuple)):
        return [_listify(x) for x in descr]
    return descr


def _tuplify(descr):
    """Turn the JSON lists of a structured descriptor back into numpy's tuples."""
    if isinstance(descr, str):
        return descr
    if not isinstance(descr, list):
        raise TypeError("a dtype descriptor is a string or a list of fields")
    fields = []
    for field in descr:
        if not isinstance(field, list) or len(field) not in (2, 3):
            raise TypeError("each field is [name, descr] or [name, descr, shape]")
        name = tuple(field[0]) if isinstance(field[0], list) else field[0]
        if isinstance(name, tuple) and not all(isinstance(x, str) for x in name):
            raise TypeError("a field title must be a string")
        item = [name, _tuplify(field[1])]
        if len(field) == 3:
            if not isinstance(field[2], list) or not all(type(x) is int and 0 <= x < (1 << 20) for x in field[2]):
                raise TypeError("a field shape is a list of small non-negative ints")
            item.append(tuple(field[2]))
        fields.append(tuple(item))
    return fields


def encode_value(value: Any, where: str = "value") -> Any:
    """The JSON form of a replicated value; CheckpointError for what cannot be stored as data."""
    if isinstance(value, np.generic):  # first: np.float64 is a float and np.str_ a str, but they keep their type
        arr = np.asarray(value)
        return {TAG: "scalar", "dtype": dtype_to_json(arr.dtype), "data": _b64(arr)}
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {TAG: "float", "value": repr(value)}
    if isinstance(value, np.ndarray):
        if value.nbytes > MAX_VALUE_ARRAY_BYTES:
            raise CheckpointError(f"{where}: a {value.nbytes}-byte array is too large for a replicated value; "
                                  "wrap it in hpcckpt.Block")
        return {TAG: "ndarray", "dtype": dtype_to_json(value.dtype), "shape": list(value.shape),
                "data": _b64(value)}
    if isinstance(value, (list, tuple)):
        return [encode_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for key, v in value.items():
            if not isinstance(key, str):
                raise CheckpointError(f"{where}: dict keys must be strings, got {key!r}")
            if key == TAG:
                raise CheckpointError(f"{where}: the key {TAG!r} is reserved")
            out[key] = encode_value(v, f"{where}[{key!r}]")
        return out
    raise CheckpointError(f"{where}: cannot store a {type(value).__name__} as a replicated value "
                          "(allowed: None, bool, int, float, str, lists/dicts of them, numpy scalars and small arrays)")


def _b64(arr: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(arr).tobytes()).decode("ascii")


def decode_value(obj: Any, where: str = "value") -> Any:
    """Inverse of :func:`encode_value` for untrusted JSON; CorruptCheckpointError on malformed input.

    JSON the parser accepted may still nest too deeply for this recursive walk
    (a few hundred levels): that is malformed input too, not a RecursionError.
    """
    try:
        return _decode(obj, where)
    except RecursionError:
        raise CorruptCheckpointError(f"malformed replicated value {where}: nested too deeply") from None


def _decode(obj: Any, where: str) -> Any:
    """:func:`decode_value` without the depth guard (it recurses into itself)."""
    if isinstance(obj, list):
        return [_decode(v, where) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if TAG not in obj:
        return {k: _decode(v, where) for k, v in obj.items()}
    kind = obj[TAG]
    try:
        if kind == "float":
            text = obj["value"]
            if text not in ("nan", "inf", "-inf"):
                raise ValueError(f"not a non-finite float: {text!r}")
            return float(text)
        dtype = dtype_from_json(obj["dtype"])
        raw = base64.b64decode(obj["data"], validate=True)
        if kind == "scalar":
            return np.frombuffer(raw, dtype=dtype, count=1)[0] if len(raw) == dtype.itemsize else _bad(len(raw))
        if kind == "ndarray":
            shape = obj["shape"]
            if not isinstance(shape, list) or not all(type(x) is int and x >= 0 for x in shape):
                raise ValueError("bad shape")
            count = int(np.prod(shape, dtype=object)) if shape else 1
            if count * dtype.itemsize != len(raw):
                _bad(len(raw))
            return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape).copy()
    except CorruptCheckpointError:
        raise
    except Exception as exc:
        raise CorruptCheckpointError(f"malformed replicated value {where}: {exc}") from None
    raise CorruptCheckpointError(f"malformed replicated value {where}: unknown tag {kind!r}")


def _bad(n: int):
    raise ValueError(f"{n} bytes of data do not match the dtype and shape")
