"""ZFP (PyPI ``zfpy``) as a lossy codec: ``hpcckpt.codecs.ZFP``.

``ZFP(accuracy=t)``: fixed accuracy, ``|x - x'| <= t`` for every element.
``ZFP(precision=p)``: fixed precision, ``p`` bit planes (1..64) per block: no absolute bound.
``ZFP(rate=r)``: fixed rate, ``r`` bits per value (0 < r <= the dtype's bits): no bound, a known size
(chunks with ``r * 4**ndim < 64`` are stored raw: zfpy overruns its buffer there).
``ZFP(reversible=True)``: lossless (float16/32/64, int32, int64).

The chunk is compressed in its own shape (up to 4 axes; leading axes are
merged beyond that) with ``zfpy.compress_numpy``, whose stream carries ZFP's
full header (shape, type, mode).  NaN and +-Inf are set aside and restored bit
for bit in every mode, and so is any element outside the bound (accuracy) or
not restored exactly (reversible) (bounded.py).
Config: ``{"id": "hpcckpt.zfp", "accuracy" | "precision" | "rate" | "reversible": value}``.
"""

from __future__ import annotations

import numpy as np

from hpcckpt.errors import CheckpointError, CorruptCheckpointError
from hpcckpt.codecs.bounded import BoundedCodec, check_bound, check_float_dtype, inexact, library, violations
from hpcckpt.codecs.core import CodecFamily, register_family

ID = "hpcckpt.zfp"
MODES = ("accuracy", "precision", "rate", "reversible")
_ZTYPES = {np.dtype(np.float32): "float32", np.dtype(np.float64): "float64",
           np.dtype(np.int32): "int32", np.dtype(np.int64): "int64"}
#: zfpy 1.0.1 overruns its buffer in fixed-rate mode below one 64-bit word per block (rate * 4**ndim < 64,
#: e.g. rate 2 on a 1-D chunk with a partial block): such chunks are stored raw instead.
MIN_BLOCK_BITS = 64


def _zfpy():
    return library("zfpy", "zfp")


def _check_value(mode, value, dtype, error):
    if mode == "accuracy":
        return check_bound(value, mode, error)
    if mode == "precision":
        if type(value) is not int or not 1 <= value <= 64:
            raise error(f"ZFP precision is an integer in [1, 64], got {value!r}")
        return value
    if mode == "rate":
        bits = 8 * max(4, np.dtype(dtype).itemsize) if dtype is not None else 64
        if type(value) not in (int, float) or not 0 < value <= bits:
            raise error(f"ZFP rate is a number of bits per value in (0, {bits}], got {value!r}")
        return float(value)
    if value is not True:
        raise error(f"ZFP reversible is true, got {value!r}")
    return True


class ZFP:
    """A ZFP spec: exactly one of ``accuracy``, ``precision``, ``rate`` or ``reversible=True``."""

    def __init__(self, accuracy=None, precision=None, rate=None, reversible=None):
        given = {m: v for m, v in zip(MODES, (accuracy, precision, rate, reversible)) if v is not None}
        if len(given) != 1:
            raise CheckpointError("ZFP needs exactly one of accuracy=..., precision=..., rate=... or reversible=True")
        (self.mode, value), = given.items()
        if self.mode in ("accuracy", "rate") and isinstance(value, bool):
            raise CheckpointError(f"ZFP {self.mode} must be a number, got {value!r}")
        self.value = _check_value(self.mode, float(value) if self.mode == "accuracy" and isinstance(
            value, int) else value, None, CheckpointError)
        _zfpy()

    def config(self) -> dict:
        return {"id": ID, self.mode: self.value}

    def __repr__(self) -> str:
        return f"ZFP({self.mode}={self.value})"


def check_zfp_config(cfg, dtype, error=CorruptCheckpointError) -> dict:
    modes = [m for m in MODES if m in cfg]
    extra = sorted(set(cfg) - {"id", *MODES})
    if extra or len(modes) != 1:
        raise error(f"a {ID} config has exactly one of {list(MODES)} (got {sorted(cfg)[:8]})")
    mode = modes[0]
    dtype = np.dtype(dtype)
    if mode == "reversible" and dtype.kind == "i" and dtype.itemsize in (4, 8):
        pass
    else:
        check_float_dtype(dtype, "ZFP" if mode == "reversible" else f"ZFP {mode}", error)
    return {"id": ID, mode: _check_value(mode, cfg[mode], dtype, error)}


class ZFPCodec(BoundedCodec):
    MAGIC = b"HZFP"

    def __init__(self, config: dict, dtype):
        super().__init__(config, dtype)
        self.mode = next(m for m in MODES if m in config)
        self.value = config[self.mode]

    def compress(self, w, x64):
        if w.ndim > 4:
            w = w.reshape((-1,) + w.shape[-3:])
        if self.mode == "rate" and self.value * 4 ** w.ndim < MIN_BLOCK_BITS:
            raise ValueError("rate too low for this chunk's dimensionality")  # stored raw (see MIN_BLOCK_BITS)
        kwargs = {} if self.mode == "reversible" else {
            {"accuracy": "tolerance"}.get(self.mode, self.mode): self.value}
        return _zfpy().compress_numpy(np.ascontiguousarray(w), **kwargs), 0.0

    def expand(self, stream, n, param):
        zfpy = _zfpy()
        data = bytes(stream)
        try:
            head = zfpy.header(data)
        except Exception as exc:  # zfpy raises bare Exceptions for a bad header
            raise CorruptCheckpointError(f"ZFP cannot read a chunk's header: {exc}") from None
        dims = [head[k] for k in ("nx", "ny", "nz", "nw") if head[k]]
        if np.dtype(head["type"]) != self.work or not dims or int(np.prod(dims, dtype=np.float64)) != n:
            raise CorruptCheckpointError(f"a ZFP stream declares {head['type'].__name__} of shape {dims[::-1]}, "
                                         f"not {n} elements of {self.work}")
        # ZFP's decoder reads its bit stream without a bound check: pad so that a crafted stream reads zeros.
        padded = data + bytes(2 * n * self.work.itemsize + 4096)
        try:
            y = zfpy.decompress_numpy(padded)
        except Exception as exc:
            raise CorruptCheckpointError(f"ZFP cannot decompress a chunk: {exc}") from None
        return y.reshape(-1)

    def misses(self, x, y, x64):
        if self.mode == "accuracy":
            return violations(x, y, self.value)
        if self.mode == "reversible":
            bad = inexact(x, y)
            if x.dtype.kind == "f":
                bad = np.union1d(bad, np.flatnonzero(~np.isfinite(x64)))
            return bad
        return violations(x, y, None)


register_family(ID, CodecFamily(check=check_zfp_config, make=ZFPCodec, spec_type=ZFP))
