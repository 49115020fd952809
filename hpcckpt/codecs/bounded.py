"""What the SZ3 and ZFP codecs share: a 40-byte header, elements set aside bit for bit, and the bound check.

The stored chunk of ``hpcckpt.sz3`` and ``hpcckpt.zfp`` (docs/format.md):

    header   magic (4 bytes, b"HSZ3" or b"HZFP"), kind u32 (0: library stream, 1: raw),
             n u64 (elements), k u64 (elements set aside), stream_len u64, param f64
    aside    k positions (u64 little-endian, strictly increasing, < n), then
             k values (the variable's dtype, its byte order)
    stream   stream_len bytes: the library's own stream (kind 0), or the chunk's C-ordered bytes (kind 1)

The encoder decodes its own stream and checks every element against the
config's bound; an element outside it, NaN, +-Inf, and anything the library
cannot represent is set aside and restored bit for bit.  So the bound is the
codec's promise, not the library's.  When more than a third of a chunk would be
set aside (or the library refuses the chunk) the chunk is stored raw.
"""

from __future__ import annotations

import importlib
import math
import struct

import numpy as np

from hpcckpt.errors import CheckpointError, CorruptCheckpointError
from hpcckpt.codecs import kernels
from hpcckpt.codecs.core import Codec

HEADER = struct.Struct("<4sIQQQd")
STREAM, RAW = 0, 1
FLOATS = ("f2", "f4", "f8")


def library(module: str, extra: str):
    """Import an optional compression library, or a CheckpointError saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise CheckpointError(f"this codec needs the {module!r} package: pip install hpcckpt[{extra}]") from None


def check_bound(value, name: str, error, upper: float | None = None) -> float:
    """A finite positive bound (below ``upper`` when given), as a float."""
    if type(value) not in (int, float) or not (math.isfinite(value) and value > 0) or (
            upper is not None and value >= upper):
        below = f" below {upper}" if upper is not None else ""
        raise error(f"the {name!r} bound must be a finite positive number{below}, got {value!r}")
    return float(value)


def check_float_dtype(dtype, codec: str, error) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype.kind != "f" or f"f{dtype.itemsize}" not in FLOATS:
        raise error(f"{codec} compresses float16/32/64 variables, not {dtype}")
    return dtype


def work_dtype(dtype: np.dtype) -> np.dtype:
    """The native dtype the library compresses a chunk of ``dtype`` in (float16 goes through float32)."""
    if dtype.kind == "f":
        return np.dtype(np.float32) if dtype.itemsize <= 4 else np.dtype(np.float64)
    return dtype.newbyteorder("=")


def finite_range_bound(x64: np.ndarray, rel: float) -> float:
    """``rel`` times the range of the finite values (0 when there are none), as lossy.py bounds a chunk."""
    fin = x64[np.isfinite(x64)]
    if not fin.size:
        return 0.0
    return kernels.range_bound(float(fin.min()), float(fin.max()), rel)


def filled(x: np.ndarray, finite: np.ndarray) -> np.ndarray:
    """``x`` with its non-finite elements replaced by the smallest finite one (0 when none): what the library sees."""
    if finite.all():
        return x
    fill = x[finite].min() if finite.any() else 0
    return np.where(finite, x, fill).astype(x.dtype)


def pack(magic: bytes, kind: int, x: np.ndarray, aside: np.ndarray, stream, param: float = 0.0) -> np.ndarray:
    """The stored chunk: header, the elements of flat ``x`` at positions ``aside``, the stream."""
    stream = np.frombuffer(stream, np.uint8) if isinstance(stream, (bytes, bytearray)) else stream.view(np.uint8)
    idx = aside.astype("<u8")
    vals = np.ascontiguousarray(x[aside]).view(np.uint8)
    k = int(idx.size)
    header = HEADER.pack(magic, kind, x.size, k, stream.nbytes, float(param))
    out = np.empty(HEADER.size + idx.nbytes + vals.nbytes + stream.nbytes, np.uint8)
    out[:HEADER.size] = np.frombuffer(header, np.uint8)
    pos = HEADER.size
    for part in (idx.view(np.uint8), vals.reshape(-1), stream.reshape(-1)):
        out[pos:pos + part.nbytes] = part
        pos += part.nbytes
    return out


def pack_raw(magic: bytes, x: np.ndarray) -> np.ndarray:
    return pack(magic, RAW, x, np.zeros(0, np.int64), np.ascontiguousarray(x).reshape(-1).view(np.uint8))


def violations(x: np.ndarray, y: np.ndarray, bound: float | None, pointwise: bool = False) -> np.ndarray:
    """Positions of flat ``x`` (variable dtype) that flat ``y`` does not restore within the bound.

    ``bound`` None: no bound is checked (ZFP's fixed rate and precision), only
    that finite elements stay finite.  Non-finite elements of ``x`` are always set aside.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        x64, y64 = x.astype(np.float64), y.astype(np.float64)
        bad = ~np.isfinite(x64) | ~np.isfinite(y64)
        if bound is not None:
            limit = bound * np.abs(x64) if pointwise else bound
            bad |= ~(np.abs(x64 - y64) <= limit)
            # -0.0 keeps its sign; +0.0 may come back as a tiny value of either sign within the bound (flagging
            # those too set aside every zero of a field with zero regions that SZ3 or ZFP blur: docs/compression.md)
            bad |= (x64 == 0) & np.signbit(x64) & ~np.signbit(y64)
    return np.flatnonzero(bad)


def inexact(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Positions where flat ``y`` is not bit for bit flat ``x`` (the reversible mode)."""
    return np.flatnonzero(x.view(f"u{x.itemsize}") != y.view(f"u{x.itemsize}"))


def unpack(magic: bytes, stored: np.ndarray, dtype: np.dtype, n: int):
    """Check the header against the chunk's ``n`` elements: (kind, param, positions, values, stream)."""
    if stored.nbytes < HEADER.size:
        raise CorruptCheckpointError(f"a {magic.decode()} chunk is shorter than its header")
    got, kind, n_stored, k, stream_len, param = HEADER.unpack_from(stored, 0)
    size = HEADER.size + k * (8 + dtype.itemsize) + stream_len if k <= n else -1
    if got != magic or kind not in (STREAM, RAW) or n_stored != n or size != stored.nbytes or (
            kind == RAW and (k or stream_len != n * dtype.itemsize)) or not math.isfinite(param):
        raise CorruptCheckpointError(f"a {magic.decode()} chunk has a malformed header")
    pos = HEADER.size
    idx = stored[pos:pos + 8 * k].view("<u8")
    pos += 8 * k
    vals = stored[pos:pos + k * dtype.itemsize].view(dtype)
    pos += k * dtype.itemsize
    if k and (bool((idx[1:] <= idx[:-1]).any()) or int(idx[-1]) >= n):
        raise CorruptCheckpointError(f"a {magic.decode()} chunk has malformed positions")
    return kind, param, idx.astype(np.int64), vals, stored[pos:]


def out_view(out: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if out.nbytes % dtype.itemsize:
        raise CorruptCheckpointError("a chunk's extent is not a whole number of elements")
    return out.view(dtype).reshape(-1)


class BoundedCodec(Codec):
    """A library codec behind the layout above.  Subclasses give ``MAGIC`` and:

    ``compress(w, x64)``: (stream bytes, param) of the chunk ``w`` (work dtype, the chunk's shape,
    non-finite values filled) whose float64 values with NaN/Inf are ``x64``; ``expand(stream, n, param)``:
    the flat work-dtype array of n elements (CorruptCheckpointError if the stream is bad);
    ``misses(x, y, x64)``: positions of flat ``x`` that ``y`` (same dtype) does not restore within the bound.
    """

    lossy = True
    MAGIC = b"????"

    def __init__(self, config: dict, dtype):
        self.config = config
        self.dtype = np.dtype(dtype)
        self.work = work_dtype(self.dtype)

    def compress(self, w, x64):
        raise NotImplementedError

    def expand(self, stream, n, param):
        raise NotImplementedError

    def misses(self, x, y, x64):
        raise NotImplementedError

    def encode(self, arr):
        x = np.ascontiguousarray(arr)
        flat = x.reshape(-1)
        n = flat.size
        if n == 0:
            return pack(self.MAGIC, STREAM, flat, np.zeros(0, np.int64), b"")
        with np.errstate(over="ignore", invalid="ignore"):
            x64 = flat.astype(np.float64)
            finite = np.isfinite(x64) if self.dtype.kind == "f" else np.ones(n, bool)
            w = filled(x.astype(self.work).reshape(-1), finite).reshape(x.shape or (1,))
        try:
            stream, param = self.compress(w, x64)
        except (ValueError, RuntimeError, TypeError, OverflowError):  # the library refuses this chunk
            return pack_raw(self.MAGIC, flat)
        y = self.expand(np.frombuffer(stream, np.uint8) if isinstance(stream, bytes) else stream, n, param)
        with np.errstate(over="ignore", invalid="ignore"):
            y = y.astype(self.dtype)
        aside = self.misses(flat, y, x64)
        if 3 * aside.size > n:
            return pack_raw(self.MAGIC, flat)
        return pack(self.MAGIC, STREAM, flat, aside, stream, param)

    def decode(self, stored, out):
        dest = out_view(out, self.dtype)
        n = dest.size
        kind, param, idx, vals, stream = unpack(self.MAGIC, stored, self.dtype, n)
        if n == 0:
            return
        if kind == RAW:
            dest[...] = stream.view(self.dtype)
            return
        y = self.expand(stream, n, param)
        if y.shape != (n,):
            raise CorruptCheckpointError(f"a {self.MAGIC.decode()} stream decodes to {y.size} elements, not {n}")
        with np.errstate(over="ignore", invalid="ignore"):
            dest[...] = y
        dest[idx] = vals
