"""JSON encodings of dtypes and of replicated values: data only, never pickle.

Dtypes are written as numpy's array-protocol descriptors (``"<f8"``, or a list
of ``[name, descr(, shape)]`` fields for structured dtypes), the same text the
``.npy`` format uses, so a reader in another language can decode them.  Dtypes
that would need pickling (object fields) are refused in both directions.

Replicated values are plain JSON, with four tagged forms (objects whose only
tag key is ``"$hpcckpt"``): integers outside int64 (decimal text, which many
JSON libraries cannot parse as numbers), non-finite floats, numpy scalars and
small numpy arrays (base64 of the C-ordered bytes, in the byte order their
dtype says).  Lists and dicts nest at most ``MAX_VALUE_DEPTH`` deep, so that
neither side recurses without bound on crafted or cyclic input.  Every base64
text is read in its one canonical form only (:func:`b64decode_canonical`).
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from typing import Any

import numpy as np

from hpcckpt.errors import CheckpointError, CorruptCheckpointError

TAG = "$hpcckpt"
#: Largest numpy array accepted as a replicated value; bigger ones belong in a Block.
MAX_VALUE_ARRAY_BYTES = 1 << 20
_MAX_ITEMSIZE = 1 << 24
#: Lists and dicts nest at most this deep in a replicated value (a tagged object is a leaf).
MAX_VALUE_DEPTH = 64
#: Most decimal digits of an integer value (CPython's default int/str conversion limit).
MAX_INT_DIGITS = 4300
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_INT_LIMIT = 10 ** MAX_INT_DIGITS
_INT_TEXT = re.compile(r"-?[1-9][0-9]*")  # as Python writes them: no leading zeros, no "+", no "-0"


def dtype_to_json(dtype: np.dtype):
    """The JSON form of a dtype (raises CheckpointError for dtypes that need pickling)."""
    dtype = np.dtype(dtype)
    if dtype.hasobject:
        raise CheckpointError(f"dtype {dtype} holds Python objects, which hpcckpt does not store (no pickle)")
    return _listify(np.lib.format.dtype_to_descr(dtype))


def dtype_from_json(descr) -> np.dtype:
    """Parse an untrusted dtype descriptor; CorruptCheckpointError when it is not a plain data dtype."""
    try:
        _check_byte_orders(descr)
        dtype = np.lib.format.descr_to_dtype(_tuplify(descr))
    except Exception as exc:  # numpy raises TypeError, ValueError, KeyError... for junk
        raise CorruptCheckpointError(f"invalid dtype descriptor {str(descr)[:80]!r}: {exc}") from None
    if dtype.hasobject:
        raise CorruptCheckpointError(f"dtype {descr!r} holds Python objects; refused (no pickle)")
    if dtype.subdtype is not None:  # "(2,)<f8": numpy would turn it into extra axes of every array read
        raise CorruptCheckpointError(f"dtype {str(descr)[:80]!r} is a sub-array, not an element type")
    if dtype.itemsize > _MAX_ITEMSIZE:
        raise CorruptCheckpointError(f"dtype {str(descr)[:80]!r} has an implausible item size {dtype.itemsize}")
    return dtype


def _check_byte_orders(descr) -> None:
    """Refuse a descriptor whose byte order mark is not the one rule of docs/format.md 3.2: ``|`` exactly for the
    types byte order does not apply to (one-byte ``b1``, ``i1``, ``u1``; ``S<n>`` and ``V<n>``), ``<`` or ``>``
    for every other (``=f8`` or ``f8`` would mean "whatever the reading machine uses", so the same file would read
    differently on different machines; ``<u1`` or ``>S3`` says an order that means nothing, which hpcckpt never
    writes)."""
    if isinstance(descr, list):
        for field in descr:
            if isinstance(field, list) and len(field) >= 2:
                _check_byte_orders(field[1])
        return
    if isinstance(descr, str):
        if descr[:1] not in ("<", ">", "|"):
            raise ValueError("the byte order must be explicit ('<', '>' or '|')")
        if (descr[0] == "|") != _order_free(np.dtype(descr)):
            raise ValueError(f"{descr!r} needs the byte order mark '|'" if descr[0] != "|"
                             else f"{descr!r} needs a byte order ('<' or '>'), not '|'")


def _order_free(dtype: np.dtype) -> bool:
    """Whether byte order does not apply to ``dtype``: bytes, raw bytes and one-byte bools and integers."""
    return dtype.kind in "SV" or (dtype.kind in "biu" and dtype.itemsize == 1)


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
    return _encode(value, where, 0)


def _encode(value: Any, where: str, depth: int) -> Any:
    """:func:`encode_value` of a value inside ``depth`` lists/dicts."""
    if isinstance(value, np.generic):  # first: np.float64 is a float and np.str_ a str, but they keep their type
        arr = np.asarray(value)
        return {TAG: "scalar", "dtype": dtype_to_json(arr.dtype), "data": _b64(arr)}
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return _encode_int(int(value), where)
    if isinstance(value, float):
        return value if math.isfinite(value) else {TAG: "float", "value": repr(value)}
    if isinstance(value, np.ndarray):
        if value.nbytes > MAX_VALUE_ARRAY_BYTES:
            raise CheckpointError(f"{where}: a {value.nbytes}-byte array is too large for a replicated value; "
                                  "wrap it in hpcckpt.Block")
        return {TAG: "ndarray", "dtype": dtype_to_json(value.dtype), "shape": list(value.shape),
                "data": _b64(value)}
    if isinstance(value, (list, tuple, dict)) and depth >= MAX_VALUE_DEPTH:
        raise CheckpointError(f"{where}: lists and dicts nest more than {MAX_VALUE_DEPTH} deep here "
                              "(or the value contains itself)")
    if isinstance(value, (list, tuple)):
        return [_encode(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for key, v in value.items():
            if not isinstance(key, str):
                raise CheckpointError(f"{where}: dict keys must be strings, got {key!r}")
            if key == TAG:
                raise CheckpointError(f"{where}: the key {TAG!r} is reserved")
            out[key] = _encode(v, f"{where}[{key!r}]", depth + 1)
        return out
    raise CheckpointError(f"{where}: cannot store a {type(value).__name__} as a replicated value "
                          "(allowed: None, bool, int, float, str, lists/dicts of them, numpy scalars and small arrays)")


def _encode_int(value: int, where: str):
    """A plain JSON integer within int64; beyond it the tagged decimal text (``{"$hpcckpt": "int"}``)."""
    if _INT64_MIN <= value <= _INT64_MAX:
        return value
    if abs(value) >= _INT_LIMIT:
        raise CheckpointError(f"{where}: an integer of more than {MAX_INT_DIGITS} decimal digits cannot be stored")
    try:
        return {TAG: "int", "value": str(value)}
    except ValueError as exc:  # sys.set_int_max_str_digits() was lowered below MAX_INT_DIGITS
        raise CheckpointError(f"{where}: {exc}") from None


def _b64(arr: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(arr).tobytes()).decode("ascii")


def b64decode_canonical(text) -> bytes:
    """The bytes of standard base64 text (RFC 4648 section 4) in its one canonical form; ValueError for any other.

    Canonical: the alphabet ``A-Z a-z 0-9 + /``, padded with ``=`` to a multiple of 4 characters (no more
    padding than that), no line break or other character, and the bits the last character holds beyond the
    data are zero (RFC 4648 section 3.5).  That is exactly ``base64.b64encode(bytes)``, what hpcckpt writes,
    so each byte string has one spelling and a reader in any language decodes the same bytes.
    """
    if not isinstance(text, str) or not text.isascii():
        raise ValueError("base64 data must be an ASCII string")
    raw = binascii.a2b_base64(text, strict_mode=True)
    if binascii.b2a_base64(raw, newline=False) != text.encode("ascii"):
        raise ValueError("not canonical base64: superfluous padding, or non-zero bits before the padding")
    return raw


#: The tag of a value saved once per rank (hpcckpt.PerRank; docs/format.md 3.4).
PER_RANK = "per-rank"
_PER_RANK_KEYS = {TAG, "values"}


class PerRankEntries(list):
    """A decoded per-rank value: the saved value of each rank, in rank order."""


def encode_per_rank(entries: list) -> dict:
    """The JSON form of a per-rank value from each rank's encoded value (rank order)."""
    return {TAG: PER_RANK, "values": list(entries)}


def is_per_rank(obj: Any) -> bool:
    """Whether a stored value (its JSON form) is a per-rank value, before it is decoded."""
    return isinstance(obj, dict) and obj.get(TAG) == PER_RANK and set(obj) == _PER_RANK_KEYS


def decode_value(obj: Any, where: str = "value", wide_ints: bool = True) -> Any:
    """Inverse of :func:`encode_value` for untrusted JSON; CorruptCheckpointError on malformed input.

    A per-rank value is recognised here, at the top only: it is not a level of nesting, each of its entries
    nests at most MAX_VALUE_DEPTH deep on its own (as :func:`encode_value` of each rank's value made it).
    ``wide_ints``: whether a plain JSON integer may lie outside int64 (format version 1 wrote them so; from
    version 2 on, such an integer is always the tagged ``int`` form, and metadata.parse passes False).
    """
    if is_per_rank(obj):
        if not isinstance(obj["values"], list):
            raise CorruptCheckpointError(f"malformed replicated value {where}: a per-rank value holds a list")
        return PerRankEntries(_decode(v, f"{where} of rank {r}", 0, wide_ints) for r, v in enumerate(obj["values"]))
    return _decode(obj, where, 0, wide_ints)


#: The keys of each tagged form (docs/format.md 3.4): a tagged object has exactly these.
_TAG_KEYS = {"int": {TAG, "value"}, "float": {TAG, "value"}, "scalar": {TAG, "dtype", "data"},
             "ndarray": {TAG, "dtype", "shape", "data"}}


def _decode(obj: Any, where: str, depth: int, wide_ints: bool) -> Any:
    """:func:`decode_value` of a JSON value inside ``depth`` arrays/objects (a tagged object is a leaf)."""
    if isinstance(obj, (list, dict)) and depth >= MAX_VALUE_DEPTH and not (isinstance(obj, dict) and TAG in obj):
        raise CorruptCheckpointError(f"malformed replicated value {where}: arrays and objects nest more than "
                                     f"{MAX_VALUE_DEPTH} deep")
    if isinstance(obj, list):
        return [_decode(v, where, depth + 1, wide_ints) for v in obj]
    if not isinstance(obj, dict):
        if not wide_ints and type(obj) is int and not _INT64_MIN <= obj <= _INT64_MAX:
            raise CorruptCheckpointError(f"malformed replicated value {where}: the plain integer {str(obj)[:40]} is "
                                         'outside int64 (format versions 2 and 3 store it as {"$hpcckpt": "int"})')
        return obj
    if TAG not in obj:
        return {k: _decode(v, where, depth + 1, wide_ints) for k, v in obj.items()}
    kind = obj[TAG]
    if kind == PER_RANK:
        raise CorruptCheckpointError(f"malformed replicated value {where}: a per-rank tag is allowed only directly "
                                     f"in values, with exactly the keys {sorted(_PER_RANK_KEYS)}")
    if not isinstance(kind, str) or kind not in _TAG_KEYS:
        raise CorruptCheckpointError(f"malformed replicated value {where}: unknown tag {str(kind)[:40]!r}")
    if set(obj) != _TAG_KEYS[kind]:
        raise CorruptCheckpointError(f"malformed replicated value {where}: a {kind!r} tag has exactly the keys "
                                     f"{sorted(_TAG_KEYS[kind])}, got {sorted(obj)[:8]}")
    try:
        if kind == "int":
            return _decode_int(obj)
        if kind == "float":
            text = obj["value"]
            if text not in ("nan", "inf", "-inf"):
                raise ValueError(f"not a non-finite float: {text!r}")
            return float(text)
        dtype = dtype_from_json(obj["dtype"])
        raw = b64decode_canonical(obj["data"])
        if kind == "scalar":
            return np.frombuffer(raw, dtype=dtype, count=1)[0] if len(raw) == dtype.itemsize else _bad(len(raw))
        if kind == "ndarray":
            shape = obj["shape"]
            if not isinstance(shape, list) or not all(type(x) is int and x >= 0 for x in shape):
                raise ValueError("bad shape")
            count = int(np.prod(shape, dtype=object)) if shape else 1
            if len(raw) > MAX_VALUE_ARRAY_BYTES:
                raise ValueError(f"{len(raw)} bytes of array data, more than a replicated value holds")
            if count * dtype.itemsize != len(raw):
                _bad(len(raw))
            return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape).copy()
    except CorruptCheckpointError:
        raise
    except Exception as exc:
        raise CorruptCheckpointError(f"malformed replicated value {where}: {exc}") from None


def _decode_int(obj: dict) -> int:
    """The integer of a ``{"$hpcckpt": "int", "value": "-123..."}`` object (ValueError if malformed).

    A writer tags only integers outside int64, so a tagged one inside it is refused.
    """
    text = obj["value"]
    if not isinstance(text, str) or _INT_TEXT.fullmatch(text) is None or len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"not a decimal integer of at most {MAX_INT_DIGITS} digits: {str(text)[:40]!r}")
    value = int(text)
    if _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"the tagged integer {text!r} fits in int64 (a writer stores it as a plain integer)")
    return value


def _bad(n: int):
    raise ValueError(f"{n} bytes of data do not match the dtype and shape")
