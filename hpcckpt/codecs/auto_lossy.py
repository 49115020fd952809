"""``AutoLossy(abs=b)`` / ``AutoLossy(rel=r)``: the error-bounded codec of each variable picked at save time.

The user gives the bound; the save picks, per variable, the lossy codec that
is estimated to save fastest at that bound: the own quantizer
(``Lossy``), SZ3 (``SZ3``, where pysz is installed) or, for an absolute bound,
ZFP's fixed-accuracy mode (``ZFP(accuracy=b)``, where zfpy is installed; ZFP has
no mode relative to a chunk's range, so it is no candidate for ``rel``).  Every
candidate keeps the bound on every element (it is each codec's own promise:
lossy.py, bounded.py), so the bound holds whatever is picked.

Every rank encodes a sample of its part with each candidate it can run (at
most ``SAMPLE_BYTES`` in three blocks of the array's own shape, from its start,
middle and end, so that SZ3 and ZFP predict along every axis as they do on a
chunk), timing it (the least of TIMED_RUNS runs); rank 0 weighs the ranks' measurements as ``codec="auto"``
does (auto.estimate: compress time over the codec threads plus the stored
bytes over the measured write bandwidth) and picks the candidate with the
least estimated save time among those every rank measured.  The decision is
rank 0's and reaches every rank with the save's codec configs, so all ranks
encode a variable with the same codec; the stored config is the chosen
codec's own (``hpcckpt.quantize``, ``hpcckpt.sz3`` or ``hpcckpt.zfp``): a reader
never meets ``AutoLossy``.  A rank holding a CuPy array measures only the
quantizer, the one lossy codec with device kernels.
"""

from __future__ import annotations

import importlib.util

import numpy as np

from hpcckpt.core.devices import array_module, is_device_array, to_host
from hpcckpt.errors import CheckpointError
from hpcckpt.codecs import auto, sz3, zfp
from hpcckpt.codecs.bounded import check_bound, check_float_dtype
from hpcckpt.codecs.core import register_spec, resolve
from hpcckpt.codecs.lossy import Lossy

ID = "hpcckpt.auto-lossy"
#: Bytes of a rank's sample (three blocks of the array's own axes: SZ3 and ZFP predict in 2-D/3-D neighbourhoods).
SAMPLE_BYTES = 96 << 10
#: Timed encodes of the sample per candidate (the least counts): a scheduler hiccup in one run must not
#: decide.
TIMED_RUNS = 2
#: Candidate names in the order ties are broken.
CANDIDATES = ("quantize", "sz3", "zfp")


class AutoLossy:
    """A lossy spec whose codec is chosen per variable at save time: exactly one of ``abs`` or ``rel``.

    ``abs``: ``|x - x'| <= abs`` for every element; ``rel``: ``|x - x'| <= rel * (max - min)`` over the
    finite values of the chunk the element is stored in (the bound of ``Lossy(rel=...)``).
    """

    def __init__(self, abs=None, rel=None):  # noqa: A002 - Lossy's spelling
        if (abs is None) == (rel is None):
            raise CheckpointError("AutoLossy needs exactly one of abs=... or rel=...")
        self.mode = "abs" if abs is not None else "rel"
        value = abs if abs is not None else rel
        if isinstance(value, bool):
            raise CheckpointError(f"an AutoLossy bound must be a finite positive number, got {value!r}")
        self.bound = check_bound(value, self.mode, CheckpointError, 0.5 if self.mode == "rel" else None)

    def config(self) -> dict:
        """The JSON form of the spec (what the ranks compare; never stored in a checkpoint)."""
        return {"id": ID, self.mode: self.bound}

    def __repr__(self) -> str:
        return f"AutoLossy({self.mode}={self.bound})"


def check_spec(spec: dict) -> tuple[str, float]:
    """(mode, bound) of the JSON form of an AutoLossy spec; CheckpointError if it is malformed."""
    modes = [m for m in ("abs", "rel") if m in spec]
    if len(modes) != 1 or set(spec) - {"id", "abs", "rel"}:
        raise CheckpointError(f"an {ID} spec has exactly one of 'abs' or 'rel' (got {sorted(spec)[:8]})")
    mode = modes[0]
    return mode, check_bound(spec[mode], mode, CheckpointError, 0.5 if mode == "rel" else None)


def is_auto_lossy(spec) -> bool:
    return isinstance(spec, dict) and spec.get("id") == ID


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def config_of(name: str, mode: str, bound: float) -> dict:
    """The codec config (JSON) of candidate ``name`` at the bound."""
    if name == "quantize":
        return Lossy(**{mode: bound}).config()
    if name == "sz3":
        return {"id": sz3.ID, mode: bound}
    return {"id": zfp.ID, "accuracy": bound}


def choices(spec: dict) -> list[dict]:
    """The configs an AutoLossy spec may choose (CANDIDATES' order: the quantizer first)."""
    mode, bound = check_spec(spec)
    return [config_of(n, mode, bound) for n in CANDIDATES if n != "zfp" or mode == "abs"]


def runnable(mode: str, device: bool = False) -> list[str]:
    """The candidates this process can run for a bound of ``mode`` (on a CuPy array: the quantizer only)."""
    if device:
        return ["quantize"]
    return ["quantize"] + (["sz3"] if _installed("pysz") else []) + (
        ["zfp"] if mode == "abs" and _installed("zfpy") else [])


def block_shape(shape: tuple, elements: int) -> tuple:
    """A sub-block of ``shape`` with at most about ``elements`` elements, as near a cube as ``shape`` allows."""
    out = list(shape)
    left = max(1, elements)
    order = sorted(range(len(shape)), key=lambda i: shape[i])  # short axes first: they take their whole length
    for k, i in enumerate(order):
        side = max(1, int(left ** (1.0 / (len(shape) - k))))
        out[i] = min(shape[i], side)
        left = max(1, left // out[i])
    return tuple(out)


def sample_blocks(arr) -> list[np.ndarray]:
    """Up to SAMPLE_BYTES of ``arr`` in three blocks of its own number of axes (host copies, C-contiguous)."""
    xp = array_module(arr)
    if arr.ndim <= 1 or arr.nbytes <= SAMPLE_BYTES:
        return [to_host(xp.ascontiguousarray(arr).reshape(arr.shape if arr.ndim > 1 else -1))]
    block = block_shape(arr.shape, SAMPLE_BYTES // (3 * arr.itemsize))
    inner = tuple(slice((n - b) // 2, (n - b) // 2 + b) for n, b in zip(arr.shape[1:], block[1:]))
    starts = sorted({0, (arr.shape[0] - block[0]) // 2, arr.shape[0] - block[0]})
    return [to_host(xp.ascontiguousarray(arr[(slice(s, s + block[0]),) + inner])) for s in starts]


def measure(arr, dtype, spec: dict) -> dict:
    """This rank's sample measurement of every candidate it can run (JSON-able, as auto.measure's)."""
    dtype = np.dtype(dtype)
    mode, bound = check_spec(spec)
    nbytes = int(arr.nbytes) if arr is not None else 0
    out = {"bytes": nbytes, "bw": auto.write_bandwidth(), "sample": 0, "seconds": {}, "stored": {}}
    if arr is None or nbytes == 0 or dtype.kind != "f":  # a non-float variable: decide() says why
        return out
    parts = sample_blocks(arr)
    out["sample"] = int(sum(p.nbytes for p in parts))
    for name in runnable(mode, is_device_array(arr)):
        out["seconds"][name], out["stored"][name] = auto.timed_encode(resolve(config_of(name, mode, bound), dtype),
                                                                      parts, TIMED_RUNS)
    return out


def decide(spec: dict, dtype, measurements: list[dict], threads: int) -> dict:
    """Rank 0: the codec config (JSON) for a variable of ``dtype`` from every rank's measurement.

    The candidate every sampled rank measured with the least estimated save time (ties: CANDIDATES'
    order); the quantizer when no rank holds data.  CheckpointError for a variable that is not float.
    """
    mode, bound = check_spec(spec)
    check_float_dtype(dtype, "AutoLossy", CheckpointError)
    sampled = [m for m in measurements if m["sample"]]
    names = auto.measured_by_all(sampled, CANDIDATES) if sampled else []
    if not names:
        return config_of("quantize", mode, bound)
    total = sum(m["bytes"] for m in measurements)
    bw = float(np.mean([m["bw"] for m in measurements]))
    best = min(names, key=lambda n: (auto.estimate(sampled, n, total, bw, threads), CANDIDATES.index(n)))
    return config_of(best, mode, bound)


register_spec(ID, AutoLossy)
