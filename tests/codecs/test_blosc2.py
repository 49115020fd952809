"""The blosc2 codec family (hpcckpt/codecs/blosc2_codec.py): conformance, strict configs, hostile streams, saves."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import hpcckpt
from hpcckpt.codecs import Blosc2, blosc2_codec, from_config, resolve
from hpcckpt.errors import CheckpointError, CorruptCheckpointError
from hpcckpt.testing import CodecTests
from testpaths import REPO

blosc2 = pytest.importorskip("blosc2")

F8, F4, I4, U1 = np.dtype("<f8"), np.dtype("<f4"), np.dtype("<i4"), np.dtype("|u1")
ROOT = REPO


class TestBlosc2Default(CodecTests):
    config, dtype = resolve("blosc2", F8).config, F8


class TestBlosc2Lz4(CodecTests):
    config, dtype = resolve("blosc2-lz4", I4).config, I4


class TestBlosc2Lz4hcBitshuffle(CodecTests):
    config, dtype = Blosc2(codec="lz4hc", clevel=9, filters=["bitshuffle"]).config(), F4


class TestBlosc2BytedeltaF4(CodecTests):
    config, dtype = Blosc2(codec="zstd", clevel=1, filters=["shuffle", "bytedelta"]).config(), F4


class TestBlosc2DeltaBlosclz(CodecTests):
    config, dtype = Blosc2(codec="blosclz", filters=["delta", "shuffle"], blocksize=8192).config(), I4


class TestBlosc2NoFilterBytes(CodecTests):
    config, dtype = {"id": "blosc2", "codec": "zstd", "clevel": 0, "filters": []}, U1


class TestBlosc2SplitInParts(CodecTests):
    """A chunk over the part size is several blosc2 chunks back to back (as one over 2 GiB is)."""

    config, dtype = resolve("blosc2-zstd", F8).config, F8

    @pytest.fixture(autouse=True)
    def small_parts(self, monkeypatch):
        monkeypatch.setattr(blosc2_codec, "PART_BYTES", 4000)

    def test_the_stream_is_several_blosc2_chunks(self):
        arr = self.arrays()[0]
        stored = self.codec().encode(arr)
        pos, sizes = 0, []
        while pos < stored.nbytes:
            nbytes, cbytes, _ = blosc2.get_cbuffer_sizes(stored[pos:pos + 32].tobytes())
            sizes.append(nbytes)
            pos += cbytes
        assert pos == stored.nbytes and sum(sizes) == arr.nbytes and len(sizes) == -(-arr.nbytes // 4000)
        assert set(sizes[:-1]) == {4000}


# ---------------------------------------------------------------- configs

def test_names_and_spec():
    cfg = resolve("blosc2", F8).config
    assert cfg == {"id": "blosc2", "codec": "zstd", "clevel": 5, "filters": ["shuffle"], "blocksize": 0,
                   "typesize": 8}
    assert resolve(Blosc2(), F8).config == cfg
    assert resolve("blosc2-lz4", np.dtype([("a", "<f8")] * 1 + [("b", "V300")])).config["typesize"] == 1
    assert resolve(Blosc2(typesize=4), F8).config["typesize"] == 4


@pytest.mark.parametrize("bad", [
    {"codec": "zlib"}, {"codec": "ndlz"}, {"codec": 1}, {"clevel": 10}, {"clevel": True}, {"clevel": 5.0},
    {"filters": ["trunc_prec"]}, {"filters": "shuffle"}, {"filters": ["shuffle"] * 7}, {"filters": [1]},
    {"typesize": 0}, {"typesize": 256}, {"typesize": False}, {"blocksize": 100}, {"blocksize": -1},
    {"nthreads": 4}, {"plugin": "blosc2_grok"}, {"codec": "zstd" * 100},
])
def test_hostile_configs_are_refused(bad):
    cfg = dict(resolve("blosc2", F8).config, **bad)
    with pytest.raises(CorruptCheckpointError):
        from_config(json.loads(json.dumps(cfg)), F8)
    with pytest.raises(CheckpointError):
        resolve(cfg, F8)


# ---------------------------------------------------------------- hostile streams

def stored_chunk(arr=None, spec="blosc2"):
    arr = np.cumsum(np.random.default_rng(1).standard_normal(4000)) if arr is None else arr
    codec = resolve(spec, arr.dtype)
    return codec, arr, codec.encode(arr).copy()


@pytest.mark.parametrize("offset,value", [
    (0, 99),        # an unknown format version
    (2, 0x85 | 0xC0),  # compcode 6: the user-defined codec slot
    (22, 32),       # a plug-in codec id (C-Blosc2 would try to load it)
    (22, 1),        # lz4's id where the flags say zstd
    (16, 4),        # the lossy TRUNC_PREC filter
    (16, 38),       # a user-defined filter
    (31, 0x40),     # special value 4: "uninitialised" (no data to restore)
    (31, 0x08),     # a lazy chunk
    (31, 0x01),     # a dictionary
    (31, 0x80),     # instrumented
    (23, 1),        # compcode meta
])
def test_a_header_outside_the_whitelist_is_refused_before_blosc2_sees_it(offset, value):
    codec, arr, stored = stored_chunk()
    stored[offset] = value
    with pytest.raises(CorruptCheckpointError):
        codec.decode(stored, np.empty(arr.nbytes, np.uint8))


def test_declared_sizes_are_checked():
    codec, arr, stored = stored_chunk()
    for field, delta in ((4, 8), (4, -8), (12, 1), (12, -1)):
        bad = stored.copy()
        bad[field:field + 4] = np.frombuffer((int(bad[field:field + 4].view("<i4")[0]) + delta).to_bytes(4, "little",
                                             signed=True), np.uint8)
        with pytest.raises(CorruptCheckpointError):
            codec.decode(bad, np.empty(arr.nbytes, np.uint8))
    with pytest.raises(CorruptCheckpointError):  # trailing garbage after the last chunk
        codec.decode(np.concatenate([stored, np.zeros(40, np.uint8)]), np.empty(arr.nbytes, np.uint8))
    with pytest.raises(CorruptCheckpointError):  # the same chunk twice: twice the extent
        codec.decode(np.concatenate([stored, stored]), np.empty(arr.nbytes, np.uint8))


def test_flipped_bytes_never_crash_and_never_over_fill():
    codec, arr, stored = stored_chunk()
    rng = np.random.default_rng(5)
    refused = 0
    for _ in range(400):
        bad = stored.copy()
        for p in rng.integers(0, bad.nbytes, 3):
            bad[p] ^= np.uint8(1 << int(rng.integers(8)))
        out = np.zeros(arr.nbytes + 64, np.uint8)
        try:
            codec.decode(bad, out[:arr.nbytes])
        except CorruptCheckpointError:
            refused += 1
        assert not out[arr.nbytes:].any()
    assert refused > 0


def test_empty_chunk():
    codec = resolve("blosc2", F8)
    assert codec.encode(np.zeros(0)).nbytes == 0
    codec.decode(np.zeros(0, np.uint8), np.zeros(0, np.uint8))
    with pytest.raises(CorruptCheckpointError):
        codec.decode(np.zeros(0, np.uint8), np.zeros(8, np.uint8))


def test_the_stream_is_decodable_by_blosc2_alone():
    _, arr, stored = stored_chunk()
    assert blosc2.decompress2(stored.tobytes()) == arr.tobytes()


# ---------------------------------------------------------------- threads

def test_threads_share_one_budget(monkeypatch):
    blosc2_codec.set_threads(3)
    b = blosc2_codec._budget  # noqa: SLF001 - same-module test of the budget rule
    assert [b.take(), b.take()] == [3, 1]
    b.give(3)
    assert b.take() == 2
    b.give(1)
    b.give(2)
    assert b.used == 0


# ---------------------------------------------------------------- saves and loads

def test_save_load_open_and_auto(tmp_path):
    u = np.cumsum(np.random.default_rng(2).standard_normal((64, 1000)), axis=1)
    state = {"u": hpcckpt.Block(u, codec="blosc2"), "v": hpcckpt.Block(u.astype(F4), codec=Blosc2(
        codec="lz4", filters=["shuffle", "bytedelta"])), "z": hpcckpt.Block(np.zeros((512, 512)))}
    hpcckpt.save(state, tmp_path / "ck", codec="auto", fsync=False, chunk_bytes=64 << 10)
    view = hpcckpt.open(tmp_path / "ck")
    assert view.variables["u"].codec["id"] == "blosc2"
    assert view.variables["v"].codec["filters"] == ["shuffle", "bytedelta"]
    assert view.variables["z"].codec["id"] in ("none", "blosc", "blosc2")  # auto: depends on the bandwidth seen
    assert np.array_equal(view.read("u"), u) and np.array_equal(view.read("v"), u.astype(F4))
    assert np.array_equal(view.read("u", (slice(3, 9), slice(10, 900))), u[3:9, 10:900])
    out = {"u": hpcckpt.Block(np.zeros_like(u)), "v": hpcckpt.Block(np.zeros_like(u, F4)),
           "z": hpcckpt.Block(np.ones((512, 512)))}
    hpcckpt.load(out, tmp_path / "ck")
    assert np.array_equal(out["u"].local, u) and not out["z"].local.any()


def test_auto_considers_blosc2():
    from hpcckpt.codecs import auto

    assert auto.candidates() == ("lz4", "zstd", "blosc2-lz4", "blosc2-zstd")
    m = auto.measure(np.zeros(1 << 18), F8)
    assert set(m["seconds"]) == set(m["stored"]) == set(auto.candidates())
    m = dict(m, bytes=100 << 20, bw=1e8, seconds={n: 1e-6 for n in m["seconds"]},
             stored=dict(m["stored"], **{"blosc2-zstd": 1}))
    assert auto.decide([m, m], threads=2) == "blosc2-zstd"
    no_blosc2 = dict(m, seconds={"lz4": 1e-6, "zstd": 1e-6}, stored={"lz4": 10, "zstd": 20})
    assert auto.decide([m, no_blosc2], threads=2) in ("lz4", "zstd")  # only what every rank measured


def test_hpcckpt_imports_and_reads_other_codecs_without_blosc2(tmp_path):
    script = f"""
import sys
sys.modules["blosc2"] = None  # an ImportError on import
sys.path.insert(0, {ROOT!r})
import numpy as np, hpcckpt
from hpcckpt.errors import CheckpointError, CorruptCheckpointError
from hpcckpt.codecs import auto
assert auto.candidates() == ("lz4", "zstd")
view = hpcckpt.open({str(tmp_path / 'ck')!r})
assert view.read("z").tolist() == list(range(10))
try:
    view.read("u")
except CorruptCheckpointError:
    raise SystemExit("a missing package is not damage")
except CheckpointError as e:
    assert "pip install blosc2" in str(e), e
else:
    raise SystemExit("read a blosc2 variable without blosc2")
"""
    hpcckpt.save({"u": hpcckpt.Block(np.arange(1000.0), codec="blosc2"), "z": hpcckpt.Block(np.arange(10.0),
                  codec="zstd")}, tmp_path / "ck", fsync=False)
    subprocess.run([sys.executable, "-c", script], check=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])))


@pytest.mark.slow
def test_a_chunk_over_2_gib(tmp_path):
    n = (1 << 31) + 24
    arr = np.zeros(n, np.uint8)
    arr[::4096] = 7
    codec = resolve("blosc2-lz4", U1)
    stored = codec.encode(arr)
    out = np.empty(n, np.uint8)
    codec.decode(stored, out)
    assert np.array_equal(out.view(np.uint64), arr.view(np.uint64))  # every byte, without a 2 GiB temporary
