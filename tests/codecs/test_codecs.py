"""Codecs: configs and their whitelist, round trips through save/open/load, corruption, auto."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import hpcckpt
from hpcckpt import codecs
from hpcckpt.codecs import Lossy, auto, from_config, resolve
from hpcckpt.codecs.core import decoded_size, zstd_frames
from hpcckpt.errors import CheckpointError, CorruptCheckpointError
from hpcckpt.core.names import METADATA_FILE
from metadata_tools import sealed

numcodecs = pytest.importorskip("numcodecs")

LOSSLESS = ["none", "lz4", "zstd", "lz4hc", "shuffle+lz4", "shuffle+zstd"]


def smooth(shape, seed=0):
    rng = np.random.default_rng(seed)
    x = np.linspace(0, 6, int(np.prod(shape))).reshape(shape)
    return np.sin(x) * 100 + rng.normal(scale=1e-3, size=shape)


@pytest.mark.parametrize("name", LOSSLESS)
@pytest.mark.parametrize("dtype", ["<f8", "<f4", ">i4", "u1", "<c16", [("a", "<i2"), ("b", "<f8", (2,))]])
def test_lossless_codecs_round_trip_any_dtype(name, dtype):
    dtype = np.dtype(dtype)
    raw = np.random.default_rng(1).integers(0, 4, size=1000 * dtype.itemsize, dtype=np.uint8)
    x = raw.view(dtype)
    codec = resolve(name, dtype)
    stored = codec.encode(x)
    again = from_config(json.loads(json.dumps(codec.config)), dtype)  # through JSON, as the metadata does
    out = np.empty(x.nbytes, np.uint8)
    again.decode(stored, out)
    assert out.tobytes() == x.tobytes()


@pytest.mark.parametrize("name", LOSSLESS[1:])
def test_configs_decode_with_numcodecs_alone(name):
    """A reader with numcodecs only (no hpcckpt code) decodes the lossless codecs from their config."""
    x = smooth((5000,))
    codec = resolve(name, x.dtype)
    stored = codec.encode(x).tobytes()
    cfg = codec.config
    if cfg["id"] == "hpcckpt.chain":
        chain = [numcodecs.get_codec(dict(c)) for c in cfg["codecs"]]
        data = stored
        for c in reversed(chain):
            data = c.decode(data)
        got = np.frombuffer(bytes(data), x.dtype)
    else:
        got = np.frombuffer(bytes(numcodecs.get_codec(dict(cfg)).decode(stored)), x.dtype)
    assert np.array_equal(got, x)


@pytest.mark.parametrize("bad", [
    {"id": "pickle"}, {"id": "json2"}, {"id": "zlib", "level": 1}, {"id": "numcodecs.pickles.Pickle"},
    {"id": "blosc", "cname": "evil"}, {"id": "blosc", "clevel": True}, {"id": "blosc", "clevel": 99},
    {"id": "zstd", "level": "3"}, {"id": "zstd", "level": 1, "extra": 1}, {"id": "lz4", "acceleration": 0},
    {"id": "hpcckpt.chain", "codecs": []}, {"id": "hpcckpt.chain", "codecs": [{"id": "pickle"}]},
    {"id": "hpcckpt.chain", "codecs": [{"id": "zstd"}, {"id": "zstd"}]},
    {"id": "hpcckpt.quantize", "abs": 1e-3, "rel": 1e-3}, {"id": "hpcckpt.quantize", "abs": -1.0},
    {"id": "hpcckpt.quantize", "rel": 0.7}, {"id": "hpcckpt.quantize", "abs": 1e-3, "compressor": {"id": "pickle"}},
    {"id": "none", "x": 1}, "none", None, [],
])
def test_untrusted_configs_are_refused(bad):
    with pytest.raises(CorruptCheckpointError):
        from_config(bad, np.dtype("<f8"))


def test_lossy_needs_a_float_variable():
    with pytest.raises(CorruptCheckpointError):
        from_config({"id": "hpcckpt.quantize", "abs": 1e-3}, np.dtype("<i8"))
    with pytest.raises(CheckpointError):
        hpcckpt.save({"a": hpcckpt.Block(np.arange(10), codec=Lossy(abs=1.0))}, "/nonexistent/never/x")


def test_spellings():
    assert resolve(numcodecs.Zstd(level=5), np.float64).config == {"id": "zstd", "level": 5, "checksum": False}
    assert resolve({"id": "lz4"}, np.float64).config == {"id": "lz4", "acceleration": 1}
    assert resolve("none", np.float64).is_none
    assert Lossy(rel=1e-4).config()["rel"] == 1e-4
    for bad in (lambda: Lossy(), lambda: Lossy(abs=1, rel=1), lambda: Lossy(abs=0), lambda: Lossy(abs=float("nan")),
                lambda: resolve("brotli", np.float64), lambda: resolve(object(), np.float64),
                lambda: resolve(numcodecs.Pickle(), np.float64)):
        with pytest.raises(CheckpointError):
            bad()
    with pytest.raises(CheckpointError):
        hpcckpt.save({}, "/nonexistent/x", codec="brotli")
    with pytest.raises(CheckpointError):
        hpcckpt.save({}, "/nonexistent/x", codec_threads=0)


def test_decoded_size_is_checked():
    x = smooth((1000,))
    for name in ("lz4", "zstd", "shuffle+lz4", "shuffle+zstd"):
        codec = resolve(name, x.dtype)
        stored = codec.encode(x)
        for n in (x.nbytes - 8, x.nbytes + 8):
            with pytest.raises(CorruptCheckpointError):
                codec.decode(stored, np.empty(n, np.uint8))
    assert decoded_size({"id": "zstd"}, b"junk") is None


def _frames_like_a_gpu(codec, x, sub):
    """What nvCOMP writes for a shuffle+zstd chunk (codecs/nvcomp.py): one zstd frame per ``sub`` bytes of the
    shuffled chunk, concatenated (made here with numcodecs' Zstd, frame by frame)."""
    import numcodecs

    shuffled = np.asarray(codec.filters[0].encode(x.reshape(-1).view(np.uint8))).view(np.uint8)
    z = numcodecs.Zstd(level=1)
    return np.concatenate([np.frombuffer(z.encode(shuffled[i:i + sub]), np.uint8)
                           for i in range(0, shuffled.nbytes, sub)])


@pytest.mark.parametrize("sub", [8, 1000, 64 << 10])
def test_multi_frame_zstd_chunks_decode_on_the_cpu(sub):
    x = smooth((70000,))
    codec = resolve("shuffle+zstd", x.dtype)
    stored = _frames_like_a_gpu(codec, x, sub)
    frames = zstd_frames(stored)
    assert len(frames) == -(-x.nbytes // sub) and decoded_size({"id": "zstd"}, stored) == x.nbytes
    out = np.empty(x.nbytes, np.uint8)
    codec.decode(stored, out)
    assert out.tobytes() == x.tobytes()
    for cut in (1, 7, len(stored) // 2):  # a truncated stream is refused before decoding
        left = zstd_frames(stored[:-cut])  # None, or whole frames (a cut between frames) that add up to less
        assert left is None or sum(f[2] for f in left) < x.nbytes
        with pytest.raises(CorruptCheckpointError):
            codec.decode(stored[:-cut], np.empty(x.nbytes, np.uint8))
    with pytest.raises(CorruptCheckpointError):  # frames that add up to another size
        codec.decode(stored, np.empty(x.nbytes - 8, np.uint8))


def _state(codec_a, codec_b=None, seed=0):
    return {"a": hpcckpt.Block(smooth((60, 70), seed), codec=codec_a),
            "r": hpcckpt.Ragged(np.arange(3000, dtype=np.int32).reshape(1000, 3), codec=codec_b),
            "note": "x"}


@pytest.mark.parametrize("spec", LOSSLESS + ["auto", Lossy(abs=1e-3), Lossy(rel=1e-5)])
def test_save_open_load_round_trip(tmp_path, spec):
    state = _state(spec, spec if not isinstance(spec, Lossy) else "zstd")
    a = state["a"].local
    hpcckpt.save(state, tmp_path / "c", chunk_bytes=5000)
    with hpcckpt.open(tmp_path / "c") as view:
        assert view.verify() == []
        got = view.read("a")
        part = view.read("a", (slice(7, 33), slice(11, 60)))
        if isinstance(spec, Lossy):
            bound = spec.bound if spec.mode == "abs" else spec.bound * (a.max() - a.min())
            assert np.abs(got - a).max() <= bound
            assert view.variables["a"].codec[spec.mode] == spec.bound  # the bound is recorded
            assert np.array_equal(part, got[7:33, 11:60])
        else:
            assert np.array_equal(got, a) and np.array_equal(part, a[7:33, 11:60])
        assert np.array_equal(view.read("r"), state["r"].local)
    template = {"a": hpcckpt.Block(np.zeros_like(a)), "r": hpcckpt.Ragged(), "note": None}
    out = hpcckpt.load(template, tmp_path / "c")
    assert np.array_equal(template["a"].local, got)
    assert np.array_equal(out["r"].local, state["r"].local)


def test_default_codec_and_per_variable_override(tmp_path):
    state = _state(None, "none")
    hpcckpt.save(state, tmp_path / "c", codec="zstd")
    meta = json.loads((tmp_path / "c" / METADATA_FILE).read_text())
    assert meta["variables"]["a"]["codec"]["cname"] == "zstd"
    assert meta["variables"]["r"]["codec"] == {"id": "none"}
    with hpcckpt.Checkpointer(tmp_path / "ck", codec="lz4") as ck:
        ck.save(state, step=1)
        ck.save(state, step=2, codec="none")
        ids = sorted(json.loads(open(os.path.join(tmp_path, "ck", d, METADATA_FILE)).read())["variables"]["a"]["codec"]["id"]
                     for d in os.listdir(tmp_path / "ck") if os.path.isdir(os.path.join(tmp_path, "ck", d)))
        assert ids == ["blosc", "none"]
        template = {"a": hpcckpt.Block(np.zeros((60, 70))), "r": hpcckpt.Ragged(), "note": None}
        ck.restore(template, step=1)
        assert np.array_equal(template["a"].local, state["a"].local)


def _corrupt_one_chunk(path):
    meta = json.loads(open(os.path.join(path, METADATA_FILE)).read())
    chunks = meta["variables"]["a"]["chunks"]
    file = os.path.join(path, meta["files"][chunks["file"][1]])
    with open(file, "r+b") as f:
        f.seek(chunks["offset"][1] + chunks["nbytes"][1] // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x40]))


@pytest.mark.parametrize("spec", ["lz4", "shuffle+zstd", Lossy(rel=1e-4)])
def test_corrupt_compressed_chunk(tmp_path, spec):
    hpcckpt.save(_state(spec), tmp_path / "c", chunk_bytes=5000)
    _corrupt_one_chunk(tmp_path / "c")
    template = {"a": hpcckpt.Block(np.zeros((60, 70))), "r": hpcckpt.Ragged(), "note": None}
    with pytest.raises(CorruptCheckpointError):
        hpcckpt.load(template, tmp_path / "c")
    with hpcckpt.open(tmp_path / "c") as view:
        assert len(view.verify()) == 1


def test_bogus_compressed_chunk_with_valid_checksum(tmp_path):
    """Even data that passes its checksum (a malicious writer) decodes to exactly the extent or raises."""
    from hpcckpt.core.checksum import checksum

    hpcckpt.save(_state("zstd"), tmp_path / "c", chunk_bytes=5000)
    meta_path = tmp_path / "c" / METADATA_FILE
    meta = json.loads(meta_path.read_text())
    chunks = meta["variables"]["a"]["chunks"]
    file = tmp_path / "c" / meta["files"][chunks["file"][0]]
    other = resolve("zstd", np.float64).encode(np.arange(10.0))  # a valid frame of the wrong size
    data = bytearray(file.read_bytes())
    off, n = chunks["offset"][0], chunks["nbytes"][0]
    assert other.nbytes <= n
    data[off:off + other.nbytes] = other.tobytes()
    file.write_bytes(bytes(data))
    chunks["nbytes"][0] = int(other.nbytes)
    chunks["checksum"][0] = checksum(other)
    meta_path.write_bytes(sealed(meta))
    with hpcckpt.open(tmp_path / "c") as view:
        with pytest.raises(CorruptCheckpointError, match="decoded"):
            view.read("a")


def test_metadata_refuses_unknown_codec(tmp_path):
    hpcckpt.save(_state("lz4"), tmp_path / "c")
    meta_path = tmp_path / "c" / METADATA_FILE
    meta = json.loads(meta_path.read_text())
    meta["variables"]["a"]["codec"] = {"id": "pickle"}
    meta_path.write_bytes(sealed(meta))
    with pytest.raises(CorruptCheckpointError, match="pickle"):
        hpcckpt.open(tmp_path / "c")


def test_uncompressed_fast_path_is_unchanged(tmp_path):
    """codec='none' stores exactly the array's bytes (the zero-copy format of before)."""
    hpcckpt.save({"a": hpcckpt.Block(np.arange(100.0))}, tmp_path / "c")
    meta = json.loads((tmp_path / "c" / METADATA_FILE).read_text())
    assert meta["variables"]["a"]["codec"] == {"id": "none"}
    assert (tmp_path / "c" / meta["files"][0]).read_bytes() == np.arange(100.0).tobytes()


def test_auto_chooses_none_for_incompressible_and_compresses_redundant(tmp_path, monkeypatch):
    # the write bandwidth auto weighs against is this process's, measured by earlier tests' saves (a page-cache
    # write of a few KiB can measure tens of GB/s, against which nothing pays): the documented default here
    monkeypatch.setattr(auto, "write_bandwidth", lambda: auto.DEFAULT_WRITE_BANDWIDTH)
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, size=4 << 20, dtype=np.uint8)
    zeros = np.zeros(1 << 19)
    hpcckpt.save({"n": hpcckpt.Block(noise, codec="auto"), "z": hpcckpt.Block(zeros, codec="auto")}, tmp_path / "c")
    with hpcckpt.open(tmp_path / "c") as view:
        assert view.variables["n"].codec == {"id": "none"}
        assert view.variables["z"].codec["id"] != "none"
        assert np.array_equal(view.read("z"), zeros)


def test_auto_stores_incompressible_data_uncompressed(tmp_path):
    """On random data auto must pick none (its only cost is the small sample; timed in bench/compression.py)."""
    noise = np.random.default_rng(0).integers(0, 256, size=4 << 20, dtype=np.uint8)
    hpcckpt.save({"n": hpcckpt.Block(noise)}, tmp_path / "ck", codec="auto", fsync=False)
    view = hpcckpt.open(tmp_path / "ck")
    assert view.variables["n"].codec["id"] == "none"
    assert view.variables["n"].stored_bytes == noise.nbytes
    assert np.array_equal(view.read("n"), noise)


def test_auto_decision_model():
    m = {"bytes": 100 << 20, "sample": 1 << 16, "bw": 300e6,
         "seconds": {"lz4": (1 << 16) / 1e9, "zstd": (1 << 16) / 3e8},
         "stored": {"lz4": 1 << 14, "zstd": 1 << 13}}
    assert auto.decide([m, m], threads=2) in ("lz4", "zstd")
    slow = dict(m, seconds={"lz4": 1.0, "zstd": 1.0})
    assert auto.decide([slow], threads=2) == "none"
    incompressible = dict(m, stored={"lz4": m["sample"] + 16, "zstd": m["sample"] + 16})
    assert auto.decide([incompressible], threads=4) == "none"
    assert auto.decide([dict(m, bytes=1000)], threads=4) == "none"  # too small to bother


def test_ranks_must_agree_on_codec():
    from hpcckpt.codecs.pipeline import decide

    with pytest.raises(CheckpointError):
        decide("a", np.float64, [{"spec": "lz4"}, {"spec": "zstd"}], 2)


def test_public_names():
    assert hpcckpt.codecs is codecs
    assert "auto" in codecs.__doc__ and callable(codecs.Lossy)


def test_codec_threads_sizes_the_pool_that_encodes_the_chunks(tmp_path, monkeypatch):
    from hpcckpt.codecs import pipeline

    sizes = []

    class Recording(pipeline.ThreadPoolExecutor):
        def __init__(self, max_workers=None, **kwargs):
            sizes.append(max_workers)
            super().__init__(max_workers, **kwargs)

    monkeypatch.setattr(pipeline, "ThreadPoolExecutor", Recording)
    a = np.arange(1 << 16, dtype=np.float64)
    for name, threads in (("three", 3), ("default", None)):
        hpcckpt.save({"u": hpcckpt.Block(a)}, str(tmp_path / name), codec="zstd", codec_threads=threads,
                     chunk_bytes=1 << 14)
        b = np.zeros_like(a)
        hpcckpt.load({"u": hpcckpt.Block(b)}, str(tmp_path / name))
        assert np.array_equal(a, b)
    assert sizes == [3, pipeline.default_threads()]
