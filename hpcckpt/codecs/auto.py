"""``codec="auto"``: compress a variable only where it pays, judged from a small sample.

Every rank compresses a sample of its local part (at most ``SAMPLE_BYTES``,
taken from three places) with each candidate (blosc lz4 and zstd, and blosc2 lz4 and zstd where the blosc2
package is installed: ``candidates()``), timing it,
and sends (local bytes, sample bytes, seconds and compressed bytes per
candidate, its write bandwidth) with its save summary.  Rank 0 then estimates
for the whole variable

    none:      B / bw
    candidate: B * t / threads + B / (ratio * bw)     (compression not overlapped with writing)

and picks a candidate only when it beats ``none`` by ``MARGIN``.  The write
bandwidth is the one measured on this process's earlier saves (an average of
the stored bytes over the write seconds, compression waits excluded), or
``DEFAULT_WRITE_BANDWIDTH`` before the first save.  On incompressible data the
whole cost of auto is the sample: a few milliseconds per variable.
"""

from __future__ import annotations

import time

import numpy as np

from hpcckpt.core.devices import array_module, to_host
from hpcckpt.codecs import blosc2_codec
from hpcckpt.codecs.core import resolve

SAMPLE_BYTES = 96 << 10
#: Below this many bytes (whole variable) auto does not compress: nothing to win.
MIN_BYTES = 1 << 20
#: Bytes/s assumed for the storage before a save has been measured (a share of a parallel file system).
DEFAULT_WRITE_BANDWIDTH = 1e9
#: A candidate must be estimated at least this much faster than none.
MARGIN = 0.85
CANDIDATES = ("lz4", "zstd")
#: Considered too where the blosc2 package is installed.
BLOSC2_CANDIDATES = ("blosc2-lz4", "blosc2-zstd")


def candidates() -> tuple[str, ...]:
    return CANDIDATES + (BLOSC2_CANDIDATES if blosc2_codec.available() else ())

_bandwidth: list[float] = []  # the last few measured write bandwidths of this process


def observe_write(nbytes: int, seconds: float) -> None:
    """Record a measured write (stored bytes, seconds spent writing them) of this process."""
    if nbytes >= (1 << 20) and seconds > 0:
        _bandwidth.append(nbytes / seconds)
        del _bandwidth[:-5]


def write_bandwidth() -> float:
    return float(np.median(_bandwidth)) if _bandwidth else DEFAULT_WRITE_BANDWIDTH


def sample(arr) -> np.ndarray:
    """Up to SAMPLE_BYTES of ``arr`` from its start, middle and end, as one contiguous host array (small copy).

    A CuPy array is sampled on its device and only the sample crosses to the host.
    """
    xp = array_module(arr)
    if arr.nbytes <= SAMPLE_BYTES:
        return to_host(xp.ascontiguousarray(arr).reshape(-1))
    if arr.flags.c_contiguous:
        flat = arr.reshape(-1)
    else:  # a few leading rows only: never copy the whole array to sample it
        rows = max(1, (4 * SAMPLE_BYTES) // max(1, arr[0].nbytes))
        flat = xp.ascontiguousarray(arr[:rows]).reshape(-1)
    per = max(1, SAMPLE_BYTES // (3 * flat.itemsize))
    if flat.size <= 3 * per:
        return to_host(flat)
    mid = flat.size // 2
    return to_host(xp.concatenate([flat[:per], flat[mid:mid + per], flat[-per:]]))


def measure(arr, dtype) -> dict:
    """This rank's sample measurement for one variable (JSON-able)."""
    dtype = np.dtype(dtype)
    nbytes = int(arr.nbytes) if arr is not None else 0
    out = {"bytes": nbytes, "bw": write_bandwidth(), "sample": 0, "seconds": {}, "stored": {}}
    if arr is None or nbytes == 0:
        return out
    part = sample(arr)
    out["sample"] = int(part.nbytes)
    for name in candidates():
        out["seconds"][name], out["stored"][name] = timed_encode(resolve(name, dtype), [part], repeat=2)
    return out


def timed_encode(codec, parts, repeat: int = 1) -> tuple[float, int]:
    """(seconds, stored bytes) of encoding every array of ``parts`` with ``codec``, after a small warm-up.

    The seconds are the least of ``repeat`` runs (a run the scheduler interrupted is not the codec's speed).
    """
    codec.encode(parts[0].reshape(-1)[:64])  # warm up (first-call costs are not the throughput)
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        stored = sum(int(codec.encode(p).nbytes) for p in parts)
        best = min(best, time.perf_counter() - t)
    return best, stored


def estimate(sampled: list[dict], name: str, total: int, bw: float, threads: int) -> float:
    """Seconds to compress (``threads`` at once) and write ``total`` bytes with candidate ``name``.

    From the ranks' sample measurements, each rank weighted by its bytes; compression is
    assumed not to overlap writing (the estimate errs against compressing).
    """
    weight = sum(m["bytes"] for m in sampled)
    sec_per_byte = sum(m["seconds"][name] / m["sample"] * m["bytes"] for m in sampled) / weight
    inv_ratio = sum(m["stored"][name] / m["sample"] * m["bytes"] for m in sampled) / weight
    return total * sec_per_byte / max(1, threads) + total * inv_ratio / bw


def measured_by_all(sampled: list[dict], names) -> list[str]:
    """The candidates of ``names`` (in that order) that every sampled rank measured."""
    common = set.intersection(*(set(m["seconds"]) & set(m["stored"]) for m in sampled))
    return [n for n in names if n in common]


def decide(measurements: list[dict], threads: int) -> str:
    """The codec name for a variable from every rank's measurement."""
    total = sum(m["bytes"] for m in measurements)
    sampled = [m for m in measurements if m["sample"]]
    if total < MIN_BYTES or not sampled:
        return "none"
    bw = float(np.mean([m["bw"] for m in measurements]))
    best, best_time = "none", total / bw
    for name in measured_by_all(sampled, CANDIDATES + BLOSC2_CANDIDATES):
        est = estimate(sampled, name, total, bw, threads)
        if est < MARGIN * best_time:
            best, best_time = name, est
    return best
