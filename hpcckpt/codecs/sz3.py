"""SZ3 (PyPI ``pysz``) as an error-bounded lossy codec: ``hpcckpt.codecs.SZ3``.

``SZ3(abs=b)``: ``|x - x'| <= b`` for every element.
``SZ3(rel=r)``: ``|x - x'| <= r * (max - min)``, max and min over the finite
values of the chunk (the same bound as ``Lossy(rel=r)``).
``SZ3(pw_rel=r)``: point-wise, ``|x - x'| <= r * |x|`` (zeros are kept exactly).

The chunk is compressed in its own shape (SZ3 predicts along every axis) with
SZ3's absolute mode: ``abs`` as given, ``rel`` converted to the chunk's
absolute bound, ``pw_rel`` through the transform below.  NaN, +-Inf and any
element outside the bound are set aside and restored bit for bit (bounded.py).
Config: ``{"id": "hpcckpt.sz3", "abs" | "rel" | "pw_rel": bound}``.

``pw_rel`` compresses, in float64, ``t = sign(x) * (log2|x| + c)`` for
``x != 0`` and ``t = 0`` for zeros, with ``c = 1 - min(log2|x|)`` over the
chunk's finite non-zero values (stored as the header's param) and the absolute
bound ``log2(1 + r)``; it decodes ``x = 0`` where ``|t| < 0.5`` and
``sign(t) * 2 ** (|t| - c)`` elsewhere (see docs/format.md).

The stream is SZ3's own (``SZ_compress`` of SZ3's ``sz.hpp``: a 16-byte
header, SZ3's payload, then SZ3's serialised Config), laid out in
docs/compression.md for readers in other languages; :func:`check_stream`
checks its header and Config against the chunk before pysz decodes it.
"""

from __future__ import annotations

import math
import struct

import numpy as np

from hpcckpt.errors import CheckpointError, CorruptCheckpointError
from hpcckpt.codecs.bounded import BoundedCodec, check_bound, check_float_dtype, finite_range_bound, library, violations
from hpcckpt.codecs.core import CodecFamily, register_family

ID = "hpcckpt.sz3"
MODES = ("abs", "rel", "pw_rel")
#: Upper limits of the relative bounds (``pw_rel`` keeps log2(1 + r) below 0.5, so zeros stay apart).
UPPER = {"abs": None, "rel": 0.5, "pw_rel": 0.4}


def _pysz():
    return library("pysz", "sz3")


#: An SZ3 stream's first 16 bytes (little-endian): magic, data version, length of the payload that follows.
STREAM_HEADER = struct.Struct("<IIQ")
STREAM_MAGIC = 0xF342F310
#: SZ3's Config after the payload: its size (u8, itself included), N (u8), the bit width of the dims (u8); then
#: the N dims packed; then num (u64), the algorithm (u8), the error bound mode (u8) and, in mode ABS, the bound (f64).
CONFIG_HEAD = struct.Struct("<BBB")
CONFIG_TAIL = struct.Struct("<QBBd")
#: SZ3's error bound mode ABS, the only one hpcckpt writes.
EB_ABS = 0


def check_stream(stream, n: int) -> None:
    """CorruptCheckpointError unless ``stream`` is one SZ3 stream, laid out as docs/compression.md says, of ``n``
    values at an absolute bound: SZ3 itself trusts its Config (its dims size what it writes)."""
    b = memoryview(np.ascontiguousarray(stream)).cast("B")
    if len(b) < STREAM_HEADER.size + CONFIG_HEAD.size:
        raise CorruptCheckpointError(f"an SZ3 stream of {len(b)} bytes is shorter than its header")
    magic, _version, payload = STREAM_HEADER.unpack_from(b)
    if magic != STREAM_MAGIC or payload > len(b) - STREAM_HEADER.size - CONFIG_HEAD.size:
        raise CorruptCheckpointError("an SZ3 stream has a bad magic number or a payload longer than the stream")
    pos = STREAM_HEADER.size + payload
    size, ndim, width = CONFIG_HEAD.unpack_from(b, pos)
    tail = pos + CONFIG_HEAD.size + (ndim * width + 7) // 8
    if pos + size != len(b) or not (1 <= ndim <= 4 and 1 <= width <= 64) or tail + CONFIG_TAIL.size > len(b):
        raise CorruptCheckpointError(f"an SZ3 stream's Config is malformed ({size} bytes, {ndim} dims of {width} "
                                     f"bits, in {len(b) - pos} bytes)")
    bits = int.from_bytes(b[pos + CONFIG_HEAD.size:tail], "little")
    dims = [(bits >> (i * width)) & ((1 << width) - 1) for i in range(ndim)]
    num, _algo, mode, _bound = CONFIG_TAIL.unpack_from(b, tail)
    if math.prod(dims) != num or num != n or mode != EB_ABS:
        raise CorruptCheckpointError(f"an SZ3 stream declares dims {dims} ({num} values) and error bound mode "
                                     f"{mode}, not {n} values at an absolute bound")


class SZ3:
    """An SZ3 spec: exactly one of ``abs``, ``rel`` (relative to the chunk's range) or ``pw_rel`` (point-wise)."""

    def __init__(self, abs=None, rel=None, pw_rel=None):  # noqa: A002 - Lossy's spelling
        given = {m: v for m, v in (("abs", abs), ("rel", rel), ("pw_rel", pw_rel)) if v is not None}
        if len(given) != 1:
            raise CheckpointError("SZ3 needs exactly one of abs=..., rel=... or pw_rel=...")
        (self.mode, value), = given.items()
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CheckpointError(f"an SZ3 bound must be a finite positive number, got {value!r}")
        self.bound = check_bound(value, self.mode, CheckpointError, UPPER[self.mode])
        _pysz()  # at the spec, not in a codec thread: a missing library is said once, clearly

    def config(self) -> dict:
        return {"id": ID, self.mode: self.bound}

    def __repr__(self) -> str:
        return f"SZ3({self.mode}={self.bound})"


def check_sz3_config(cfg, dtype, error=CorruptCheckpointError) -> dict:
    modes = [m for m in MODES if m in cfg]
    extra = sorted(set(cfg) - {"id", *MODES})
    if extra or len(modes) != 1:
        raise error(f"a {ID} config has exactly one of {list(MODES)} (got {sorted(cfg)[:8]})")
    mode = modes[0]
    bound = check_bound(cfg[mode], mode, error, UPPER[mode])
    check_float_dtype(dtype, "SZ3", error)
    return {"id": ID, mode: bound}


class SZ3Codec(BoundedCodec):
    MAGIC = b"HSZ3"

    def __init__(self, config: dict, dtype):
        super().__init__(config, dtype)
        self.mode = next(m for m in MODES if m in config)
        self.bound = config[self.mode]

    @staticmethod
    def _sz(w, bound):
        pysz = _pysz()
        conf = pysz.szConfig()
        conf.errorBoundMode = pysz.szErrorBoundMode.ABS
        conf.absErrorBound = bound
        stream, _ = pysz.sz.compress(np.ascontiguousarray(w), conf)
        return stream

    def compress(self, w, x64):
        if self.mode == "abs":
            return self._sz(w, self.bound), 0.0
        if self.mode == "rel":
            bound = finite_range_bound(x64, self.bound)
            return self._sz(w, bound if bound > 0 else np.finfo(np.float64).tiny), 0.0
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            a = np.abs(x64)
            use = np.isfinite(a) & (a > 0)
            logs = np.log2(np.where(use, a, 1.0))
            c = 1.0 - float(logs[use].min()) if use.any() else 1.0
            t = np.where(use, np.copysign(logs + c, x64), 0.0)
        return self._sz(t.reshape(w.shape), math.log2(1 + self.bound) * (1 - 1e-9)), c

    def expand(self, stream, n, param):
        pysz = _pysz()
        work = np.float64 if self.mode == "pw_rel" else self.work
        check_stream(stream, n)
        try:
            y, _ = pysz.sz.decompress(np.ascontiguousarray(stream), work, (n,))
        except Exception as exc:  # pysz turns SZ3's C++ exceptions into various Python ones
            raise CorruptCheckpointError(f"SZ3 cannot decompress a chunk: {exc}") from None
        y = y.reshape(-1)
        if y.size != n:
            raise CorruptCheckpointError(f"an SZ3 stream decodes to {y.size} elements, not {n}")
        if self.mode != "pw_rel":
            return y
        with np.errstate(over="ignore", invalid="ignore"):
            return np.where(np.abs(y) < 0.5, 0.0, np.copysign(np.exp2(np.abs(y) - param), y))

    def misses(self, x, y, x64):
        if self.mode == "abs":
            return violations(x, y, self.bound)
        if self.mode == "rel":
            return violations(x, y, finite_range_bound(x64, self.bound))
        return violations(x, y, self.bound, pointwise=True)


register_family(ID, CodecFamily(check=check_sz3_config, make=SZ3Codec, spec_type=SZ3))
