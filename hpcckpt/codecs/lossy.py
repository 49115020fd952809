"""Error-bounded lossy compression of floating-point variables: ``hpcckpt.codecs.Lossy``.

``Lossy(abs=b)``: every element is restored within ``b``: ``|x - x'| <= b``.
``Lossy(rel=r)``: within ``r`` times the value range of the chunk the element
is stored in: ``|x - x'| <= r * (max - min)``, max and min over the chunk's
finite values (so also within ``r`` times the range of the whole array).
NaN, +-Inf and -0.0 (whose sign q = 0 would lose; SZ3 and ZFP keep it too) are
restored bit for bit, and so is any element the quantizer could not bring within
the bound: all are outliers, stored verbatim in the chunk's layout.  Lossy is
used only where a caller asks for it, per variable or as the save's default.

The config stored in the metadata, e.g.
``{"id": "hpcckpt.quantize", "rel": 0.0001, "compressor": {"id": "zstd", "level": 1, "checksum": false}}``,
records the bound.  The chunk layout is in docs/compression.md; the
filters (quantization, deltas, byte shuffle) are kernels.py's, run with numpy
here and with CuPy on GPU ranks (gpu.py), the compressor is numcodecs'.
"""

from __future__ import annotations

import math
import struct

import numpy as np

from hpcckpt.errors import CheckpointError, CorruptCheckpointError
from hpcckpt.codecs import kernels
from hpcckpt.codecs.core import Codec, CodecFamily, Compressor, check_compressor, register_family

MAGIC = b"HCQ1"
HEADER = struct.Struct("<4sBBhIqQQQQd")  # magic, mode, width, e, reserved, ref, n, n_out, len_q, len_o, bound
RAW, QUANTIZED = 0, 1
DEFAULT_COMPRESSOR = {"id": "zstd", "level": 1, "checksum": False}
_FLOATS = ("f2", "f4", "f8")


class Lossy:
    """An error-bounded lossy codec spec: exactly one of ``abs`` (absolute) or ``rel`` (relative to the range).

    ``compressor`` is the lossless stage after quantization: "zstd" (default),
    "lz4", or a numcodecs config dict of blosc/zstd/lz4.
    """

    def __init__(self, abs=None, rel=None, compressor="zstd"):  # noqa: A002 - the public keyword
        if (abs is None) == (rel is None):
            raise CheckpointError("Lossy needs exactly one of abs=... or rel=...")
        value = abs if abs is not None else rel
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                math.isfinite(value) and value > 0):
            raise CheckpointError(f"a Lossy bound must be a finite positive number, got {value!r}")
        if rel is not None and rel >= 0.5:
            raise CheckpointError(f"Lossy(rel=...) must be below 0.5, got {rel!r}")
        self.mode = "abs" if abs is not None else "rel"
        self.bound = float(value)
        if isinstance(compressor, str):
            compressor = {"zstd": DEFAULT_COMPRESSOR, "lz4": {"id": "lz4", "acceleration": 1}}.get(compressor)
            if compressor is None:
                raise CheckpointError("Lossy(compressor=...) is 'zstd', 'lz4' or a numcodecs config dict")
        self.compressor = check_compressor(compressor, CheckpointError)

    def config(self) -> dict:
        return {"id": "hpcckpt.quantize", self.mode: self.bound, "compressor": dict(self.compressor)}

    def __repr__(self) -> str:
        return f"Lossy({self.mode}={self.bound})"


def check_quantize_config(cfg, dtype, error=CorruptCheckpointError) -> dict:
    modes = [m for m in ("abs", "rel") if m in cfg]
    extra = sorted(set(cfg) - {"id", "abs", "rel", "compressor"})
    if extra or len(modes) != 1:
        raise error(f"a hpcckpt.quantize config has exactly one of 'abs'/'rel' and a 'compressor' (got {sorted(cfg)})")
    mode = modes[0]
    value = cfg[mode]
    if type(value) not in (int, float) or not (math.isfinite(value) and value > 0) or (mode == "rel" and value >= 0.5):
        raise error(f"a hpcckpt.quantize bound must be a finite positive number (rel below 0.5), got {value!r}")
    dtype = np.dtype(dtype)
    if dtype.kind != "f" or f"f{dtype.itemsize}" not in _FLOATS:
        raise error(f"lossy compression needs a float16/32/64 variable, not {dtype}")
    return {"id": "hpcckpt.quantize", mode: float(value),
            "compressor": check_compressor(cfg.get("compressor", DEFAULT_COMPRESSOR), error)}


class QuantizeCodec(Codec):
    """``hpcckpt.quantize``: see the module docstring and docs/compression.md."""

    lossy = True

    def __init__(self, config: dict, dtype):
        self.config = config
        self.dtype = np.dtype(dtype)
        self.mode = "abs" if "abs" in config else "rel"
        self.bound = config[self.mode]
        self.compressor = Compressor(config["compressor"])

    # The encoder is split in two so that GPU ranks run the first half on the device:
    # filter() -> (header fields, device streams), then finish() compresses the streams on the host.
    def filter(self, xp, x):
        """Quantize, delta and shuffle the flat array ``x`` (module ``xp``): header fields and byte streams.

        The streams may live in the calling thread's scratch buffers (kernels.WORK): use them before
        this thread filters another chunk.
        """
        x = x.reshape(-1)
        bound = self.bound
        lohi = kernels.value_range(xp, x)  # NaN/Inf if the chunk holds any: then the slow bound below
        if self.mode == "rel":
            if math.isfinite(lohi[0]) and math.isfinite(lohi[1]):
                bound = kernels.range_bound(lohi[0], lohi[1], self.bound)
            else:
                x64 = x.astype(np.float64)
                bound = kernels.chunk_bound(xp, x64, xp.isfinite(x64), self.bound)
        res = kernels.quantize(xp, x, bound, lohi=lohi, shuffled=True)
        n = int(x.size)
        if res is None:
            return (RAW, 0, 0, 0, n, 0, float(bound)), [kernels.shuffle(xp, x.view(np.uint8), x.dtype.itemsize)]
        n_out = int(res["idx"].size)
        if n_out:
            outliers = xp.concatenate([res["idx"].astype("<u8").view(np.uint8), res["vals"].view(np.uint8)])
        else:
            outliers = xp.zeros(0, np.uint8)
        return (QUANTIZED, res["width"], res["e"], res["ref"], n, n_out, float(bound)), [res["zz"], outliers]

    def finish(self, fields, streams) -> np.ndarray:
        """Compress the (host) streams and prepend the header: the stored bytes of the chunk."""
        mode, width, e, ref, n, n_out, bound = fields
        parts = [self.compressor.compress(np.ascontiguousarray(s)) for s in streams]
        lens = [p.nbytes for p in parts] + [0] * (2 - len(parts))
        header = HEADER.pack(MAGIC, mode, width, e, 0, ref, n, n_out, lens[0], lens[1], bound)
        out = np.empty(HEADER.size + sum(lens), np.uint8)
        out[:HEADER.size] = np.frombuffer(header, np.uint8)
        pos = HEADER.size
        for p in parts:
            out[pos:pos + p.nbytes] = p
            pos += p.nbytes
        return out

    def encode(self, arr):
        fields, streams = self.filter(np, arr)
        return self.finish(fields, streams)

    # Decoding: unpack() checks the header and decompresses on the host; unfilter() runs on either device.
    def unpack(self, stored, n: int):
        if stored.nbytes < HEADER.size:
            raise CorruptCheckpointError("a lossy chunk is shorter than its header")
        magic, mode, width, e, _, ref, n_stored, n_out, len_q, len_o, _ = HEADER.unpack_from(stored, 0)
        itemsize = self.dtype.itemsize
        if magic != MAGIC or mode not in (RAW, QUANTIZED) or n_stored != n or HEADER.size + len_q + len_o != stored.nbytes:
            raise CorruptCheckpointError("a lossy chunk has a malformed header")
        body = stored[HEADER.size:]
        if mode == RAW:
            if len_o or n_out:
                raise CorruptCheckpointError("a raw lossy chunk has an outlier stream")
            data = np.empty(n * itemsize, np.uint8)
            self.compressor.decompress(body[:len_q], data)
            return (RAW, 0, 0, 0, n, 0), [data]
        if width not in kernels.WIDTHS or n_out > n or not -1074 <= e <= 1023:
            raise CorruptCheckpointError("a lossy chunk has a malformed header")
        zz = kernels.WORK.get(np, "unpack-q", (n - n_out) * width)
        self.compressor.decompress(body[:len_q], zz)
        outliers = np.empty(n_out * (8 + itemsize), np.uint8)
        self.compressor.decompress(body[len_q:], outliers)
        return (QUANTIZED, width, e, ref, n, n_out), [zz, outliers]

    def unfilter(self, xp, fields, streams, out=None):
        """The flat decoded array (module ``xp``) from unpack()'s fields and streams (moved to ``xp``).

        Written into ``out`` (flat, of the variable's dtype) when given.
        """
        mode, width, e, ref, n, n_out = fields
        if mode == RAW:
            data = kernels.unshuffle(xp, streams[0], self.dtype.itemsize).view(self.dtype)
            if out is None:
                return data
            out[...] = data
            return out
        zz = kernels.unshuffle(xp, streams[0], width, work=kernels.WORK).view(np.dtype(f"<u{width}"))
        idx = streams[1][:8 * n_out].view("<u8")
        vals = streams[1][8 * n_out:].view(self.dtype)
        if n_out and (bool((idx[1:] <= idx[:-1]).any()) or int(idx[-1]) >= n):
            raise CorruptCheckpointError("a lossy chunk has malformed outlier positions")
        return kernels.dequantize(xp, zz, ref, e, idx.astype(np.int64), vals, n, self.dtype, out=out)

    def decode(self, stored, out):
        itemsize = self.dtype.itemsize
        if out.nbytes % itemsize:
            raise CorruptCheckpointError("a lossy chunk's extent is not a whole number of elements")
        fields, streams = self.unpack(stored, out.nbytes // itemsize)
        self.unfilter(np, fields, streams, out=out.view(self.dtype).reshape(-1))


register_family("hpcckpt.quantize", CodecFamily(check=check_quantize_config, make=QuantizeCodec, spec_type=Lossy))
