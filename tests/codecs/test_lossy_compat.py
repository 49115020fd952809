"""The fast lossy quantizer writes the very bytes of the straightforward one, and decodes like it.

``reference_encode``/``reference_decode`` below are the first implementation of
``hpcckpt.quantize`` (docs/compression.md), one numpy step per line of the
algorithm, kept here as the definition the optimised kernels
(hpcckpt/codecs/kernels.py: fused multiply-and-round, narrow zig-zag, reused
buffers) are checked against, byte for byte, on every kind of input the error
bound tests use.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcckpt.codecs import Lossy, resolve
from hpcckpt.codecs import kernels

from test_lossy import arrays

pytest.importorskip("numcodecs")

HEADER = struct.Struct("<4sBBhIqQQQQd")


def _reconstruct(q, e, dtype):
    y = q.astype(np.float64) * math.ldexp(1.0, e)
    if dtype.itemsize == 2:
        y = y.astype(np.float32)
    return y.astype(dtype)


def _quantize(x, bound, keep_negative_zero=True):
    e = kernels.step_exponent(bound)
    if e is None:
        return None
    n = x.size
    x64 = x.astype(np.float64)
    with np.errstate(all="ignore"):
        scaled = x64 * math.ldexp(1.0, -e)
        ok = np.abs(scaled) <= kernels.Q_LIMIT
        scaled[~ok] = 0.0
        q = np.rint(scaled)
        if x.dtype.itemsize != 8 or e + 54 >= 1023:
            ok &= np.abs(_reconstruct(q, e, x.dtype).astype(np.float64) - x64) < bound
    if keep_negative_zero:  # -0.0 is an outlier (its q is 0, which restores +0.0); before that rule it was not
        ok &= ~((x64 == 0) & np.signbit(x64))
    idx = np.nonzero(~ok)[0].astype(np.uint64)
    if 4 * idx.size > n:
        return None
    qv = q[ok].astype(np.int64)
    d = np.diff(qv, prepend=qv[:1])
    zz = ((d << 1) ^ (d >> 63)).view(np.uint64)
    top = int(zz.max()) if zz.size else 0
    width = next(w for w in kernels.WIDTHS if w == 8 or top < (1 << (8 * w)))
    return e, int(qv[0]) if qv.size else 0, width, zz.astype(f"<u{width}"), idx, x[idx]


def _shuffle(b, w):
    return b.reshape(-1, w).T.copy().reshape(-1)


def reference_encode(codec, x, keep_negative_zero=True):
    """The stored bytes of ``x``; ``keep_negative_zero=False``: those the encoder wrote before -0.0 was an outlier."""
    x = x.reshape(-1)
    bound = codec.bound
    if codec.mode == "rel":
        fin = x[np.isfinite(x)].astype(np.float64)
        bound = kernels.range_bound(float(fin.min()), float(fin.max()), bound) if fin.size else 0.0
    res = _quantize(x, bound, keep_negative_zero)
    comp = codec.compressor
    if res is None:
        parts, fields = [comp.compress(_shuffle(x.view(np.uint8), x.dtype.itemsize))], (0, 0, 0, 0, 0)
    else:
        e, ref, width, zz, idx, vals = res
        outl = np.concatenate([idx.astype("<u8").view(np.uint8), vals.view(np.uint8)])
        parts, fields = [comp.compress(_shuffle(zz.view(np.uint8), width)), comp.compress(outl)], \
            (1, width, e, ref, idx.size)
    lens = [p.nbytes for p in parts] + [0]
    mode, width, e, ref, n_out = fields
    head = HEADER.pack(b"HCQ1", mode, width, e, 0, ref, x.size, n_out, lens[0], lens[1], float(bound))
    return np.frombuffer(head + b"".join(p.tobytes() for p in parts), np.uint8)


def reference_decode(codec, stored, dtype, n):
    _, mode, width, e, _, ref, _, n_out, len_q, len_o, _ = HEADER.unpack_from(stored, 0)
    body = stored[HEADER.size:]
    dtype = np.dtype(dtype)
    if mode == 0:
        raw = np.empty(n * dtype.itemsize, np.uint8)
        codec.compressor.decompress(body[:len_q], raw)
        return raw.reshape(dtype.itemsize, -1).T.copy().view(dtype).reshape(-1)
    zz = np.empty((n - n_out) * width, np.uint8)
    codec.compressor.decompress(body[:len_q], zz)
    outl = np.empty(n_out * (8 + dtype.itemsize), np.uint8)
    codec.compressor.decompress(body[len_q:], outl)
    u = zz.reshape(width, -1).T.copy().view(f"<u{width}").reshape(-1).astype(np.uint64)
    d = (u >> np.uint64(1)).view(np.int64) ^ -(u & np.uint64(1)).view(np.int64)
    q = np.cumsum(d) + np.int64(ref)
    out = np.empty(n, dtype)
    keep = np.ones(n, bool)
    keep[outl[:8 * n_out].view("<u8").astype(np.int64)] = False
    out[keep] = _reconstruct(q, e, dtype)
    out[~keep] = outl[8 * n_out:].view(dtype)
    return out


def _same(x, spec):
    codec = resolve(spec, x.dtype)
    got = codec.encode(np.ascontiguousarray(x))
    ref = reference_encode(codec, x)
    assert got.tobytes() == ref.tobytes()
    out = np.empty(x.nbytes, np.uint8)
    codec.decode(got, out)
    assert out.tobytes() == reference_decode(codec, got, x.dtype, x.size).tobytes()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=arrays(), bound=st.sampled_from([1e-300, 1e-12, 1e-5, 1e-3, 0.1, 1.0, 1e10, 1e300]),
       rel=st.sampled_from([None, 1e-12, 1e-6, 1e-4, 1e-2, 0.25]))
def test_fast_quantizer_writes_the_reference_bytes(x, bound, rel):
    _same(x, Lossy(rel=rel) if rel else Lossy(abs=bound))


@pytest.mark.parametrize("dtype", ["<f2", "<f4", "<f8", ">f4", ">f8"])
@pytest.mark.parametrize("rel", [1e-2, 1e-4, 1e-6, 1e-9])
@pytest.mark.parametrize("kind", ["smooth", "random", "wide", "huge", "edge"])
def test_fast_quantizer_widths_and_edges(dtype, rel, kind):
    rng = np.random.default_rng(7)
    n = 5000
    with np.errstate(over="ignore"):
        x = {"smooth": np.sin(np.linspace(0, 9, n)) * 3 + rng.normal(scale=1e-4, size=n),
             "random": rng.normal(size=n),
             "wide": rng.normal(size=n) * 10.0 ** rng.integers(-8, 8, size=n),
             "huge": rng.normal(size=n) * float(np.finfo(dtype).max) / 4,
             "edge": np.r_[np.full(n // 2, np.finfo(dtype).max), np.full(n - n // 2, np.finfo(dtype).min)]}[kind]
        x = x.astype(dtype)
    _same(x, Lossy(rel=rel))
    _same(x, Lossy(abs=rel))


def test_magic_rounding_is_rint():
    v = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.0 ** 51 - 0.5, -(2.0 ** 51) + 0.5, -0.0, 3.4999999])
    bits = (v + kernels._MAGIC).view(np.int64) - kernels._MAGIC_BITS
    assert np.array_equal(bits, np.rint(v).astype(np.int64))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=arrays(), bound=st.sampled_from([1e-12, 1e-5, 1e-3, 0.1, 1.0]),
       rel=st.sampled_from([None, 1e-6, 1e-2]))
def test_streams_written_before_negative_zero_was_kept_still_decode(x, bound, rel):
    """Keeping -0.0 changed which elements are outliers, not the layout: an older stream (-0.0 quantized to
    q = 0) decodes as the layout says, a -0.0 in it as +0.0 (its sign was not stored)."""
    codec = resolve(Lossy(rel=rel) if rel else Lossy(abs=bound), x.dtype)
    old = reference_encode(codec, x, keep_negative_zero=False)
    out = np.empty(x.nbytes, np.uint8)
    codec.decode(old, out)
    assert out.tobytes() == reference_decode(codec, old, x.dtype, x.size).tobytes()


def test_an_old_stream_with_negative_zeros_decodes_them_as_positive_zeros():
    x = np.sin(np.linspace(0, 3, 1000))
    x[[0, 10]] = -0.0
    codec = resolve(Lossy(abs=1e-3), x.dtype)
    old, new = reference_encode(codec, x, keep_negative_zero=False), codec.encode(x)
    assert HEADER.unpack_from(old, 0)[7] == 0 and HEADER.unpack_from(new, 0)[7] == 2  # n_out: the two -0.0
    y_old, y_new = np.empty(x.nbytes, np.uint8), np.empty(x.nbytes, np.uint8)
    codec.decode(old, y_old)
    codec.decode(new, y_new)
    y_old, y_new = y_old.view(x.dtype), y_new.view(x.dtype)
    assert y_old[0] == 0 and not np.signbit(y_old[[0, 10]]).any()
    assert np.signbit(y_new[[0, 10]]).all()
    assert np.array_equal(y_old[np.r_[1:10, 11:1000]], y_new[np.r_[1:10, 11:1000]])
