"""SZ3 (PyPI ``pysz``) as an error-bounded lossy codec: ``hpcckpt.codecs.SZ3``.

``SZ3(abs=b)``: ``|x - x'| <= b`` for every element.
``SZ3(rel=r)``: ``|x - x'| <= r * (max - min)``, max and min over the finite
values of the chunk (the same bound as ``Lossy(rel=r)``).
``SZ3(pw_rel=r)``: point-wise, ``|x - x'| <= r * |x|`` (zeros are kept exactly).

The chunk is compressed in its own shape (SZ3 predicts along every axis) with
SZ3's absolute mode: ``abs`` as given, ``rel`` converted to the chunk's
absolute bound, ``pw_rel`` through the transform below.  NaN, +-Inf and any
element outside the bound are set aside and restored bit for bit (bounded.py).
Config: ``{"id": "hpcckpt.sz3", "abs" | "rel" | "pw_rel": bound}``.

``pw_rel`` compresses, in float64, ``t = sign(x) * (log2|x| + c)`` for
``x != 0`` and ``t = 0`` for zeros, with ``c = 1 - min(log2|x|)`` over the
chunk's finite non-zero values (stored as the header's param) and the absolute
bound ``log2(1 + r)``; it decodes ``x = 0`` where ``|t| < 0.5`` and
``sign(t) * 2 ** (|t| - c)`` elsewhere (see docs/format.md).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import CheckpointError, CorruptCheckpointError
from .bounded import BoundedCodec, check_bound, check_float_dtype, finite_range_bound, library, violations
from .core import CodecFamily, register_family

ID = "hpcckpt.sz3"
MODES = ("abs", "rel", "pw_rel")
#: Upper limits of the relative bounds (``pw_rel`` keeps log2(1 + r) below 0.5, so zeros stay apart).
UPPER = {"abs": None, "rel": 0.5, "pw_rel": 0.4}


def _pysz():
    return library("pysz", "sz3")


class SZ3:
    """An SZ3 spec: exactly one of ``abs``, ``rel`` (relative to the chunk's range) or ``pw_rel`` (point-wise)."""

    def __init__(self, abs=None, rel=None, pw_rel=None):  # noqa: A002 - Lossy's spelling
        given = {m: v for m, v in (("abs", abs), ("rel", rel), ("pw_rel", pw_rel)) if v is not None}
        if len(given) != 1:
            raise CheckpointError("SZ3 needs exactly one of abs=..., rel=... or pw_rel=...")
        (self.mode, value), = given.items()
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CheckpointError(f"an SZ3 bound must be a finite positive number, got {value!r}")
        self.bound = check_bound(value, self.mode, CheckpointError, UPPER[self.mode])
        _pysz()  # at the spec, not in a codec thread: a missing library is said once, clearly

    def config(self) -> dict:
        return {"id": ID, self.mode: self.bound}

    def __repr__(self) -> str:
        return f"SZ3({self.mode}={self.bound})"


def check_sz3_config(cfg, dtype, error=CorruptCheckpointError) -> dict:
    modes = [m for m in MODES if m in cfg]
    extra = sorted(set(cfg) - {"id", *MODES})
    if extra or len(modes) != 1:
        raise error(f"a {ID} config has exactly one of {list(MODES)} (got {sorted(cfg)[:8]})")
    mode = modes[0]
    bound = check_bound(cfg[mode], mode, error, UPPER[mode])
    check_float_dtype(dtype, "SZ3", error)
    return {"id": ID, mode: bound}


class SZ3Codec(BoundedCodec):
    MAGIC = b"HSZ3"

    def __init__(self, config: dict, dtype):
        super().__init__(config, dtype)
        self.mode = next(m for m in MODES if m in config)
        self.bound = config[self.mode]

    @staticmethod
    def _sz(w, bound):
        pysz = _pysz()
        conf = pysz.szConfig()
        conf.errorBoundMode = pysz.szErrorBoundMode.ABS
        conf.absErrorBound = bound
        stream, _ = pysz.sz.compress(np.ascontiguousarray(w), conf)
        return stream

    def compress(self, w, x64):
        if self.mode == "abs":
            return self._sz(w, self.bound), 0.0
        if self.mode == "rel":
            bound = finite_range_bound(x64, self.bound)
            return self._sz(w, bound if bound > 0 else np.finfo(np.float64).tiny), 0.0
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            a = np.abs(x64)
            use = np.isfinite(a) & (a > 0)
            logs = np.log2(np.where(use, a, 1.0))
            c = 1.0 - float(logs[use].min()) if use.any() else 1.0
            t = np.where(use, np.copysign(logs + c, x64), 0.0)
        return self._sz(t.reshape(w.shape), math.log2(1 + self.bound) * (1 - 1e-9)), c

    def expand(self, stream, n, param):
        pysz = _pysz()
        work = np.float64 if self.mode == "pw_rel" else self.work
        try:
            y, _ = pysz.sz.decompress(np.ascontiguousarray(stream), work, (n,))
        except Exception as exc:  # pysz turns SZ3's C++ exceptions into various Python ones
            raise CorruptCheckpointError(f"SZ3 cannot decompress a chunk: {exc}") from None
        y = y.reshape(-1)
        if y.size != n:
            raise CorruptCheckpointError(f"an SZ3 stream decodes to {y.size} elements, not {n}")
        if self.mode != "pw_rel":
            return y
        with np.errstate(over="ignore", invalid="ignore"):
            return np.where(np.abs(y) < 0.5, 0.0, np.copysign(np.exp2(np.abs(y) - param), y))

    def misses(self, x, y, x64):
        if self.mode == "abs":
            return violations(x, y, self.bound)
        if self.mode == "rel":
            return violations(x, y, finite_range_bound(x64, self.bound))
        return violations(x, y, self.bound, pointwise=True)


register_family(ID, CodecFamily(check=check_sz3_config, make=SZ3Codec, spec_type=SZ3))
