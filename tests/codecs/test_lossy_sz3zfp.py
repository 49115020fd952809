"""SZ3 and ZFP (hpcckpt.codecs.SZ3, hpcckpt.codecs.ZFP): the bound on every element, hostile data, strict configs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from hpcckpt.codecs import SZ3, ZFP, from_config, resolve
from hpcckpt.errors import CheckpointError, CorruptCheckpointError
from hpcckpt.testing import CodecTests
from test_lossy import rel_bound  # the bound of a rel mode, as the own quantizer's tests compute it

pytest.importorskip("pysz")
pytest.importorskip("zfpy")

DTYPES = [np.dtype("<f2"), np.dtype("<f4"), np.dtype("<f8"), np.dtype(">f8"), np.dtype(">f4")]
F4, F8 = np.dtype("<f4"), np.dtype("<f8")


def round_trip(x, spec):
    codec = resolve(spec, x.dtype)
    stored = codec.encode(np.ascontiguousarray(x))
    out = np.empty(x.nbytes, np.uint8)
    from_config(json.loads(json.dumps(codec.config)), x.dtype).decode(stored, out)
    return out.view(x.dtype).reshape(x.shape), stored


def check(x, y, bound=None, pointwise=False, exact=False):
    x, y = x.reshape(-1), y.reshape(-1)
    fin = np.isfinite(x)
    assert x[~fin].tobytes() == y[~fin].tobytes()  # NaN (payloads too) and +-Inf bit for bit
    assert np.all(np.isfinite(y[fin]))
    if exact:
        assert x.tobytes() == y.tobytes()
        return
    negative_zero = fin & (x == 0) & np.signbit(x)  # -0.0 keeps its sign (+0.0 may come back as -tiny)
    assert np.all(np.signbit(y[negative_zero])) or bound is None
    if bound is None:
        return
    x64, y64 = x[fin].astype(np.float64), y[fin].astype(np.float64)
    err = np.abs(x64 - y64)
    limit = bound * np.abs(x64) if pointwise else bound
    assert np.all(err <= limit), (err.max(), bound)


@st.composite
def arrays(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=5, min_side=1, max_side=24))
    scale = draw(st.sampled_from([1e-8, 1e-3, 1.0, 1e3, 1e13]))
    kind = draw(st.sampled_from(["smooth", "noise", "any", "constant"]))
    if kind == "any":  # every bit pattern hypothesis can think of: subnormals, NaN, Inf, -0.0
        x = draw(hnp.arrays(dtype, shape, elements=st.floats(width=8 * dtype.itemsize, allow_nan=True)))
    else:
        n = int(np.prod(shape))
        rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
        if kind == "constant":
            base = np.full(n, rng.normal())
        else:
            base = np.sin(np.linspace(0, rng.uniform(1, 30), n)) if kind == "smooth" else rng.normal(size=n)
        with np.errstate(over="ignore"):
            x = (base * scale + rng.normal(size=n) * scale * 1e-3 * (kind != "constant")).astype(dtype)
            x = x.reshape(shape)
        specials = draw(st.lists(st.tuples(st.integers(0, n - 1), st.sampled_from(
            [np.nan, np.inf, -np.inf, 0.0, -0.0, 5e-324, -1e-310])), max_size=5))
        for i, v in specials:
            x.reshape(-1)[i] = v
    return x


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(x=arrays(), bound=st.sampled_from([1e-300, 1e-12, 1e-5, 1e-3, 0.1, 1.0, 1e10]))
def test_sz3_absolute_bound_holds_for_every_element(x, bound):
    check(x, round_trip(x, SZ3(abs=bound))[0], bound)


@SETTINGS
@given(x=arrays(), rel=st.sampled_from([1e-12, 1e-6, 1e-4, 1e-2, 0.25]))
def test_sz3_relative_bound_holds_for_every_element(x, rel):
    check(x, round_trip(x, SZ3(rel=rel))[0], rel_bound(x, rel))


@SETTINGS
@given(x=arrays(), rel=st.sampled_from([1e-12, 1e-6, 1e-3, 1e-2, 0.3]))
def test_sz3_pointwise_bound_holds_for_every_element(x, rel):
    check(x, round_trip(x, SZ3(pw_rel=rel))[0], rel, pointwise=True)


@SETTINGS
@given(x=arrays(), tol=st.sampled_from([1e-300, 1e-12, 1e-5, 1e-3, 0.1, 1.0, 1e10]))
def test_zfp_accuracy_bound_holds_for_every_element(x, tol):
    check(x, round_trip(x, ZFP(accuracy=tol))[0], tol)


@SETTINGS
@given(x=arrays())
def test_zfp_reversible_is_bit_exact(x):
    check(x, round_trip(x, ZFP(reversible=True))[0], exact=True)


@SETTINGS
@given(x=arrays(), spec=st.sampled_from([ZFP(precision=1), ZFP(precision=20), ZFP(rate=1), ZFP(rate=2), ZFP(rate=12.5), ZFP(rate=16)]))
def test_zfp_rate_and_precision_keep_specials_and_stay_finite(x, spec):
    check(x, round_trip(x, spec)[0])


@settings(max_examples=30, deadline=None)
@given(bits=st.lists(st.integers(0, 2 ** 64 - 1), min_size=1, max_size=200), bound=st.floats(1e-300, 1e300))
def test_arbitrary_bit_patterns(bits, bound):
    x = np.array(bits, np.uint64).view(np.float64)
    check(x, round_trip(x, SZ3(abs=bound))[0], bound)
    check(x, round_trip(x, ZFP(accuracy=bound))[0], bound)
    check(x, round_trip(x, SZ3(pw_rel=0.01))[0], 0.01, pointwise=True)


@pytest.mark.parametrize("dtype", ["<i4", "<i8", ">i4"])
def test_zfp_reversible_keeps_integers(dtype):
    x = (np.arange(3000) * 7919 % 1000 - 500).astype(dtype).reshape(30, 100)
    check(x, round_trip(x, ZFP(reversible=True))[0], exact=True)


def test_smooth_fields_compress():
    z, y, x = np.mgrid[0:32, 0:32, 0:64]
    f = np.sin(x / 9.0) * np.cos(y / 7.0) + z / 40.0
    for spec in (SZ3(abs=1e-3), SZ3(rel=1e-4), ZFP(accuracy=1e-3), ZFP(rate=8)):
        y_, stored = round_trip(f, spec)
        assert f.nbytes / stored.nbytes > 4, spec
    y_, stored = round_trip(np.full((64, 64), 3.25), SZ3(rel=1e-3))
    assert np.array_equal(y_, np.full((64, 64), 3.25)) and stored.nbytes < 1000


def test_zero_regions_are_not_set_aside():
    """SZ3 and ZFP blur a +0.0 region into tiny values of either sign: within the bound, so not set aside.

    (Setting aside every +0.0 that comes back negative would make SZ3's ratio on a field with zero regions
    collapse from ~1000 to ~7: docs/compression.md, "Zero regions and the sign of zero".)
    """
    f = np.zeros((256, 256))
    f[:, 128:] = np.sin(np.arange(128) / 9.0)
    f[:64, :64], f[200, 10] = 1.0, -0.0
    for spec in (SZ3(abs=1e-3), ZFP(accuracy=1e-3)):
        y, stored = round_trip(f, spec)
        check(f, y, 1e-3)
        assert np.signbit(y[200, 10])
        k = int.from_bytes(stored[16:24].tobytes(), "little")  # the elements set aside (bounded.HEADER)
        assert k <= 1, (spec, k)


def test_a_chunk_mostly_out_of_reach_is_stored_raw():
    x = np.random.default_rng(1).normal(size=1000) * 1e13  # abs 1e-300 is beyond float64's resolution
    y, stored = round_trip(x, SZ3(abs=1e-300))
    assert y.tobytes() == x.tobytes() and stored.nbytes <= x.nbytes + 64


def test_empty_and_scalar_chunks():
    for spec in (SZ3(abs=1e-3), ZFP(accuracy=1e-3), ZFP(reversible=True)):
        for x in (np.zeros(0), np.zeros((3, 0)), np.array(2.5), np.array([np.nan])):
            y, _ = round_trip(x, spec)
            assert y.tobytes() == x.tobytes() or np.abs(y - x).max() <= 1e-3


# ---------------------------------------------------------------- specs and configs

@pytest.mark.parametrize("make", [lambda: SZ3(), lambda: SZ3(abs=1, rel=1), lambda: SZ3(abs=0), lambda: SZ3(abs=-1),
                                  lambda: SZ3(abs=float("nan")), lambda: SZ3(abs=True), lambda: SZ3(rel=0.5),
                                  lambda: SZ3(pw_rel=0.5), lambda: SZ3(abs="1"), lambda: ZFP(),
                                  lambda: ZFP(accuracy=1, rate=2), lambda: ZFP(precision=0), lambda: ZFP(precision=65),
                                  lambda: ZFP(precision=2.0), lambda: ZFP(rate=0), lambda: ZFP(rate=True),
                                  lambda: ZFP(reversible=False), lambda: ZFP(accuracy=float("inf"))])
def test_bad_specs_are_refused(make):
    with pytest.raises(CheckpointError):
        make()


@pytest.mark.parametrize("cfg", [
    {"id": "hpcckpt.sz3"}, {"id": "hpcckpt.sz3", "abs": 1e-3, "rel": 1e-3}, {"id": "hpcckpt.sz3", "abs": "x"},
    {"id": "hpcckpt.sz3", "abs": 1e-3, "algorithm": 1}, {"id": "hpcckpt.sz3", "rel": 0.7},
    {"id": "hpcckpt.sz3", "abs": None}, {"id": "hpcckpt.sz3", "abs": [1]}, {"id": "hpcckpt.sz3", "pw_rel": -1},
    {"id": "hpcckpt.zfp"}, {"id": "hpcckpt.zfp", "rate": 100}, {"id": "hpcckpt.zfp", "precision": 1.5},
    {"id": "hpcckpt.zfp", "reversible": 1}, {"id": "hpcckpt.zfp", "accuracy": 0},
    {"id": "hpcckpt.zfp", "accuracy": 1e-3, "header": False}])
def test_untrusted_configs_are_validated(cfg):
    with pytest.raises(CorruptCheckpointError):
        from_config(cfg, F8)


@pytest.mark.parametrize("spec", [SZ3(abs=1e-3), ZFP(accuracy=1e-3), ZFP(rate=8)])
@pytest.mark.parametrize("dtype", ["<i4", "<u2", "<c16", "|b1", "<i8"])
def test_unsupported_dtypes_are_refused_at_save(spec, dtype):
    with pytest.raises(CheckpointError, match="float16/32/64"):
        resolve(spec, np.dtype(dtype))


def test_zfp_rate_above_the_dtype_bits_is_refused():
    with pytest.raises(CheckpointError):
        resolve(ZFP(rate=40), F4)
    resolve(ZFP(rate=40), F8)


@pytest.mark.parametrize("spec", [SZ3(abs=1e-3), SZ3(rel=1e-4), SZ3(pw_rel=1e-3), ZFP(accuracy=1e-3),
                                  ZFP(precision=12), ZFP(reversible=True)])
def test_damaged_streams_never_crash_or_overfill(spec):
    rng = np.random.default_rng(5)
    x = np.cumsum(rng.normal(size=(20, 30)), axis=1)
    x[3, 4] = np.nan
    codec = resolve(spec, x.dtype)
    stored = codec.encode(x)
    for trial in range(200):
        bad = stored.copy()
        for _ in range(rng.integers(1, 4)):
            bad[rng.integers(0, bad.size)] = rng.integers(0, 256)
        if trial % 3 == 0:
            bad = bad[:rng.integers(0, bad.size)]
        guard = np.zeros(x.nbytes + 64, np.uint8)
        out = guard[:x.nbytes]
        try:
            codec.decode(bad, out)
        except CorruptCheckpointError:
            pass
        assert not guard[x.nbytes:].any()


# ---------------------------------------------------------------- the shipped conformance suite

class _Bounded(CodecTests):
    bound = 0.0
    pointwise = False

    def assert_decoded(self, original, decoded):
        if "rel" in self.config:
            check(original, decoded, rel_bound(original, self.config["rel"]))
        elif self.config.get("reversible"):
            check(original, decoded, exact=True)
        else:
            check(original, decoded, self.bound, self.pointwise)


class TestSZ3Abs(_Bounded):
    config, dtype, bound = {"id": "hpcckpt.sz3", "abs": 1e-3}, F8, 1e-3


class TestSZ3Rel(_Bounded):
    config, dtype = {"id": "hpcckpt.sz3", "rel": 1e-4}, F4


class TestSZ3PwRel(_Bounded):
    config, dtype, bound, pointwise = {"id": "hpcckpt.sz3", "pw_rel": 1e-3}, F8, 1e-3, True


class TestZFPAccuracy(_Bounded):
    config, dtype, bound = {"id": "hpcckpt.zfp", "accuracy": 1e-3}, F4, 1e-3


class TestZFPReversible(_Bounded):
    config, dtype = {"id": "hpcckpt.zfp", "reversible": True}, F8


class TestZFPRate(_Bounded):
    config, dtype, bound = {"id": "hpcckpt.zfp", "rate": 16.0}, F8, None
