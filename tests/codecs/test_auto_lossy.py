"""AutoLossy: the lossy codec per variable picked at the user's bound (the decision is pure; the bound always holds)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import hpcckpt
from hpcckpt.codecs import AutoLossy, auto, auto_lossy, pipeline, resolve, spec_to_json
from hpcckpt.errors import CheckpointError
from test_lossy import check as check_quantized
from test_lossy import rel_bound
from test_lossy_sz3zfp import SETTINGS, arrays, check, round_trip  # skips where pysz or zfpy are missing


def measurement(nbytes, sample, seconds, stored, bw=1e9):
    return {"bytes": nbytes, "bw": bw, "sample": sample, "seconds": dict(seconds), "stored": dict(stored)}


@st.composite
def rank_measurements(draw):
    """Per-rank measurements of some candidates (every rank measures the quantizer, as measure() does)."""
    ranks = draw(st.integers(1, 4))
    out = []
    for _ in range(ranks):
        names = ["quantize"] + draw(st.lists(st.sampled_from(["sz3", "zfp"]), unique=True))
        sample = draw(st.integers(1, 1 << 20))
        out.append(measurement(draw(st.integers(sample, 1 << 30)), sample,
                               {n: draw(st.floats(1e-6, 1.0)) for n in names},
                               {n: draw(st.integers(1, 2 * sample)) for n in names}, draw(st.floats(1e6, 1e10))))
    return out


@given(ms=rank_measurements(), mode=st.sampled_from(["abs", "rel"]), threads=st.integers(1, 8))
def test_decide_picks_the_least_estimated_save_time_among_what_every_rank_measured(ms, mode, threads):
    spec = AutoLossy(**{mode: 1e-3}).config()
    chosen = auto_lossy.decide(spec, np.float64, ms, threads)
    common = set.intersection(*(set(m["seconds"]) for m in ms))
    total, bw = sum(m["bytes"] for m in ms), float(np.mean([m["bw"] for m in ms]))
    est = {n: auto.estimate(ms, n, total, bw, threads) for n in common}
    name = {"hpcckpt.quantize": "quantize", "hpcckpt.sz3": "sz3", "hpcckpt.zfp": "zfp"}[chosen["id"]]
    assert name in common and est[name] == min(est.values())
    assert chosen == auto_lossy.config_of(name, mode, 1e-3)
    assert chosen.get(mode, chosen.get("accuracy")) == 1e-3
    assert auto_lossy.decide(spec, np.float64, json.loads(json.dumps(ms)), threads) == chosen  # what rank 0 receives


def test_decide_follows_ratio_on_slow_storage_and_speed_on_fast_storage():
    quick = {"quantize": 0.001, "sz3": 0.002}
    stored = {"quantize": 4000, "sz3": 1000}
    slow = [measurement(1 << 30, 100_000, quick, stored, bw=1e6)]
    fast = [measurement(1 << 30, 100_000, quick, stored, bw=1e10)]
    assert auto_lossy.decide({"id": auto_lossy.ID, "abs": 0.1}, np.float32, slow, 2)["id"] == "hpcckpt.sz3"
    assert auto_lossy.decide({"id": auto_lossy.ID, "abs": 0.1}, np.float32, fast, 2)["id"] == "hpcckpt.quantize"


def test_zfp_is_no_candidate_for_a_relative_bound_and_a_device_rank_runs_the_quantizer_only():
    assert "zfp" not in auto_lossy.runnable("rel")
    assert auto_lossy.runnable("abs") == ["quantize", "sz3", "zfp"]  # both libraries are installed here
    assert auto_lossy.runnable("abs", device=True) == ["quantize"]


def test_no_data_anywhere_gives_the_quantizer_and_non_float_variables_are_refused():
    spec = AutoLossy(rel=1e-4).config()
    assert auto_lossy.decide(spec, np.float64, [measurement(0, 0, {}, {})], 2) == resolve(
        hpcckpt.codecs.Lossy(rel=1e-4), np.float64).config
    with pytest.raises(CheckpointError, match="float"):
        auto_lossy.decide(spec, np.int32, [measurement(0, 0, {}, {})], 2)


@pytest.mark.parametrize("make", [lambda: AutoLossy(), lambda: AutoLossy(abs=1, rel=1), lambda: AutoLossy(abs=0),
                                  lambda: AutoLossy(rel=0.5), lambda: AutoLossy(abs=float("nan")),
                                  lambda: AutoLossy(abs=True), lambda: AutoLossy(abs="1e-3")])
def test_bad_specs_are_refused(make):
    with pytest.raises(CheckpointError):
        make()


def test_the_spec_is_not_a_codec_and_never_a_stored_config():
    spec = spec_to_json(AutoLossy(abs=1e-3))
    assert spec == {"id": "hpcckpt.auto-lossy", "abs": 1e-3}
    with pytest.raises(CheckpointError, match="chosen per variable"):
        resolve(spec, np.float64)
    with pytest.raises(hpcckpt.CorruptCheckpointError):
        hpcckpt.codecs.from_config(spec, np.float64)  # a reader never accepts it


@pytest.mark.parametrize("shape,elements", [((1000, 1000), 12288), ((5, 100000), 12288), ((64, 64, 64), 12288),
                                            ((3, 4), 100), ((7, 1, 9, 2), 50)])
def test_sample_blocks_keep_the_axes_and_the_size(shape, elements):
    block = auto_lossy.block_shape(shape, elements)
    assert len(block) == len(shape) and all(1 <= b <= n for b, n in zip(block, shape))
    assert np.prod(block) <= elements or block == shape
    arr = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
    parts = auto_lossy.sample_blocks(arr)
    assert all(p.ndim == arr.ndim and p.flags.c_contiguous for p in parts)
    assert sum(p.nbytes for p in parts) <= max(auto_lossy.SAMPLE_BYTES, arr.nbytes)


@SETTINGS
@given(x=arrays(), mode=st.sampled_from(["abs", "rel"]), bound=st.sampled_from([1e-12, 1e-5, 1e-3, 0.1]),
       bw=st.sampled_from([1e3, 1e9]))
def test_the_bound_holds_whatever_is_chosen(x, mode, bound, bw):
    spec = AutoLossy(**{mode: bound}).config()
    m = auto_lossy.measure(x, x.dtype, spec)
    m["bw"] = bw  # slow storage favours ratio (SZ3, ZFP), fast storage speed (the quantizer)
    chosen = auto_lossy.decide(spec, x.dtype, [m], 2)
    limit = bound if mode == "abs" else rel_bound(x, bound)
    for config in [chosen] + [auto_lossy.config_of(n, mode, bound) for n in auto_lossy.runnable(mode)]:
        y = round_trip(x, config)[0]  # the chosen codec, and whichever candidate it could have chosen
        # (each promises the bound, NaN/Inf bit for bit and -0.0's sign)
        (check_quantized if config["id"] == "hpcckpt.quantize" else check)(x, y, limit)


def test_save_records_the_chosen_codec_and_open_reads_it(tmp_path, monkeypatch):
    y, x = np.mgrid[0:512, 0:512] / 512
    fields = {"smooth": np.sin(6 * x) * np.cos(4 * y), "steps": np.where(x > 0.5, 1.0, 0.0)}
    monkeypatch.setattr(auto, "write_bandwidth", lambda: 1e5)  # very slow storage: the best ratio wins
    path = str(tmp_path / "c")
    hpcckpt.save({k: hpcckpt.Block(v) for k, v in fields.items()}, path, codec=AutoLossy(abs=1e-3))
    with open(os.path.join(path, "metadata.json")) as f:
        stored = {k: v["codec"]["id"] for k, v in json.load(f)["variables"].items()}
    assert set(stored.values()) <= {"hpcckpt.quantize", "hpcckpt.sz3", "hpcckpt.zfp"}
    assert stored["smooth"] == "hpcckpt.sz3"  # SZ3's ratio on a smooth field is the best by far
    view = hpcckpt.open(path)
    for k, v in fields.items():
        assert np.abs(view.read(k) - v).max() <= 1e-3


def test_a_rank_planning_alone_keeps_the_agreed_choice_at_the_same_bound_else_takes_the_quantizer():
    spec = AutoLossy(abs=1e-3).config()
    summary = {"spec": spec, "measure": measurement(1 << 30, 100, {"sz3": 1e-9, "quantize": 1.0},
                                                    {"sz3": 1, "quantize": 100}, bw=1e3)}
    sz3 = auto_lossy.config_of("sz3", "abs", 1e-3)
    quantize = resolve(hpcckpt.codecs.Lossy(abs=1e-3), np.float64).config
    assert pipeline.decide_alone("u", np.float64, summary, 2, sz3) == sz3
    assert pipeline.decide_alone("u", np.float64, summary, 2, None) == quantize  # not its own sample's sz3
    assert pipeline.decide_alone("u", np.float64, summary, 2, auto_lossy.config_of("sz3", "abs", 1e-4)) == quantize
    assert pipeline.decide("u", np.float64, [summary], 2) == sz3  # rank 0 with every rank's samples decides
