"""The error bound of hpcckpt.codecs.Lossy holds for every element; NaN and Inf come back bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from hpcckpt.codecs import Lossy, from_config, resolve
from hpcckpt.codecs import kernels

pytest.importorskip("numcodecs")

DTYPES = [np.dtype("<f2"), np.dtype("<f4"), np.dtype("<f8"), np.dtype(">f8")]


def round_trip(x, spec):
    codec = resolve(spec, x.dtype)
    stored = codec.encode(np.ascontiguousarray(x))
    out = np.empty(x.nbytes, np.uint8)
    from_config(codec.config, x.dtype).decode(stored, out)
    return out.view(x.dtype).reshape(x.shape), stored


def check(x, y, bound):
    x, y = x.reshape(-1), y.reshape(-1)
    fin = np.isfinite(x)
    # non-finite values are restored bit for bit (NaN payloads and signs included)
    assert x[~fin].tobytes() == y[~fin].tobytes()
    assert np.all(np.isfinite(y[fin]))
    err = np.abs(x[fin].astype(np.float64) - y[fin].astype(np.float64))
    assert err.size == 0 or err.max() <= bound, (err.max(), bound)
    # -0.0 keeps its sign, as SZ3 and ZFP keep it (+0.0 and tiny values may come back as either zero)
    negative_zero = (x == 0) & np.signbit(x)
    assert np.all(np.signbit(y[negative_zero])), np.nonzero(negative_zero & ~np.signbit(y))


def rel_bound(x, rel):
    fin = x[np.isfinite(x)].astype(np.float64)
    return rel * (fin.max() - fin.min()) if fin.size else 0.0


@st.composite
def arrays(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=40))
    scale = draw(st.sampled_from([1e-30, 1e-6, 1.0, 1e3, 1e30, 1e300]))
    kind = draw(st.sampled_from(["smooth", "noise", "any"]))
    if kind == "any":  # every bit pattern hypothesis can think of, special values included
        x = draw(hnp.arrays(dtype, shape, elements=st.floats(width=8 * dtype.itemsize, allow_nan=True)))
    else:
        n = int(np.prod(shape))
        rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
        base = np.sin(np.linspace(0, rng.uniform(1, 30), n)) if kind == "smooth" else rng.normal(size=n)
        with np.errstate(over="ignore"):
            x = (base * scale + rng.normal(size=n) * scale * 1e-3).astype(dtype).reshape(shape)
        specials = draw(st.lists(st.tuples(st.integers(0, n - 1),
                                           st.sampled_from([np.nan, np.inf, -np.inf, 0.0, -0.0])), max_size=5))
        for i, v in specials:
            x.reshape(-1)[i] = v
    return x


@settings(max_examples=70, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=arrays(), bound=st.sampled_from([1e-300, 1e-12, 1e-5, 1e-3, 0.1, 1.0, 1e10, 1e300]))
def test_absolute_bound_holds_for_every_element(x, bound):
    y, _ = round_trip(x, Lossy(abs=bound))
    check(x, y, bound)


@settings(max_examples=70, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=arrays(), rel=st.sampled_from([1e-12, 1e-6, 1e-4, 1e-2, 0.25]))
def test_relative_bound_holds_for_every_element(x, rel):
    y, _ = round_trip(x, Lossy(rel=rel))
    check(x, y, rel_bound(x, rel))


@settings(max_examples=40, deadline=None)
@given(bits=st.lists(st.integers(0, 2 ** 64 - 1), min_size=1, max_size=200), bound=st.floats(1e-300, 1e300))
def test_arbitrary_bit_patterns(bits, bound):
    x = np.array(bits, np.uint64).view(np.float64)
    y, _ = round_trip(x, Lossy(abs=bound))
    check(x, y, bound)


def test_step_is_the_largest_power_of_two_below_twice_the_bound():
    for bound in (1e-4, 0.5, 1.0, 3.0, 2.0 ** -20, 1e300):
        e = kernels.step_exponent(bound)
        assert 2.0 ** e < 2 * bound <= 2.0 ** (e + 1)
    assert kernels.step_exponent(0.0) is None and kernels.step_exponent(float("inf")) is None


def test_lossy_compresses_smooth_fields():
    x = np.sin(np.linspace(0, 10, 1 << 18)) + np.random.default_rng(0).normal(scale=1e-6, size=1 << 18)
    _, stored4 = round_trip(x, Lossy(rel=1e-4))
    _, stored2 = round_trip(x, Lossy(rel=1e-2))
    assert x.nbytes / stored4.nbytes > 5 and stored2.nbytes < stored4.nbytes


def test_constant_chunk_with_relative_bound_is_lossless():
    x = np.full(1000, 3.25)
    y, _ = round_trip(x, Lossy(rel=1e-3))
    assert np.array_equal(x, y)


@pytest.mark.parametrize("dtype", [d.str for d in DTYPES] + [">f4"])
@pytest.mark.parametrize("spec", [Lossy(abs=1e-3), Lossy(rel=1e-4), Lossy(abs=1e-300)], ids=str)
def test_negative_zero_keeps_its_sign(dtype, spec):
    """-0.0 came back as +0.0 (q = 0); now it is an outlier, restored bit for bit, in both quantizer paths."""
    smooth = np.sin(np.linspace(0, 3, 4000)).astype(dtype)  # range includes 0: the fast path checks for -0.0
    positive = (np.linspace(1, 2, 4000)).astype(dtype)  # no zero at all: the fast path needs no check
    special = smooth.copy()
    special[5] = np.nan  # NaN: the general path
    for x in (smooth, special, positive):
        x = x.copy()
        if x is not positive:
            x[[0, 17, 3999]] = -0.0
            x[18] = 0.0
        y, stored = round_trip(x, spec)
        check(x, y, spec.bound if spec.mode == "abs" else rel_bound(x, spec.bound))
        nz = (x == 0) & np.signbit(x)
        assert np.array_equal(np.signbit(y[nz]), np.ones(nz.sum(), bool))
        assert not np.signbit(y[18]) or x is positive
        if stored[4] == 1:  # quantized: the -0.0 are among the outliers
            n_out = int(np.frombuffer(stored[28:36].tobytes(), "<u8")[0])
            assert n_out >= nz.sum()


def test_auto_lossy_keeps_negative_zero_when_it_picks_the_quantizer(tmp_path, monkeypatch):
    import hpcckpt
    from hpcckpt.codecs import AutoLossy, auto_lossy
    from hpcckpt.mpi.collective import SerialComm

    monkeypatch.setattr(auto_lossy, "_installed", lambda module: False)  # no pysz/zfpy (or a GPU rank): the quantizer
    x = np.sin(np.linspace(0, 3, 40000)).reshape(200, 200)
    x[0, 0] = x[57, 3] = x[199, 199] = -0.0
    path = str(tmp_path / "ck")
    hpcckpt.save({"x": hpcckpt.Block(x)}, path, SerialComm(), codec=AutoLossy(abs=1e-3))
    assert hpcckpt.open(path).variables["x"].codec["id"] == "hpcckpt.quantize"
    y = np.zeros_like(x)
    hpcckpt.load({"x": hpcckpt.Block(y)}, path, SerialComm())
    check(x, y, 1e-3)
    assert np.signbit(y[[0, 57, 199], [0, 3, 199]]).all()
