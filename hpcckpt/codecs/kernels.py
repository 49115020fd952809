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
  rounding) kept verbatim as outliers.
* :func:`bitround`: numcodecs' ``BitRound`` (mantissa rounding, half to even).
"""

from __future__ import annotations

import math

import numpy as np

#: |q| above this is an outlier: q and q * 2^e stay exact in float64 and the deltas fit int64.
Q_LIMIT = float(1 << 52)
WIDTHS = (1, 2, 4, 8)


def shuffle(xp, data, elementsize: int):
    """Byte-shuffle a flat uint8 array whose length is a multiple of ``elementsize`` (a new array)."""
    if elementsize <= 1:
        return data.copy()
    return xp.ascontiguousarray(data.reshape(-1, elementsize).T).reshape(-1)


def unshuffle(xp, data, elementsize: int):
    """Inverse of :func:`shuffle`."""
    if elementsize <= 1:
        return data.copy()
    return xp.ascontiguousarray(data.reshape(elementsize, -1).T).reshape(-1)


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


def chunk_bound(xp, x64, finite, rel: float) -> float:
    """The absolute bound of a chunk for a relative bound ``rel``: rel * (max - min) over its finite values.

    Computed on halves so that the range cannot overflow, and shrunk by a few
    ulps so that the computed bound never exceeds the exact rel * range.
    """
    if not bool(finite.any()):
        return 0.0
    vals = x64[finite]
    hi, lo = float(vals.max()), float(vals.min())
    half_range = hi * 0.5 - lo * 0.5
    return (2.0 * rel) * half_range * (1.0 - 2.0 ** -48)


def quantize(xp, x, bound: float):
    """Quantize the flat float array ``x`` with absolute error bound ``bound``.

    Returns None when quantizing does not pay (no usable step, or more than a
    quarter of the elements would be outliers), else a dict with ``e`` (step
    exponent), ``ref`` (the first q, an int), ``width`` (bytes per delta),
    ``zz`` (zig-zag deltas as unsigned ints of that width, device array),
    ``idx`` (uint64 outlier positions) and ``vals`` (outlier values, x's dtype).
    """
    e = step_exponent(bound)
    if e is None:
        return None
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


def dequantize(xp, zz, ref: int, e: int, idx, vals, n: int, dtype):
    """Inverse of :func:`quantize`: the flat array of ``n`` elements of ``dtype``."""
    dtype = np.dtype(dtype)
    u = zz.astype(np.uint64)
    d = (u >> np.uint64(1)).view(np.int64) ^ -(u & np.uint64(1)).view(np.int64)
    q = xp.cumsum(d, dtype=np.int64) + np.int64(ref)
    out = xp.empty(n, dtype)
    if idx.size:
        keep = xp.ones(n, bool)
        keep[idx] = False
        out[keep] = reconstruct(xp, q, e, dtype)
        out[idx] = vals
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
