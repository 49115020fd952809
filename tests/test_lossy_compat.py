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


def _quantize(x, bound):
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


def reference_encode(codec, x):
    x = x.reshape(-1)
    bound = codec.bound
    if codec.mode == "rel":
        fin = x[np.isfinite(x)].astype(np.float64)
        bound = kernels.range_bound(float(fin.min()), float(fin.max()), bound) if fin.size else 0.0
    res = _quantize(x, bound)
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
