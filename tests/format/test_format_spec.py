"""docs/format.md and the pages it links are the contract: readers written from them read what hpcckpt writes.

Three checks:

* the reader printed in docs/format.md section 7 is extracted from the
  markdown and run against real checkpoints (padded structured dtypes, every
  lossless codec it handles), compared with ``hpcckpt.open().read()``;
* :class:`SpecReader`, written here from docs/format.md and docs/compression.md
  alone (no hpcckpt import: hpcckpt only writes the fixtures), verifies the
  metadata checksum, parses, and decodes none, lz4, zstd (one or several
  frames), blosc and hpcckpt.quantize chunks from their documented byte
  layouts, using only xxhash, numpy, a small LZ4-block decoder written here,
  and numcodecs' Zstd for single zstd frames;
* every codec id and parameter the writer emits, over all spellings of
  docs/compression.md ("Spellings", ``codec="auto"`` too), is listed in
  compression.md's "Codec parameters" table.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import math
import os
import re
import struct
import zlib

import numpy as np
import pytest

import hpcckpt
from hpcckpt.codecs import Lossy
from testpaths import REPO

xxhash = pytest.importorskip("xxhash")
numcodecs = pytest.importorskip("numcodecs")

ROOT_DIR = REPO
PREFIX = b'{"metadata_checksum":"'


def doc(name: str) -> str:
    with open(os.path.join(ROOT_DIR, "docs", name), encoding="utf-8") as f:
        return f.read()


def save(path, state, **options) -> str:
    hpcckpt.save(state, str(path), comm=None, **options)
    return str(path)


def padded_records(n: int) -> np.ndarray:
    """Records with a titled field, a big-endian field, a sub-array field and padding (aligned)."""
    dt = np.dtype({"names": ["x", "id", "m"], "formats": ["<f4", ">i8", ("<i2", (2, 3))],
                   "titles": ["T", None, None]}, align=True)
    assert dt.itemsize > 4 + 8 + 12  # the alignment added padding bytes
    rec = np.zeros(n, dt)
    rec["x"] = np.arange(n) / 3
    rec["id"] = np.arange(n) * 7
    rec["m"] = np.arange(n * 6).reshape(n, 2, 3) % 50
    return rec


def assert_same_as_hpcckpt(path, arrays):
    with hpcckpt.open(path) as view:
        assert sorted(arrays) == sorted(view.variables)
        for name, arr in arrays.items():
            expected = view.read(name)
            assert arr.dtype == expected.dtype and arr.dtype.descr == expected.dtype.descr, name
            assert arr.shape == expected.shape and arr.tobytes() == expected.tobytes(), name


def flip_byte(path, pos):
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x01]))


# --------------------------------------------------------------------------- section 7, run from the markdown

def section7():
    code = re.search(r"## 7\..*?```python\n(.*?)```", doc("format.md"), re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "docs/format.md", "exec"), namespace)
    return namespace["read_checkpoint"]


LOSSLESS = ["none", "lz4", "zstd", "lz4hc", "shuffle+lz4", "shuffle+zstd"]


@pytest.mark.parametrize("codec", LOSSLESS)
def test_section7_reader_reads_what_hpcckpt_writes(tmp_path, codec, table_form):
    read_checkpoint = section7()
    rng = np.random.default_rng(1)
    u = rng.standard_normal((7, 5)).astype(">f4")
    path = save(tmp_path / "v", {"u": hpcckpt.Block(u, offset=(0, 0), global_shape=u.shape),
                                 "p": hpcckpt.Ragged(padded_records(9)),
                                 "e": hpcckpt.Block(np.zeros((0, 3)), offset=(0, 0), global_shape=(0, 3)),
                                 "k": 7}, codec=codec, chunk_bytes=64)
    arrays, values = read_checkpoint(path)
    assert values == {"k": 7}
    assert arrays["p"].dtype == padded_records(1).dtype  # padding stays padding, not fields f1, f5
    assert_same_as_hpcckpt(path, arrays)


def test_section7_reader_refuses_a_damaged_chunk(tmp_path):
    read_checkpoint = section7()
    path = save(tmp_path / "v", {"p": hpcckpt.Ragged(padded_records(4))})
    flip_byte(os.path.join(path, "data", "part-000000.bin"), 3)
    with pytest.raises(AssertionError, match="bad checksum"):
        read_checkpoint(path)


def test_section7_reader_refuses_damaged_metadata(tmp_path):
    read_checkpoint = section7()
    path = save(tmp_path / "v", {"p": hpcckpt.Ragged(padded_records(4))})
    meta = os.path.join(path, "metadata.json")
    size = os.path.getsize(meta)
    flip_byte(meta, size - 5)
    with pytest.raises(AssertionError, match="damaged metadata"):
        read_checkpoint(path)


# --------------------------------------------------------------------------- a reader from the docs alone

def lz4_block(src: bytes, size: int) -> bytes:
    """Decode one raw LZ4 block (the LZ4 block format, not the frame format) of ``size`` decoded bytes."""
    out, i = bytearray(), 0

    def length(n):
        nonlocal i
        if n == 15:
            while True:
                b = src[i]
                i += 1
                n += b
                if b != 255:
                    break
        return n

    while True:
        token = src[i]
        i += 1
        n = length(token >> 4)
        out += src[i:i + n]
        i += n
        if i == len(src):
            break
        off = src[i] | src[i + 1] << 8
        i += 2
        m = length(token & 15) + 4
        assert 0 < off <= len(out)
        while m:  # an overlapping match repeats the last `off` bytes
            step = min(m, off)
            out += out[len(out) - off:len(out) - off + step]
            m -= step
    assert len(out) == size, "an LZ4 block decodes to the wrong size"
    return bytes(out)


def unshuffle(data: bytes, size: int) -> bytes:
    """Inverse of the byte shuffle: byte j of element i is at position j * count + i."""
    if size <= 1:
        return data
    return np.frombuffer(data, np.uint8).reshape(size, -1).T.tobytes()


def zstd_frames(b: bytes) -> list[tuple[int, int, int]]:
    """(start, end, declared decoded size) of each Zstandard frame, from the frame and block headers."""
    frames, pos = [], 0
    while pos < len(b):
        start = pos
        assert int.from_bytes(b[pos:pos + 4], "little") == 0xFD2FB528, "not a zstd frame"
        fhd = b[pos + 4]
        fcs, single, checksum, did = fhd >> 6, (fhd >> 5) & 1, (fhd >> 2) & 1, fhd & 3
        pos += 5 + (0 if single else 1) + (0, 1, 2, 4)[did]
        width = (1 if single else 0, 2, 4, 8)[fcs]
        assert width, "a zstd frame does not declare its decoded size"
        content = int.from_bytes(b[pos:pos + width], "little") + (256 if width == 2 else 0)
        pos += width
        last = 0
        while not last:
            header = int.from_bytes(b[pos:pos + 3], "little")
            last, kind, bsize = header & 1, (header >> 1) & 3, header >> 3
            assert kind != 3, "reserved zstd block type"
            pos += 3 + (1 if kind == 1 else bsize)
        pos += 4 * checksum
        assert pos <= len(b), "a zstd frame is truncated"
        frames.append((start, pos, content))
    return frames


def zstd_stream(b: bytes, size: int) -> bytes:
    frames = zstd_frames(b)
    assert sum(f[2] for f in frames) == size, "zstd frames declare the wrong size"
    return b"".join(bytes(numcodecs.Zstd().decode(b[s:e])) for s, e, _ in frames)


BLOSC_LZ4, BLOSC_ZSTD = 1, 4


def blosc_chunk(b: bytes, size: int) -> bytes:
    """A c-blosc 1 chunk: 16-byte header, block starts, then per block one or typesize split streams."""
    version, _versionlz, flags, typesize = b[:4]
    nbytes, blocksize, cbytes = struct.unpack_from("<iii", b, 4)
    assert version == 2 and nbytes == size and cbytes == len(b) and not flags & 0x04
    if flags & 0x02:  # memcpyed: the bytes follow the header as they are
        assert cbytes == 16 + nbytes
        return b[16:]
    nblocks = -(-nbytes // blocksize)
    starts = struct.unpack_from(f"<{nblocks}i", b, 16)
    out = bytearray()
    for k, pos in enumerate(starts):
        bsize = min(blocksize, nbytes - k * blocksize)
        split = (not flags & 0x10 and typesize <= 16 and blocksize // typesize >= 128 and bsize == blocksize)
        nstreams = typesize if split else 1
        neblock = bsize // nstreams
        block = bytearray()
        for _ in range(nstreams):
            (clen,) = struct.unpack_from("<i", b, pos)
            stream = b[pos + 4:pos + 4 + clen]
            pos += 4 + clen
            if clen == neblock:
                block += stream
            elif flags >> 5 == BLOSC_LZ4:
                block += lz4_block(stream, neblock)
            else:
                assert flags >> 5 == BLOSC_ZSTD, "compressor not handled by this reader"
                block += zstd_stream(stream, neblock)
        out += unshuffle(bytes(block), typesize) if flags & 0x01 else block
    return bytes(out)


def lossless(cfg: dict, b: bytes, size: int) -> bytes:
    """Decode a blosc, zstd or lz4 stream of ``size`` decoded bytes (an empty stream holds nothing)."""
    if size == 0:
        assert not b
        return b""
    if cfg["id"] == "lz4":
        assert struct.unpack_from("<I", b)[0] == size, "LZ4 size prefix"
        return lz4_block(b[4:], size)
    if cfg["id"] == "zstd":
        return zstd_stream(b, size)
    assert cfg["id"] == "blosc"
    return blosc_chunk(b, size)


QUANTIZE_HEADER = struct.Struct("<4sBBhIqQQQQd")


class SpecReader:
    """A checkpoint reader written from docs/format.md and docs/compression.md only (asserts, no nice errors)."""

    def __init__(self, vdir: str):
        self.vdir = os.path.realpath(vdir)
        self.modes: list[tuple[int, int, int]] = []  # (mode, width, n_out) of every quantize chunk read
        with open(os.path.join(self.vdir, "metadata.json"), "rb") as f:
            raw = f.read((256 << 20) + 1)
        assert len(raw) <= 256 << 20
        self.v2 = raw.startswith(PREFIX)
        if self.v2:
            digest = raw[22:38]
            assert re.fullmatch(rb"[0-9a-f]{16}", digest) and raw[38:40] == b'",'
            assert digest.decode() == format(xxhash.xxh3_64_intdigest(raw[40:]), "016x"), "damaged metadata"
        self.meta = json.loads(raw, object_pairs_hook=self._pairs, parse_constant=self._constant)
        assert self.meta["format"] == "hpcckpt" and self.meta["checksum"] == "xxh3_64"
        assert self.meta["format_version"] in ((2, 3) if self.v2 else (1,))
        if self.v2:
            assert next(iter(self.meta)) == "metadata_checksum"

    @staticmethod
    def _pairs(pairs):
        assert len({k for k, _ in pairs}) == len(pairs), "duplicate key"
        return dict(pairs)

    @staticmethod
    def _constant(name):
        raise AssertionError(f"{name} is not strict JSON")

    def dtype(self, d) -> np.dtype:
        if isinstance(d, str):  # "|" exactly for b1, i1, u1, S<n>, V<n> (3.2)
            assert d[0] in "<>|" and (d[0] == "|") == (d[1:] in ("b1", "i1", "u1") or d[1] in "SV"), d
            return np.dtype(d)
        names, formats, offsets, titles, pos = [], [], [], [], 0
        for f in d:
            t = self.dtype(f[1]) if len(f) == 2 else np.dtype((self.dtype(f[1]), tuple(f[2])))
            if f[0] != "":
                title, name = f[0] if isinstance(f[0], list) else (None, f[0])
                names.append(name), formats.append(t), offsets.append(pos), titles.append(title)
            pos += t.itemsize
        return np.dtype({"names": names, "formats": formats, "offsets": offsets, "titles": titles, "itemsize": pos})

    def path(self, name: str) -> str:
        if name.startswith("@"):
            version, _, rest = name[1:].partition("/")
            top = os.path.realpath(os.path.join(os.path.dirname(self.vdir), version))
            assert os.path.isfile(os.path.join(top, "metadata.json"))
        else:
            top, rest = self.vdir, name
        p = os.path.realpath(os.path.join(top, rest))
        assert p.startswith(top + os.sep) and os.path.isfile(p)
        return p

    def decode(self, cfg: dict, dtype: np.dtype, b: bytes, n: int) -> bytes:
        size = n * dtype.itemsize
        if cfg["id"] == "none":
            assert len(b) == size
            return b
        if cfg["id"] == "hpcckpt.chain":
            data = lossless(cfg["codecs"][-1], b, size)
            for f in reversed(cfg["codecs"][:-1]):
                assert f["id"] == "shuffle"
                data = unshuffle(data, f["elementsize"])
            return data
        if cfg["id"] == "hpcckpt.quantize":
            return self.dequantize(cfg["compressor"], dtype, b, n).tobytes()
        return lossless(cfg, b, size)

    def dequantize(self, comp: dict, dtype: np.dtype, b: bytes, n: int) -> np.ndarray:
        magic, mode, w, e, _reserved, ref, n_stored, n_out, len_q, len_o, _bound = QUANTIZE_HEADER.unpack_from(b)
        assert QUANTIZE_HEADER.size == 60 and magic == b"HCQ1" and n_stored == n
        assert 60 + len_q + len_o == len(b)
        s1, s2 = b[60:60 + len_q], b[60 + len_q:]
        self.modes.append((mode, w, n_out))
        if mode == 0:
            assert n_out == 0 and len_o == 0
            return np.frombuffer(unshuffle(lossless(comp, s1, n * dtype.itemsize), dtype.itemsize), dtype)
        assert mode == 1 and w in (1, 2, 4, 8) and n_out <= n and -1074 <= e <= 1023
        m = n - n_out
        u = np.frombuffer(unshuffle(lossless(comp, s1, m * w), w), f"<u{w}").astype(np.uint64)
        d = (u >> np.uint64(1)).astype(np.int64) ^ -(u & np.uint64(1)).astype(np.int64)
        q = np.cumsum(d, dtype=np.int64) + np.int64(ref)
        y = q.astype(np.float64) * math.ldexp(1.0, e)
        y = (y.astype(np.float32) if dtype.itemsize == 2 else y).astype(dtype)
        out = np.empty(n, dtype)
        o = lossless(comp, s2, n_out * (8 + dtype.itemsize))
        pos = np.frombuffer(o[:8 * n_out], "<u8").astype(np.int64)
        assert np.all(np.diff(pos) > 0) and (n_out == 0 or pos[-1] < n)
        keep = np.ones(n, bool)
        keep[pos] = False
        out[keep] = y
        out[pos] = np.frombuffer(o[8 * n_out:], dtype)
        return out

    def table(self, c: dict, nd: int) -> dict:
        """A chunk table as the JSON-array columns of section 3.3, from the columnar form of 3.3.1 when it is one
        (format version 3): base64, zlib, a 32-byte header, then the uint64 columns the entry names."""
        if "data" not in c:
            return c
        assert self.meta["format_version"] == 3 and set(c) == {"columns", "rows", "data"}
        names = ["file", "offset", "nbytes", "checksum", *(f"start_{i}" for i in range(nd)),
                 *(f"count_{i}" for i in range(nd))]
        assert c["columns"] in (names, names + ["hash_hi", "hash_lo", "hash_kind"])
        rows, ncols = c["rows"], len(c["columns"])
        assert type(rows) is int and 0 <= rows and 32 + 8 * ncols * rows <= 1 << 30
        d = zlib.decompressobj()
        packed = base64.b64decode(c["data"].encode("ascii"), validate=True)
        assert base64.b64encode(packed).decode() == c["data"], "not canonical base64"
        raw = d.decompress(packed, 32 + 8 * ncols * rows + 1)
        assert d.eof and not d.unused_data and len(raw) == 32 + 8 * ncols * rows
        assert raw[:8] == b"HCKCOLS\0" and struct.unpack_from("<IIQQ", raw, 8)[:3] == (1, ncols, rows)
        assert struct.unpack_from("<Q", raw, 24)[0] == xxhash.xxh3_64_intdigest(raw[32:]), "damaged block"
        cols = {name: [int.from_bytes(raw[32 + 8 * (j * rows + k):40 + 8 * (j * rows + k)], "little")
                       for k in range(rows)] for j, name in enumerate(c["columns"])}
        assert all(x < 1 << 62 for name in names if name != "checksum" for x in cols[name])
        out = {key: cols[key] for key in ("file", "offset", "nbytes")}
        out["checksum"] = [format(x, "016x") for x in cols["checksum"]]
        out["start"] = [cols[f"start_{i}"][k] for k in range(rows) for i in range(nd)]
        out["count"] = [cols[f"count_{i}"][k] for k in range(rows) for i in range(nd)]
        if "hash_hi" in cols:
            assert all(kind in (0, 1) for kind in cols["hash_kind"])
            out["hash"] = [("mix128:" if kind else "") + format(hi, "016x") + format(lo, "016x")
                           for hi, lo, kind in zip(cols["hash_hi"], cols["hash_lo"], cols["hash_kind"])]
        return out

    def read(self) -> dict:
        out = {}
        for name, v in self.meta["variables"].items():
            assert set(v) <= {"kind", "dtype", "shape", "codec", "chunks"}
            dt, shape = self.dtype(v["dtype"]), tuple(v["shape"])
            c = self.table(v["chunks"], len(shape))
            assert set(c) <= {"file", "offset", "nbytes", "checksum", "start", "count", "hash"}
            cfg = v.get("codec", {"id": "none"})
            arr, seen, nd = np.zeros(shape, dt), np.zeros(shape, np.uint8), len(shape)
            raw_view = arr.view(np.dtype((np.void, dt.itemsize)))  # padding bytes are data too
            for k in range(len(c["file"])):
                start, count = c["start"][k * nd:(k + 1) * nd], c["count"][k * nd:(k + 1) * nd]
                assert all(0 <= a <= s and 0 <= n <= s - a for a, n, s in zip(start, count, shape))
                with open(self.path(self.meta["files"][c["file"][k]]), "rb") as f:
                    f.seek(c["offset"][k])
                    raw = f.read(c["nbytes"][k])
                assert len(raw) == c["nbytes"][k]
                assert format(xxhash.xxh3_64_intdigest(raw), "016x") == c["checksum"][k]
                n = math.prod(count)
                data = self.decode(cfg, dt, raw, n)
                if "hash" in c and not c["hash"][k].startswith("mix128:"):
                    assert c["hash"][k] == format(xxhash.xxh3_128_intdigest(data), "032x")
                box = tuple(slice(a, a + m) for a, m in zip(start, count))
                raw_view[box] = np.frombuffer(data, raw_view.dtype).reshape(count)
                seen[box] += 1
            assert (seen == 1).all()
            out[name] = arr
        return out


def fields(seed: int = 0) -> dict:
    """Float fields that exercise every quantize mode: smooth, NaN/Inf outliers, noise (raw), float16/32."""
    rng = np.random.default_rng(seed)
    smooth = np.cumsum(rng.standard_normal(3000)) * 1e-2
    spiky = smooth.copy()
    spiky[::97] = np.nan
    spiky[5] = np.inf
    wide = np.cumsum(rng.standard_normal(2000)) * 1e6  # deltas need 4 or 8 bytes at a small bound
    bits = rng.integers(0, 2 ** 63, 1000).view(np.float64)  # arbitrary bit patterns
    half_nan = np.where(np.arange(1000) % 2, np.nan, 1.5)  # more than a quarter outliers: a raw chunk
    noise = rng.uniform(size=1000)  # deltas of many steps: wider than smooth's
    return {"smooth": smooth, "spiky": spiky, "wide": wide, "bits": bits, "half_nan": half_nan, "noise": noise,
            "ramp": np.linspace(0, 1, 1000),
            "f32be": smooth.astype(">f4"), "f16": smooth.astype(np.float16)}


def blocks(arrays: dict, codec=None) -> dict:
    return {name: hpcckpt.Block(a, offset=(0,) * a.ndim, global_shape=a.shape, codec=codec)
            for name, a in arrays.items()}


@pytest.mark.parametrize("codec", LOSSLESS + [numcodecs.Blosc(cname="zstd", shuffle=0),
                                              numcodecs.LZ4(acceleration=4), numcodecs.Zstd(level=3, checksum=True),
                                              {"id": "blosc", "cname": "lz4", "clevel": 1, "shuffle": 1,
                                               "blocksize": 256, "typesize": 4}],
                         ids=lambda c: c if isinstance(c, str) else json.dumps(getattr(c, "get_config", lambda: c)()))
def test_spec_reader_lossless(tmp_path, codec, table_form):
    rng = np.random.default_rng(3)
    state = blocks({"u": np.cumsum(rng.standard_normal((40, 30)), axis=1), "i": np.arange(5000, dtype=">i4"),
                    "z": np.zeros(20000)})
    state["p"] = hpcckpt.Ragged(padded_records(200))
    path = save(tmp_path / "v", state, codec=codec, chunk_bytes=4096)
    assert_same_as_hpcckpt(path, SpecReader(path).read())


@pytest.mark.parametrize("spec", [Lossy(rel=1e-3), Lossy(abs=1e-6), Lossy(abs=1e-2, compressor="lz4"),
                                  Lossy(rel=1e-4, compressor={"id": "blosc", "cname": "lz4", "clevel": 5,
                                                              "shuffle": 0, "blocksize": 0})])
def test_spec_reader_quantize(tmp_path, spec):
    path = save(tmp_path / "v", blocks(fields(), codec=spec), chunk_bytes=2048)
    reader = SpecReader(path)
    assert_same_as_hpcckpt(path, reader.read())
    modes = set(reader.modes)
    assert {m for m, _, _ in modes} == {0, 1}  # raw and quantized chunks
    assert any(n_out for _, _, n_out in modes)  # outliers
    assert len({w for m, w, _ in modes if m == 1}) >= 2  # several delta widths


def test_spec_reader_incremental_references(tmp_path, table_form):
    root = tmp_path / "root"
    ck = hpcckpt.Checkpointer(str(root), incremental=True, block_bytes=4096, full_threshold=1.0, comm=None)
    u = np.arange(20000, dtype=np.float64)
    ck.save(blocks({"u": u}), step=1)
    u[5] = -1
    ck.save(blocks({"u": u}), step=2)
    path = str(root / "step-000000000002")
    reader = SpecReader(path)
    assert any(f.startswith("@step-000000000001/") for f in reader.meta["files"])
    chunks = reader.meta["variables"]["u"]["chunks"]
    assert "hash" in chunks if table_form == "json" else "hash_hi" in chunks["columns"]
    assert_same_as_hpcckpt(path, reader.read())


def test_spec_reader_decodes_a_real_columnar_table(tmp_path):
    """At the writer's own threshold (4096 chunks; no test setting): the block decoded by the spec alone gives
    every chunk's file, offset, length, checksum and box, and the data read through them is hpcckpt's."""
    u = np.arange(4100 * 3, dtype="<i2").reshape(4100, 3)
    path = save(tmp_path / "v", {"u": hpcckpt.Block(u, offset=(0, 0), global_shape=u.shape),
                                 "s": hpcckpt.Block(np.arange(6.0), offset=(0,), global_shape=(6,))}, chunk_bytes=6)
    reader = SpecReader(path)
    assert reader.meta["format_version"] == 3
    entry = reader.meta["variables"]["u"]["chunks"]
    assert set(entry) == {"columns", "rows", "data"} and entry["rows"] == 4100
    small = reader.meta["variables"]["s"]["chunks"]  # the version has >= 4096 chunks: every table is a block
    assert set(small) == {"columns", "rows", "data"} and small["rows"] == 6  # chunk_bytes=6: 1 float64 each
    table = reader.table(entry, 2)
    assert sorted(zip(table["start"][0::2], table["count"][0::2])) == [(k, 1) for k in range(4100)]
    assert set(table["nbytes"]) == {6}
    arrays = reader.read()
    assert arrays["u"].tobytes() == u.tobytes()
    assert_same_as_hpcckpt(path, arrays)


def test_zstd_stream_of_several_frames():
    """compression.md: a zstd chunk may be several concatenated frames, each declaring its size."""
    data = np.arange(50000, dtype="<u4").tobytes()
    parts = [data[i:i + 65536] for i in range(0, len(data), 65536)]
    stream = b"".join(bytes(numcodecs.Zstd(level=1).encode(p)) for p in parts)
    assert len(zstd_frames(stream)) == len(parts) > 1
    assert zstd_stream(stream, len(data)) == data
    with pytest.raises(AssertionError):
        zstd_stream(stream[:-3], len(data))


# --------------------------------------------------------------------------- the metadata checksum (3.6)

def test_metadata_prefix_is_the_documented_40_bytes(tmp_path):
    path = save(tmp_path / "v", blocks({"u": np.arange(10.0)}), step=3)
    with open(os.path.join(path, "metadata.json"), "rb") as f:
        raw = f.read()
    assert re.fullmatch(rb'\{"metadata_checksum":"[0-9a-f]{16}",', raw[:40])
    assert raw[22:38] == xxhash.xxh3_64_hexdigest(raw[40:]).encode()
    doc_ = json.loads(raw)
    assert list(doc_)[0] == "metadata_checksum" and doc_["format_version"] == 3
    assert SpecReader(path).v2


# --------------------------------------------------------------------------- every emitted codec is documented

def documented_parameters() -> dict[str, set[str]]:
    """compression.md "Codec parameters": codec id -> the parameter names its table rows list."""
    text = doc("compression.md")
    section = re.search(r"^### Codec parameters\n(.*?)(?=^#)", text, re.S | re.M).group(1)
    table: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        m = re.fullmatch(r"`([^`]+)`", cells[0]) if line.startswith("|") else None
        if m:
            param = re.fullmatch(r"`([^`]+)`", cells[1])
            table.setdefault(m.group(1), set()).update([param.group(1)] if param else [])
    return table


def emitted(cfg: dict, out: set) -> set:
    """(codec id, parameter) pairs of a stored config, nested chain members and compressors included."""
    out.add((cfg["id"], None))
    for key, value in cfg.items():
        if key != "id":
            out.add((cfg["id"], key))
        if key == "codecs":
            for c in value:
                emitted(c, out)
        if key == "compressor":
            emitted(value, out)
    return out


SPELLINGS = ["none", "lz4", "zstd", "lz4hc", "shuffle+lz4", "shuffle+zstd", "auto",
             Lossy(abs=1e-3), Lossy(rel=1e-3), Lossy(rel=1e-3, compressor="lz4"),
             Lossy(abs=1e-3, compressor={"id": "blosc", "cname": "zstd", "clevel": 1, "shuffle": 0,
                                         "blocksize": 0, "typesize": 8}),
             numcodecs.Blosc(cname="blosclz"), numcodecs.Blosc(cname="zlib", shuffle=2, blocksize=1024),
             numcodecs.Blosc(cname="lz4", shuffle=-1, typesize=4), numcodecs.Zstd(level=-5, checksum=True),
             numcodecs.LZ4(acceleration=8),
             {"id": "blosc", "cname": "lz4hc", "clevel": 9, "shuffle": 0, "blocksize": 0, "typesize": 8},
             {"id": "hpcckpt.chain", "codecs": [{"id": "shuffle", "elementsize": 4}, {"id": "shuffle",
                                                "elementsize": 2}, {"id": "zstd", "level": 2}]},
             {"id": "hpcckpt.chain", "codecs": [{"id": "lz4"}]},
             {"id": "hpcckpt.quantize", "rel": 1e-2}]
if importlib.util.find_spec("blosc2") is not None:  # the blosc2 family (hpcckpt/codecs/blosc2_codec.py)
    SPELLINGS += ["blosc2", "blosc2-lz4", {"id": "blosc2", "codec": "lz4hc", "clevel": 9, "filters":
                  ["delta", "bitshuffle", "bytedelta"], "typesize": 4, "blocksize": 8192}]


def test_every_emitted_codec_id_and_parameter_is_documented(tmp_path):
    table = documented_parameters()
    seen: set = set()
    big = np.zeros(1 << 18)  # 2 MiB of zeros: auto compresses it
    for i, spec in enumerate(SPELLINGS):
        path = save(tmp_path / f"v{i}", blocks({"big": big, "u": np.linspace(0, 1, 999)}), codec=spec)
        with open(os.path.join(path, "metadata.json"), "rb") as f:
            meta = json.loads(f.read())
        for v in meta["variables"].values():
            emitted(v.get("codec", {"id": "none"}), seen)
    assert {"acceleration", "checksum", "typesize", "elementsize", "compressor"} <= {k for _, k in seen}
    missing = sorted(f"{cid}.{key}" if key else cid for cid, key in seen
                     if cid not in table or (key is not None and key not in table[cid]))
    assert not missing, f"codec ids/parameters written but not in docs/compression.md: {missing}"


# --------------------------------------------------------------------------- old versions stay readable

def old_versions(version: int) -> list[str]:
    """Every committed version under tests/data/v<version> (written by an earlier release)."""
    top = os.path.join(ROOT_DIR, "tests", "data", f"v{version}")
    found = []
    for dirpath, _dirs, files in os.walk(top):
        if "metadata.json" in files:
            found.append(dirpath)
    return sorted(found)


@pytest.mark.parametrize("version", [1, 2])
def test_spec_reader_reads_old_format_versions(version):
    versions = old_versions(version)
    assert len(versions) == 11, f"tests/data/v{version} should hold 11 versions"
    for path in versions:
        reader = SpecReader(path)
        assert reader.v2 == (version == 2) and reader.meta["format_version"] == version
        assert_same_as_hpcckpt(path, reader.read())


# --------------------------------------------------------------------------- mix128 from incremental.md

def mix128_from_doc(data: bytes) -> str:
    """docs/incremental.md "Blocks on a GPU": the two fmix64 lanes over little-endian words, plain integers."""
    mask = (1 << 64) - 1

    def fmix64(h):
        h ^= h >> 33
        h = h * 0xFF51AFD7ED558CCD & mask
        h ^= h >> 33
        h = h * 0xC4CEB9FE1A85EC53 & mask
        return h ^ h >> 33

    data += b"\0" * (-len(data) % 8)
    words = [int.from_bytes(data[i:i + 8], "little") for i in range(0, len(data), 8)]
    lanes = [sum(fmix64(w ^ ((i * 0x9E3779B97F4A7C15 + s) & mask)) for i, w in enumerate(words)) & mask
             for s in (0x243F6A8885A308D3, 0x13198A2E03707344)]
    return f"{lanes[0]:016x}{lanes[1]:016x}"


@pytest.mark.parametrize("size", [0, 1, 8, 13, 200])
def test_mix128_matches_its_description(size):
    from hpcckpt.core.blockhash import mix128

    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    assert mix128(np, data) == mix128_from_doc(data.tobytes())


# --------------------------------------------------------------------------- rules a reader had to guess (one each)

def sealed_edit(path, edit):
    """Edit the metadata document of the version at ``path`` and seal it again (tests/support/metadata_tools.py)."""
    from metadata_tools import rewrite_metadata

    rewrite_metadata(path, edit)


def old_v1_copy(tmp_path, edit) -> str:
    """A copy of the version 1 fixture tests/data/v1/plain whose (unsealed) document ``edit`` changed."""
    import shutil

    path = str(tmp_path / "v1")
    shutil.copytree(os.path.join(ROOT_DIR, "tests", "data", "v1", "plain"), path)
    meta = os.path.join(path, "metadata.json")
    with open(meta, "rb") as f:
        d = json.loads(f.read())
    assert d["format_version"] == 1
    out = edit(d)
    with open(meta, "wb") as f:
        f.write(out if isinstance(out, bytes) else json.dumps(d, separators=(",", ":")).encode())
    return path


def refused(path, match, variable=None):
    """The version at ``path`` is damaged, with ``match`` in the message, for hpcckpt.open (reading ``variable``:
    a damaged chunk shows when it is read) as for hpcckpt.load."""
    with pytest.raises(hpcckpt.CorruptCheckpointError, match=match):
        with hpcckpt.open(path) as view:
            if variable is not None:
                view.read(variable)
    with pytest.raises(hpcckpt.CorruptCheckpointError, match=match):
        hpcckpt.load(None, path, comm=None)


def test_rule_plain_integers_beyond_int64_only_in_format_version_1(tmp_path):
    """3.4: from format version 2 on, a plain integer in `values` is in int64 (beyond it, only the tagged form)."""
    path = save(tmp_path / "v", {"n": 5, "big": 2 ** 70, "p": hpcckpt.PerRank(1)})
    with hpcckpt.open(path) as view:
        assert view.meta.values["big"] == {"$hpcckpt": "int", "value": str(2 ** 70)}  # how hpcckpt writes it
    for where in ("n", "nested", "per-rank entry"):
        def edit(d, where=where):
            d["values"]["n"] = 5
            if where == "n":
                d["values"]["n"] = 2 ** 70
            elif where == "nested":
                d["values"]["n"] = [1, {"a": -2 ** 63 - 1}]
            else:
                d["values"]["p"]["values"] = [2 ** 64]
        sealed_edit(path, edit)
        refused(path, "outside int64")
    sealed_edit(path, lambda d: d["values"].update(n=[2 ** 63 - 1, -2 ** 63], p={"$hpcckpt": "per-rank",
                                                                                    "values": [2 ** 63 - 1]}))
    with hpcckpt.open(path) as view:
        assert view.values["n"] == [2 ** 63 - 1, -2 ** 63]
    v1 = old_v1_copy(tmp_path, lambda d: d["values"].update(wide=[2 ** 70, -(10 ** 30)]))
    with hpcckpt.open(v1) as view:
        assert view.values["wide"] == [2 ** 70, -(10 ** 30)]


@pytest.mark.parametrize("spelling", ["last key", "first key, spaced"])
def test_rule_no_metadata_checksum_key_in_format_version_1(tmp_path, spelling):
    """3 and 3.6: a version 1 document never holds `metadata_checksum`, wherever it stands."""
    def edit(d):
        if spelling == "last key":
            d["metadata_checksum"] = "0123456789abcdef"
            return None
        return b'{ "metadata_checksum": "0123456789abcdef", ' + json.dumps(d)[1:].encode()

    path = old_v1_copy(tmp_path, edit)
    refused(path, "format version 1 metadata has no 'metadata_checksum' key")
    assert hpcckpt.open(old_v1_copy(tmp_path / "plain", lambda d: None)).meta.format_version == 1


def noncanonical(text: str) -> str:
    """The same bytes as canonical base64 ``text``, spelled otherwise: non-zero bits before the padding, or (with
    no padding to hide bits in) superfluous padding."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    pads = len(text) - len(text.rstrip("="))
    if not pads:
        return text + "===="
    i = len(text) - pads - 1
    bumped = text[:i] + alphabet[alphabet.index(text[i]) + 1] + text[i + 1:]
    assert base64.b64decode(bumped) == base64.b64decode(text)  # what a lenient decoder makes of it
    return bumped


def test_rule_base64_is_canonical(tmp_path, monkeypatch):
    """3.3.1 and 3.4: base64 with non-zero bits before the padding, or with superfluous padding, is refused, in a
    tagged value's data and in a columnar chunk table's block (decoded leniently, each means the same bytes)."""
    from hpcckpt.format import chunk_columns

    monkeypatch.setattr(chunk_columns, "COLUMNAR_MIN_CHUNKS", 0)  # every table a block
    path = save(tmp_path / "v", {"s": np.int16(7), "b": np.bytes_(b"abc"),
                                 "u": hpcckpt.Block(np.arange(7.0), (0,), (7,))})
    stored = SpecReader(path).meta
    assert (stored["values"]["s"]["data"], stored["values"]["b"]["data"]) == ("BwA=", "YWJj")
    block = stored["variables"]["u"]["chunks"]["data"]
    for name, text, spelled in (("s", "BwA=", "BwB="), ("b", "YWJj", "YWJj===="), ("u", block, noncanonical(block))):
        assert noncanonical(text) == spelled
        sealed_edit(path, lambda d, name=name, spelled=spelled: (
            d["variables"][name]["chunks"] if name == "u" else d["values"][name]).update(data=spelled))
        refused(path, "not canonical base64")
        sealed_edit(path, lambda d, name=name, text=text: (
            d["variables"][name]["chunks"] if name == "u" else d["values"][name]).update(data=text))
    with hpcckpt.open(path) as view:
        assert view.values["s"] == np.int16(7) and view.values["b"] == b"abc"
        assert view.read("u").tolist() == list(range(7))


def test_rule_columnar_blocks_are_bounded_per_metadata_file(tmp_path):
    """3.3.1 check 2: the blocks of one metadata.json, all variables' tables together, at most 2^31 bytes,
    summed from `columns` and `rows` before any block is decoded (the blocks here are not even base64)."""
    path = save(tmp_path / "v", {"t": 1})
    names = ["file", "offset", "nbytes", "checksum", "start_0", "count_0"]
    rows = ((1 << 30) - 32) // (8 * len(names))  # each block just under 1 GiB: within its own bound

    def claims(count):
        def edit(d):
            for i in range(count):
                d["variables"][f"v{i}"] = {"kind": "block", "dtype": "|u1", "shape": [rows], "codec": {"id": "none"},
                                           "chunks": {"columns": names, "rows": rows, "data": "?"}}
        return edit

    sealed_edit(path, claims(3))
    refused(path, r"columnar chunk tables of this metadata.json would decode to 3221225376 bytes together")
    sealed_edit(path, lambda d: d["variables"].clear() or claims(2)(d))  # 2^31 - 64 bytes: the blocks are read
    refused(path, "data must be an ASCII base64 string|not valid base64")


def nested(depth: int, leaf):
    for _ in range(depth):
        leaf = [leaf]
    return leaf


def test_rule_nesting_levels_count_arrays_and_objects_only(tmp_path):
    """3.4: a tagged object and a per-rank object are not levels; 64 levels of arrays (or objects) are the most."""
    state = {"deep": nested(64, 1), "tagged": nested(64, np.float32(2.5)), "p": hpcckpt.PerRank(nested(64, 3))}
    path = save(tmp_path / "v", state)
    with hpcckpt.open(path) as view:
        assert view.values["deep"] == nested(64, 1) and view.values["tagged"] == nested(64, np.float32(2.5))
    out = hpcckpt.load({"p": hpcckpt.PerRank(None)}, path, comm=None, strict=False)
    assert out["p"].value == nested(64, 3)
    sealed_edit(path, lambda d: d["values"].update(deep=nested(65, 1)))
    refused(path, "nest more than 64 deep")
    sealed_edit(path, lambda d: d["values"].update(deep=1, p={"$hpcckpt": "per-rank", "values": [nested(65, 3)]}))
    refused(path, "nest more than 64 deep")


def test_rule_a_directory_named_for_a_step_holds_it_when_opened_directly(tmp_path):
    """1: the step in a version name binds however the directory is reached: through its root, by its own path,
    or through a link to it; a directory with another name claims nothing, and save refuses to break the rule."""
    import shutil

    root = tmp_path / "root"
    with hpcckpt.Checkpointer(str(root), comm=None, track_failures=False) as ck:
        ck.save({"t": 1}, step=1)
    elsewhere = tmp_path / "copies"
    elsewhere.mkdir()
    renamed = str(elsewhere / "step-000000000005")
    shutil.copytree(root / "step-000000000001", renamed)
    refused(renamed, "named for step 5 but its metadata holds step 1")
    os.symlink(renamed, elsewhere / "latest")
    refused(str(elsewhere / "latest"), "named for step 5 but its metadata holds step 1")  # its real name
    os.symlink(root / "step-000000000001", elsewhere / "step-000000000007")
    refused(str(elsewhere / "step-000000000007"), "named for step 7 but its metadata holds step 1")  # its own name
    shutil.copytree(root / "step-000000000001", elsewhere / "final")
    assert hpcckpt.open(str(elsewhere / "final")).step == 1
    assert hpcckpt.open(str(root)).step == 1
    with pytest.raises(hpcckpt.CheckpointError, match="is named for step 3: pass step=3"):
        save(tmp_path / "step-000000000003", {"t": 2})
    assert not os.path.exists(tmp_path / "step-000000000003")
    assert hpcckpt.open(save(tmp_path / "step-000000000003", {"t": 2}, step=3)).values["t"] == 2


def patch_chunk(path, name: str, patch) -> bytes:
    """Apply ``patch`` (bytearray -> None) to the first stored chunk of variable ``name`` and fix its checksum in
    the metadata (JSON-array tables), so that the codec's own checks are what refuses it; the bytes before."""
    reader = SpecReader(path)
    table = reader.table(reader.meta["variables"][name]["chunks"], len(reader.meta["variables"][name]["shape"]))
    file = reader.path(reader.meta["files"][table["file"][0]])
    with open(file, "r+b") as f:
        f.seek(table["offset"][0])
        before = f.read(table["nbytes"][0])
        data = bytearray(before)
        patch(data)
        f.seek(table["offset"][0])
        f.write(data)
    sealed_edit(path, lambda d: d["variables"][name]["chunks"]["checksum"].__setitem__(
        0, format(xxhash.xxh3_64_intdigest(bytes(data)), "016x")))
    return before


def test_rule_blosc_and_blosc2_header_versions(tmp_path):
    """compression.md: a blosc chunk is format version 2 with compressor format 1, nothing else; a blosc2 chunk
    is format 3 to 5, its byte 1 ignored."""
    u = np.linspace(0, 1, 4000)
    path = save(tmp_path / "blosc", blocks({"u": u}), codec="lz4")
    for pos, value in ((0, 3), (0, 1), (1, 2)):
        before = patch_chunk(path, "u", lambda b, pos=pos, value=value: b.__setitem__(pos, value))
        assert before[:2] == b"\x02\x01"
        refused(path, "a blosc chunk header says format version", "u")
        patch_chunk(path, "u", lambda b, before=before: b.__setitem__(slice(0, 2), before[:2]))
    assert hpcckpt.open(path).read("u").tobytes() == u.tobytes()
    pytest.importorskip("blosc2")
    path = save(tmp_path / "blosc2", blocks({"u": u}), codec="blosc2")
    patch_chunk(path, "u", lambda b: b.__setitem__(1, 7))
    assert hpcckpt.open(path).read("u").tobytes() == u.tobytes()
    for version in (2, 6):
        patch_chunk(path, "u", lambda b, version=version: b.__setitem__(0, version))
        refused(path, "names a format, compressor or flag", "u")


def test_rule_blosc2_bytedelta_meta_is_the_header_typesize(tmp_path):
    """compression.md, `blosc2`: a bytedelta slot's filter meta is the chunk header's typesize (byte 3), the
    element size the filter ran with; any other value is refused."""
    pytest.importorskip("blosc2")
    from hpcckpt.codecs import Blosc2

    u = np.cumsum(np.random.default_rng(5).standard_normal(3000))
    path = save(tmp_path / "v", blocks({"u": u}), codec=Blosc2(filters=["shuffle", "bytedelta"], typesize=4))
    header = patch_chunk(path, "u", lambda b: None)[:32]
    typesize, filters, meta = header[3], header[16:22], header[24:30]
    assert typesize == 4 and filters[1] == 35 and meta[1] == 4 and meta[0] == 0  # the slot of bytedelta
    assert hpcckpt.open(path).read("u").tobytes() == u.tobytes()
    for wrong in (0, 8):
        patch_chunk(path, "u", lambda b, wrong=wrong: b.__setitem__(25, wrong))
        refused(path, f"filter 35 \\(meta {wrong}\\)", "u")


@pytest.mark.parametrize("stored, written", [("|u1", "<u1"), ("|i1", ">i1"), ("|b1", "<b1"), ("|S3", ">S3"),
                                             ("|V4", "<V4")])
def test_rule_a_byte_order_where_none_applies_is_refused(tmp_path, stored, written):
    """3.2: `b1`, `i1`, `u1`, `S<n>` and `V<n>` take the mark `|`, never `<` or `>` (in a variable and in a
    tagged value); hpcckpt writes `|`."""
    arr = np.zeros(4, np.dtype(stored))
    path = save(tmp_path / "v", {"a": hpcckpt.Block(arr, (0,), (4,)), "s": arr[:1].copy()})
    with hpcckpt.open(path) as view:
        assert view.meta.variables["a"].dtype == np.dtype(stored)
    doc_ = SpecReader(path).meta
    assert doc_["variables"]["a"]["dtype"] == stored and doc_["values"]["s"]["dtype"] == stored
    sealed_edit(path, lambda d: d["variables"]["a"].update(dtype=written))
    refused(path, "needs the byte order mark '|'")
    sealed_edit(path, lambda d: d["variables"]["a"].update(dtype=stored) or d["values"]["s"].update(dtype=written))
    refused(path, "needs the byte order mark '|'")


# --------------------------------------------------------------------------- the SZ3 stream (compression.md)

def sz3_stream(chunk: bytes) -> tuple[dict, bytes]:
    """The hpcckpt header (40 bytes) and the SZ3 stream of an `hpcckpt.sz3` chunk, from compression.md only."""
    magic, kind, n, k, stream_len, param = struct.unpack_from("<4sIQQQd", chunk)
    assert magic == b"HSZ3" and kind in (0, 1)
    head = {"kind": kind, "n": n, "k": k, "stream_len": stream_len, "param": param}
    return head, chunk[len(chunk) - stream_len:]


def sz3_config(stream: bytes) -> dict:
    """The 16-byte header and the Config of an SZ3 stream, field by field as compression.md lays them out."""
    magic, version, payload = struct.unpack_from("<IIQ", stream)
    pos = 16 + payload
    size, ndim, width = stream[pos], stream[pos + 1], stream[pos + 2]
    packed = -(-ndim * width // 8)
    bits = int.from_bytes(stream[pos + 3:pos + 3 + packed], "little")
    dims = [(bits >> (i * width)) % (1 << width) for i in range(ndim)]
    num, algo, mode, bound, _flags, dtype_code, quantbins, block, pred_dim = struct.unpack_from(
        "<QBBdBBiiB", stream, pos + 3 + packed)
    end = pos + 3 + packed + struct.calcsize("<QBBdBBiiB")
    return {"magic": magic, "version": version, "payload": payload, "size": size, "dims": dims, "num": num,
            "algo": algo, "mode": mode, "bound": bound, "dtype_code": dtype_code, "parsed_to": end,
            "config_at": pos}


def test_rule_sz3_stream_is_sz3s_own_as_documented(tmp_path):
    """compression.md "The SZ3 stream": the header and Config parsed by the struct code above from the doc's
    text match what hpcckpt stored (dims = the chunk's axes of extent > 1, the bound, the length), and a stream
    whose Config disagrees with the chunk is refused before SZ3 sees it."""
    pysz = pytest.importorskip("pysz")
    from importlib.metadata import version as installed

    from hpcckpt.codecs import SZ3

    rng = np.random.default_rng(9)
    f = np.cumsum(rng.standard_normal((1, 12, 9)), axis=2).astype(np.float32)
    d = np.cumsum(rng.standard_normal(300))
    path = save(tmp_path / "v", {"f": hpcckpt.Block(f, (0, 0, 0), f.shape), "d": hpcckpt.Block(d, (0,), d.shape),
                                 "five": hpcckpt.Block(np.ones((2, 2, 2, 2, 2), np.float32), (0,) * 5, (2,) * 5)},
                codec=SZ3(abs=1e-3))
    for name, n, dims in (("f", 108, [12, 9]), ("d", 300, [300])):
        head, stream = sz3_stream(patch_chunk(path, name, lambda b: None))
        assert head["kind"] == 0 and head["n"] == n and len(stream) == head["stream_len"]
        cfg = sz3_config(stream)
        assert cfg["magic"] == 0xF342F310 and stream[:4] == bytes.fromhex("10f342f3")
        assert cfg["version"] >> 24 == 3 and cfg["version"] & 0xFF == 0
        if installed("pysz") == "1.1.0":
            assert cfg["version"] == 0x03040000
        assert 16 + cfg["payload"] + cfg["size"] == len(stream) == cfg["parsed_to"]
        assert cfg["dims"] == dims and cfg["num"] == n and cfg["mode"] == 0 and cfg["bound"] == 1e-3
        assert cfg["dtype_code"] == 0  # SZ3 leaves it 0, for the float64 variable too
        work = np.float32 if name == "f" else np.float64
        y = pysz.sz.decompress(np.frombuffer(stream, np.uint8), work, (n,))[0]
        assert np.max(np.abs(y - (f if name == "f" else d).reshape(-1))) <= 1e-3
    assert sz3_stream(patch_chunk(path, "five", lambda b: None))[0]["kind"] == 1  # 5 axes > 1: stored raw

    def bad_num(b):  # the Config's num, after C, N, w and the 2 bytes of 9-bit dims: 300 -> 299
        head, stream = sz3_stream(bytes(b))
        at = len(b) - head["stream_len"] + sz3_config(stream)["config_at"] + 3 + 2
        assert struct.unpack_from("<Q", b, at)[0] == 300
        b[at:at + 8] = struct.pack("<Q", 299)

    patch_chunk(path, "d", bad_num)
    refused(path, r"an SZ3 stream declares dims \[300\] \(299 values\)", "d")
