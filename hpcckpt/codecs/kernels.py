"""The filter kernels of the codecs, written once against an array module ``xp`` (numpy or cupy).

Every function here uses only the array API that numpy and CuPy share, so the
same code runs on the host (CI, CPU ranks) and on the device (GPU ranks), and
the bytes it produces are the same on both: the on-disk format is defined by
these functions, not by the device.  The lossless compressor that follows a
filter (zstd, lz4) is applied by the caller.

* :func:`shuffle` / :func:`unshuffle`: the byte shuffle of numcodecs'
  ``Shuffle`` codec (byte ``j`` of every element, then byte ``j+1``...).
* :func:`quantize` / :func:`dequantize`: the error-bounded quantizer of
  ``hpcckpt.quantize`` (see docs/compression.md): q = rint(x / 2^e), zig-zag
  deltas of q in the narrowest integer width, and the elements that the
  quantizer cannot reproduce within the bound (NaN, Inf, overflow, float
  rounding) or whose sign it would lose (``-0.0``, whose q is 0) kept
  verbatim as outliers.
* :func:`bitround`: numcodecs' ``BitRound`` (mantissa rounding, half to even).
"""

from __future__ import annotations

import math
import threading

import numpy as np

#: |q| above this is an outlier: q and q * 2^e stay exact in float64 and the deltas fit int64.
Q_LIMIT = float(1 << 52)
WIDTHS = (1, 2, 4, 8)


def shuffle(xp, data, elementsize: int):
    """Byte-shuffle a flat uint8 array whose length is a multiple of ``elementsize`` (a new array)."""
    if elementsize <= 1:
        return data.copy()
    return xp.ascontiguousarray(data.reshape(-1, elementsize).T).reshape(-1)


def unshuffle(xp, data, elementsize: int, work=None):
    """Inverse of :func:`shuffle` (into a reused buffer of ``work`` when given, else a new array)."""
    if elementsize <= 1:
        return data if work is not None else data.copy()
    if work is None:
        return xp.ascontiguousarray(data.reshape(elementsize, -1).T).reshape(-1)
    out = work.get(xp, "unshuffle", data.nbytes)
    out.reshape(-1, elementsize)[...] = data.reshape(elementsize, -1).T
    return out


def step_exponent(bound: float) -> int | None:
    """The exponent e of the quantization step 2^e: the largest power of two strictly below 2 * bound.

    Rounding to a multiple of 2^e then errs by at most 2^(e-1) < bound.  None
    when the bound is too small (or not finite) to quantize with.
    """
    if not (bound > 0.0 and math.isfinite(bound)):
        return None
    m, E = math.frexp(2.0 * bound)  # 2*bound = m * 2^E, 0.5 <= m < 1
    e = E - 2 if m == 0.5 else E - 1
    if e < -1000:  # subnormal territory: products stop being exact
        return None
    return min(e, 1023)


def reconstruct(xp, q, e: int, dtype):
    """q * 2^e in ``dtype``, exactly as every decoder computes it (float64 product, then one cast)."""
    dtype = np.dtype(dtype)
    y = q.astype(np.float64) * math.ldexp(1.0, e)
    if dtype.itemsize == 2:  # float16: through float32, a path that numpy and CUDA both round the same way
        y = y.astype(np.float32)
    return y.astype(dtype)


def value_range(xp, x) -> tuple[float, float]:
    """(min, max) of the array ``x`` as Python floats: two reductions, no temporaries (NaN if x holds a NaN)."""
    if x.size == 0:
        return 0.0, 0.0
    return float(x.min()), float(x.max())


def chunk_bound(xp, x64, finite, rel: float) -> float:
    """The absolute bound of a chunk for a relative bound ``rel``: rel * (max - min) over its finite values.

    Computed on halves so that the range cannot overflow, and shrunk by a few
    ulps so that the computed bound never exceeds the exact rel * range.
    (The slow path, for chunks holding NaN or Inf; see :func:`range_bound`.)
    """
    if not bool(finite.any()):
        return 0.0
    vals = x64[finite]
    return range_bound(float(vals.min()), float(vals.max()), rel)


def range_bound(lo: float, hi: float, rel: float) -> float:
    """rel * (hi - lo), computed as :func:`chunk_bound` does (halves, shrunk by a few ulps)."""
    half_range = hi * 0.5 - lo * 0.5
    return (2.0 * rel) * half_range * (1.0 - 2.0 ** -48)


# ---------------------------------------------------------------- working buffers

class Workspace(threading.local):
    """Per-thread scratch buffers reused from chunk to chunk (no page faults, no allocator churn).

    Codecs run in a thread pool, hence one set per thread.  Buffers above
    ``MAX_CACHED`` bytes are not kept.
    """

    MAX_CACHED = 256 << 20

    def __init__(self):
        self.buffers = {}

    def get(self, xp, key: str, nbytes: int):
        """A uint8 array of ``nbytes`` (module ``xp``); contents undefined; valid until the next get of ``key``."""
        slot = (id(xp), key)
        buf = self.buffers.get(slot)
        if buf is None or buf.nbytes < nbytes:
            buf = xp.empty(max(nbytes, 1 << 16), np.uint8)
            if nbytes <= self.MAX_CACHED:
                self.buffers[slot] = buf
        return buf[:nbytes]


WORK = Workspace()

#: Adding 1.5 * 2^52 to a float64 v with |v| < 2^51 rounds it to an integer (half to even, like rint)
#: and leaves rint(v) + 0x4338000000000000 as the bits of the sum: rint and the cast to int64 in one add.
_MAGIC = 1.5 * 2.0 ** 52
_MAGIC_BITS = 0x4338000000000000
_FAST_LIMIT = 2.0 ** 51
#: float16/32: significand bits and the exponent of the smallest subnormal; q * 2^e is exact in the
#: dtype when |q| < 2^p, e >= emin and |q| * 2^e <= the largest finite value.
_EXACT = {2: (11, -24), 4: (24, -149)}


def _fast_ok(dtype, e: int, lo: float, hi: float) -> bool:
    """True when no element of a chunk with finite values in [lo, hi] can be an outlier at step 2^e.

    Then every q = rint(x / 2^e) satisfies |q| < 2^51 and q * 2^e is exactly
    representable in ``dtype`` (float64: always; float16/32: see ``_EXACT``),
    so |x - reconstruct(q)| <= 2^(e-1) < bound for every element: exactly the
    elements the general path keeps, with the same q.
    """
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return False  # NaN or Inf somewhere
    s = math.ldexp(1.0, -e)
    top = max(abs(lo), abs(hi)) * s
    if not top < _FAST_LIMIT:
        return False
    if dtype.itemsize == 8:
        return e + 54 < 1023
    p, emin = _EXACT[dtype.itemsize]
    qa = max(abs(round(lo * s)), abs(round(hi * s)))  # rint is monotonic: the extreme q are those of lo and hi
    return qa < (1 << p) and e >= emin and math.ldexp(float(qa), e) <= float(np.finfo(dtype).max)


def negative_zero_mask(xp, x64):
    """Where the float64 array ``x64`` holds -0.0: those elements are outliers (q = 0 would restore +0.0)."""
    return (x64 == 0) & xp.signbit(x64)


def _has_negative_zero(xp, x, lo: float, hi: float, work) -> bool:
    """Whether the flat array ``x`` (finite values in [lo, hi]) holds a -0.0: one compare of its bit patterns.

    Only a chunk whose range includes 0 can hold one (the quantizer's fast path then falls back to the
    general one, which sets it aside as an outlier).
    """
    if not lo <= 0.0 <= hi:
        return False
    bits = x.view(np.dtype(x.dtype.str.replace("f", "u")))  # same byte order: compares values, not bytes
    hit = work.get(xp, "q-negzero", int(x.size)).view(np.bool_)
    xp.equal(bits, bits.dtype.type(1 << (8 * x.dtype.itemsize - 1)), out=hit)
    return bool(hit.any())


def _narrow_zigzag(xp, d, width: int, work):
    """Zig-zag encode the int64 deltas ``d`` into unsigned ints of ``width`` bytes (all of them fit), then shuffle.

    Works in the narrow type (fewer bytes per pass): d fits the signed type of
    that width, its doubled bit pattern wraps to the low bits of the zig-zag value.
    """
    n = d.size
    if width == 8:
        u = d.view(np.uint64)
        sign = (d >> 63).view(np.uint64)
        xp.left_shift(u, np.uint64(1), out=u)
        xp.bitwise_xor(u, sign, out=u)
        zz = u
    else:
        st, ut = np.dtype(f"<i{width}"), np.dtype(f"<u{width}")
        zz = work.get(xp, "q-narrow", n * width).view(ut)
        sd = zz.view(st)
        sd[...] = d  # values fit: a plain narrowing cast
        sign = (sd >> (8 * width - 1)).view(ut)
        xp.left_shift(zz, ut.type(1), out=zz)
        xp.bitwise_xor(zz, sign, out=zz)
    return zz


def quantize(xp, x, bound: float, lohi=None, work=None, shuffled: bool = False):
    """Quantize the flat float array ``x`` with absolute error bound ``bound``.

    Returns None when quantizing does not pay (no usable step, or more than a
    quarter of the elements would be outliers), else a dict with ``e`` (step
    exponent), ``ref`` (the first q, an int), ``width`` (bytes per delta),
    ``zz`` (zig-zag deltas as unsigned ints of that width, device array),
    ``idx`` (uint64 outlier positions) and ``vals`` (outlier values, x's dtype).
    With ``shuffled``, ``zz`` is already byte-shuffled (uint8).

    ``lohi``: (min, max) of x if known (see :func:`value_range`).  The fast path
    (all finite, no outliers possible: :func:`_fast_ok`) takes about six passes
    over the chunk, in reused buffers (``work``, a :class:`Workspace`; the
    result's arrays live in it until the thread's next call); chunks holding
    NaN/Inf, -0.0 or values the quantizer cannot reproduce take the general
    path.  Both give the same bytes.
    """
    e = step_exponent(bound)
    if e is None:
        return None
    work = WORK if work is None else work
    n = int(x.size)
    lo, hi = value_range(xp, x) if lohi is None else lohi
    if n == 0 or not _fast_ok(x.dtype, e, lo, hi) or _has_negative_zero(xp, x, lo, hi, work):
        res = _quantize_general(xp, x, bound, e)
        if res is not None and shuffled:
            res["zz"] = shuffle(xp, res["zz"].view(np.uint8), res["width"])
        return res
    # q = rint(x / 2^e): one multiply (exact, by a power of two; float16/32 cast on the fly) and one add
    f = work.get(xp, "q-float", 8 * n).view(np.float64)
    xp.multiply(x, math.ldexp(1.0, -e), out=f, dtype=np.float64)
    xp.add(f, _MAGIC, out=f)
    bits = f.view(np.int64)  # rint(x / 2^e) + _MAGIC_BITS
    ref = int(bits[0]) - _MAGIC_BITS
    d = work.get(xp, "q-delta", 8 * n).view(np.int64)
    d[0] = 0
    xp.subtract(bits[1:], bits[:-1], out=d[1:])
    dmin, dmax = int(d.min()), int(d.max())
    top = max(2 * dmax, -2 * dmin - 1, 0)  # the largest zig-zag value
    width = next(w for w in WIDTHS if w == 8 or top < (1 << (8 * w)))
    zz = _narrow_zigzag(xp, d, width, work)
    if shuffled:
        if width == 1:
            out = zz.view(np.uint8)
        else:  # into the float buffer, free again
            out = f.view(np.uint8)[:n * width]
            out.reshape(width, n)[...] = zz.view(np.uint8).reshape(n, width).T
        zz = out
    empty = xp.zeros(0, np.uint64)
    return {"e": e, "ref": ref, "width": width, "zz": zz, "idx": empty, "vals": x[:0]}


def _quantize_general(xp, x, bound: float, e: int):
    """The quantizer for any chunk (NaN, Inf, -0.0, overflow, float16/32 rounding): outliers kept verbatim."""
    n = x.size
    x64 = x.astype(np.float64, copy=False)
    with np.errstate(all="ignore"):  # overflow and NaN are expected here: they become outliers
        scaled = x64 * math.ldexp(1.0, -e)
        ok = xp.abs(scaled) <= Q_LIMIT  # False for NaN and Inf
        if not bool(ok.all()):
            scaled[~ok] = 0.0
        q = xp.rint(scaled, out=scaled)
        # For float64 with q * 2^e far from overflow, q * 2^e is exact and |x - q * 2^e| <= 2^(e-1) < bound:
        # no check needed.  Otherwise (float32/16 casts, huge steps) compare with the decoder's reconstruction.
        if x.dtype.itemsize != 8 or e + 54 >= 1023:
            err = xp.abs(reconstruct(xp, q, e, x.dtype).astype(np.float64) - x64)
            ok &= err < bound  # strict: fl(err) < bound implies the exact error is <= bound
    ok &= ~negative_zero_mask(xp, x64)  # -0.0 keeps its sign, as SZ3 and ZFP keep it (docs/compression.md)
    idx = xp.nonzero(~ok)[0].astype(np.uint64)
    if 4 * int(idx.size) > n:
        return None
    qv = (q[ok] if idx.size else q).astype(np.int64)
    ref = int(qv[0]) if qv.size else 0
    d = xp.empty_like(qv)
    if qv.size:
        d[0] = 0
        d[1:] = qv[1:] - qv[:-1]
    zz = ((d << 1) ^ (d >> 63)).view(np.uint64)
    top = int(zz.max()) if zz.size else 0
    width = next(w for w in WIDTHS if w == 8 or top < (1 << (8 * w)))
    return {"e": e, "ref": ref, "width": width, "zz": zz.astype(np.dtype(f"<u{width}")),
            "idx": idx, "vals": x[idx]}


def dequantize(xp, zz, ref: int, e: int, idx, vals, n: int, dtype, out=None, work=None):
    """Inverse of :func:`quantize`: the flat array of ``n`` elements of ``dtype`` (written into ``out`` if given)."""
    dtype = np.dtype(dtype)
    work = WORK if work is None else work
    if out is None:
        out = xp.empty(n, dtype)
    m = int(zz.size)
    # unzig-zag in the narrow type: (u >> 1) ^ -(u & 1)
    ut, st = np.dtype(f"u{zz.dtype.itemsize}"), np.dtype(f"i{zz.dtype.itemsize}")
    u = work.get(xp, "dq-narrow", m * ut.itemsize).view(ut)
    xp.bitwise_and(zz, ut.type(1), out=u)
    sign = u.view(st)
    xp.negative(sign, out=sign)
    xp.bitwise_xor(sign, (zz >> ut.type(1)).view(st), out=sign)
    q = work.get(xp, "dq-q", 8 * m).view(np.int64)
    xp.cumsum(sign, dtype=np.int64, out=q)
    if ref:
        xp.add(q, np.int64(ref), out=q)
    if idx.size:
        keep = xp.ones(n, bool)
        keep[idx] = False
        out[keep] = reconstruct(xp, q, e, dtype)
        out[idx] = vals
    elif dtype.itemsize == 8:
        xp.multiply(q, math.ldexp(1.0, e), out=out, dtype=np.float64)
    elif dtype.itemsize == 4:
        xp.multiply(q, math.ldexp(1.0, e), out=out, dtype=np.float64, casting="unsafe")
    else:
        out[...] = reconstruct(xp, q, e, dtype)
    return out


def bitround(xp, x, keepbits: int):
    """numcodecs BitRound on a float16/32/64 array: keep ``keepbits`` mantissa bits, round half to even."""
    bits = {2: 10, 4: 23, 8: 52}[x.dtype.itemsize]
    if keepbits >= bits:
        return x.copy()
    utype = np.dtype(f"u{x.dtype.itemsize}")
    b = x.view(utype)
    maskbits = bits - keepbits
    one = utype.type(1)
    mask = utype.type(((1 << (8 * x.dtype.itemsize)) - 1) - ((1 << maskbits) - 1))
    half_quantum1 = utype.type((1 << (maskbits - 1)) - 1)
    b = b + (((b >> utype.type(maskbits)) & one) + half_quantum1)
    b = b & mask
    return b.view(x.dtype)
