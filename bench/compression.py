#!/usr/bin/env python3
"""Compression benchmark: ratio and throughput per codec, and end-to-end saves against slow storage.

    python bench/compression.py [--mib 32] [--bandwidth 300] [--markdown]
    python bench/compression.py --part lossy [--mib 32] [--repeat 3]

Fields (float64): ``smooth`` (a smooth 2-D field plus noise at 1e-3 of its
amplitude), ``constant`` (large constant regions plus a smooth part),
``random`` (normal noise), ``heat2d`` (a real state: apps/heat2d.py's
temperature after ``--heat-steps`` steps from its initial field, on one
square grid; ``--fields`` picks fields by name).  For each codec: compression ratio, compress and
decompress MB/s (of raw bytes) with 1 thread and with the rank's codec
threads (``--threads``, default min(4, cores) as a save; chunks of 4 MiB in a
thread pool, as a save does; blosc2's own threads share that count), the
median of ``--repeat`` runs.  ``--codecs`` picks rows by name (comma-separated).  Then the end-to-end time of hpcckpt.save to a
writer throttled to ``--bandwidth`` MB/s (ThrottledStorage: every data write sleeps for its bytes /
bandwidth, like a slow shared file system), with and without compression,
for the lossless codecs (numcodecs and blosc2) and the lossy ones at every
bound (own quantizer, SZ3, ZFP, AutoLossy: its row names what it picked).
``--part lossy``: the lossy codecs side by side (own quantizer, SZ3, ZFP) at
abs 1e-3, rel 1e-4 and rel 1e-6 on the same fields, in 2-D chunks of 4 MiB
(row blocks, as a save chunks a 2-D Block): ratio, compress and decompress
MB/s with one thread (medians of ``--repeat`` runs) and the maximum error seen;
then the codec AutoLossy picks at each bound for a writer of ``--bandwidth``
and ``--threads`` codec threads (``--part picks``: that table alone).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import types
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import hpcckpt  # noqa: E402
from hpcckpt.codecs import SZ3, ZFP, AutoLossy, Blosc2, Lossy, auto_lossy, blosc2_codec, resolve  # noqa: E402
from hpcckpt.codecs.pipeline import default_threads  # noqa: E402
from hpcckpt.storage import PosixStorage  # noqa: E402

CHUNK = 4 << 20


def heat2d_state(side: int, steps: int) -> np.ndarray:
    """apps/heat2d.py's temperature on a ``side`` x ``side`` grid after ``steps`` steps (one process, no MPI)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "apps"))
    import heat2d

    grid = types.SimpleNamespace(ny=side, nx=side, y0=0, y1=side, x0=0, x1=side, shape=(side, side))
    u = heat2d.with_halo(grid, heat2d.initial_field(grid))
    out = u.copy()
    for _ in range(steps):
        heat2d.stencil(u, out)
        u, out = out, u
    return np.ascontiguousarray(u[1:-1, 1:-1])


def make_fields(mib: int, heat_steps: int = 200) -> dict:
    n = (mib << 20) // 8
    side = int(np.sqrt(n))
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:side, 0:n // side] / side
    smooth = np.sin(6 * x) * np.cos(4 * y) + 0.3 * np.sin(20 * x * y)
    noisy = smooth + rng.normal(scale=1e-3, size=smooth.shape)
    const = np.where(smooth > 0.2, 1.0, np.where(smooth < -0.5, -2.0, 0.0))
    const = np.where((smooth > -0.1) & (smooth < 0.0), smooth, const)
    return {"smooth": noisy, "constant": const, "random": rng.normal(size=smooth.shape),
            "heat2d": heat2d_state(int(np.sqrt(n)), heat_steps)}


CODECS = {"lz4": "lz4", "zstd": "zstd", "shuffle+zstd": "shuffle+zstd", "shuffle+lz4": "shuffle+lz4",
          "lossy rel 1e-4": Lossy(rel=1e-4), "lossy rel 1e-6": Lossy(rel=1e-6)}
if blosc2_codec.available():  # C-Blosc2 next to numcodecs' Blosc (lz4, zstd above) on the same fields
    CODECS.update({"blosc2-lz4": "blosc2-lz4", "blosc2-zstd": "blosc2-zstd",
                   "blosc2 zstd1 shuffle+bytedelta": Blosc2(codec="zstd", clevel=1, filters=["shuffle", "bytedelta"]),
                   "blosc2 lz4 shuffle+bytedelta": Blosc2(codec="lz4", filters=["shuffle", "bytedelta"]),
                   "blosc2 zstd5 bitshuffle": Blosc2(codec="zstd", filters=["bitshuffle"])})


def chunks(flat: np.ndarray):
    per = CHUNK // flat.itemsize
    return [flat[i:i + per] for i in range(0, flat.size, per)]


def throughput(field: np.ndarray, spec, threads: int, repeat: int = 1) -> tuple[float, float, float]:
    """Ratio, compress and decompress MB/s: the median of ``repeat`` runs."""
    runs = [throughput_once(field, spec, threads) for _ in range(repeat)]
    return runs[0][0], float(np.median([r[1] for r in runs])), float(np.median([r[2] for r in runs]))


def throughput_once(field: np.ndarray, spec, threads: int) -> tuple[float, float, float]:
    codec = resolve(spec, field.dtype)
    parts = chunks(field.reshape(-1))
    blosc2_codec.set_threads(threads)  # as EncodedPieces does: blosc2's threads share the pool's count
    with ThreadPoolExecutor(threads) as pool:
        t = time.perf_counter()
        stored = list(pool.map(codec.encode, parts))
        tc = time.perf_counter() - t
        outs = [np.empty(p.nbytes, np.uint8) for p in parts]
        t = time.perf_counter()
        list(pool.map(lambda a: codec.decode(*a), zip(stored, outs)))
        td = time.perf_counter() - t
    ratio = field.nbytes / sum(s.nbytes for s in stored)
    return ratio, field.nbytes / tc / 1e6, field.nbytes / td / 1e6


class ThrottledStorage(PosixStorage):
    """POSIX storage whose every data write sleeps for its bytes / ``bandwidth`` (a slow shared file system)."""

    def __init__(self, bandwidth: float):
        self.bandwidth = bandwidth

    def append(self, handle: int, buffer, hasher=None) -> int:
        n = super().append(handle, buffer, hasher)
        time.sleep(n / self.bandwidth)
        return n


def save_seconds(field: np.ndarray, spec, root: str, storage, repeat: int = 2, chunk_bytes: int = CHUNK) -> tuple:
    """(best seconds of ``repeat`` saves, the codec config the last one stored, its stored bytes)."""
    best = float("inf")
    for i in range(repeat):
        path = tempfile.mkdtemp(dir=root)
        os.rmdir(path)
        t = time.perf_counter()
        hpcckpt.save({"f": hpcckpt.Block(field)}, path, codec=spec, fsync=False, strategy="file-per-rank",
                     codec_threads=2, chunk_bytes=chunk_bytes, storage=storage)
        best = min(best, time.perf_counter() - t)
    var = hpcckpt.open(path).variables["f"]
    return best, var.codec, var.stored_bytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=32, help="size of each field in MiB")
    ap.add_argument("--bandwidth", type=float, default=300.0, help="throttled write bandwidth, MB/s")
    ap.add_argument("--save-chunk-mib", type=int, default=CHUNK >> 20,
                    help="chunk_bytes of the end-to-end saves, MiB (small chunks let compression overlap writing)")
    ap.add_argument("--threads", type=int, default=default_threads(), help="the rank's codec threads")
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs per throughput cell and per lossy row (medians), per save (the fastest)")
    ap.add_argument("--codecs", default="", help="comma-separated row names of the throughput table (default all)")
    ap.add_argument("--part", choices=("all", "throughput", "save", "lossy", "picks"), default="all",
                    help="run only the codec throughput table, the end-to-end saves, the lossy table or "
                         "only what AutoLossy picks at --bandwidth")
    ap.add_argument("--fields", default="", help="comma-separated fields (default all: smooth,constant,random,heat2d)")
    ap.add_argument("--heat-steps", type=int, default=200, help="steps of apps/heat2d.py for the heat2d field")
    args = ap.parse_args()
    fields = make_fields(args.mib, args.heat_steps)
    if args.fields:
        fields = {name: fields[name] for name in args.fields.split(",")}
    if args.part in ("lossy", "picks"):
        (lossy_table if args.part == "lossy" else picks_table)(args, fields)
        return
    if args.part != "save":
        throughput_table(args, fields)
    if args.part != "throughput":
        save_table(args, fields)


def throughput_table(args, fields) -> None:
    t = args.threads
    print(f"# {args.mib} MiB float64 fields, chunks of {CHUNK >> 20} MiB, {os.cpu_count()} cores, {cpu_name()}, "
          f"median of {args.repeat}\n")
    print(f"| field | codec | ratio | compress MB/s 1 thr | {t} thr | decompress MB/s 1 thr | {t} thr |")
    print("|---|---|---:|---:|---:|---:|---:|")
    names = [n for n in args.codecs.split(",") if n] or list(CODECS)
    for fname, field in fields.items():
        for cname in names:
            spec = CODECS[cname]
            r1, c1, d1 = throughput(field, spec, 1, args.repeat)
            _, c2, d2 = throughput(field, spec, t, args.repeat)
            print(f"| {fname} | {cname} | {r1:.2f} | {c1:.0f} | {c2:.0f} | {d1:.0f} | {d2:.0f} |", flush=True)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown CPU"


def lossy_specs(field: np.ndarray) -> list:
    """(bound label, codec label, spec, bound on |x - x'|) at abs 1e-3, rel 1e-4, rel 1e-6.

    SZ3 and the own quantizer take rel as given (range of each chunk); ZFP has no relative mode, so it gets
    the absolute tolerance rel * (range of the whole field), a bound at least as loose as the chunk's.
    """
    span = float(field.max() - field.min())
    rows = []
    for label, mode, b in (("abs 1e-3", "abs", 1e-3), ("rel 1e-4", "rel", 1e-4), ("rel 1e-6", "rel", 1e-6)):
        bound = b if mode == "abs" else b * span
        rows += [(label, "quantize", Lossy(**{mode: b}), bound), (label, "SZ3", SZ3(**{mode: b}), bound),
                 (label, "ZFP accuracy", ZFP(accuracy=bound), bound)]
    return rows


def row_chunks(field: np.ndarray) -> list:
    rows = max(1, CHUNK // (field.shape[1] * field.itemsize))
    return [np.ascontiguousarray(field[i:i + rows]) for i in range(0, field.shape[0], rows)]


def lossy_table(args, fields) -> None:
    print(f"# {args.mib} MiB float64 fields, 2-D chunks of {CHUNK >> 20} MiB, 1 thread, "
          f"medians of {args.repeat} runs\n")
    print("| field | bound | codec | ratio | compress MB/s | decompress MB/s | max error / bound |")
    print("|---|---|---|---:|---:|---:|---:|")
    for fname, field in fields.items():
        parts = row_chunks(field)
        for label, cname, spec, bound in lossy_specs(field):
            codec = resolve(spec, field.dtype)
            tc, td = [], []
            for _ in range(args.repeat):
                t = time.perf_counter()
                stored = [codec.encode(p) for p in parts]
                tc.append(time.perf_counter() - t)
                outs = [np.empty(p.nbytes, np.uint8) for p in parts]
                t = time.perf_counter()
                for s, o in zip(stored, outs):
                    codec.decode(s, o)
                td.append(time.perf_counter() - t)
            err = max(float(np.abs(o.view(field.dtype).reshape(p.shape) - p).max()) for p, o in zip(parts, outs))
            ratio = field.nbytes / sum(s.nbytes for s in stored)
            print(f"| {fname} | {label} | {cname} | {ratio:.2f} | {field.nbytes / np.median(tc) / 1e6:.0f} | "
                  f"{field.nbytes / np.median(td) / 1e6:.0f} | {err / bound:.2f} |", flush=True)
    picks_table(args, fields)


def picks_table(args, fields) -> None:
    """What AutoLossy picks per field and bound for a writer of ``--bandwidth`` (its sample, as a save does)."""
    print(f"\n# what AutoLossy picks for a writer of {args.bandwidth:g} MB/s and {args.threads} codec threads\n")
    print("| field | abs 1e-3 | rel 1e-4 | rel 1e-6 |")
    print("|---|---|---|---|")
    for fname, field in fields.items():
        picks = []
        for mode, b in (("abs", 1e-3), ("rel", 1e-4), ("rel", 1e-6)):
            spec = AutoLossy(**{mode: b}).config()
            m = auto_lossy.measure(field, field.dtype, spec)
            m["bw"] = args.bandwidth * 1e6
            picks.append(codec_label(auto_lossy.decide(spec, field.dtype, [m], args.threads)))
        print(f"| {fname} | {' | '.join(picks)} |", flush=True)


def codec_label(config: dict) -> str:
    return {"hpcckpt.quantize": "quantize", "hpcckpt.sz3": "SZ3", "hpcckpt.zfp": "ZFP accuracy"}.get(
        config["id"], config["id"])


def save_table(args, fields) -> None:
    print(f"\n# end-to-end hpcckpt.save, writer throttled to {args.bandwidth:.0f} MB/s, 2 codec threads, "
          f"chunks of {args.save_chunk_mib} MiB, fastest of {args.repeat}\n")
    print("| field | codec | ratio | save s | speed-up vs none |")
    print("|---|---|---:|---:|---:|")
    slow = ThrottledStorage(args.bandwidth * 1e6)
    with tempfile.TemporaryDirectory() as root:
        save_seconds(fields[next(iter(fields))][:512], "none", root, slow, 1)  # warm up; gives auto a bandwidth measurement
        for fname, field in fields.items():
            cb = args.save_chunk_mib << 20
            base = save_seconds(field, "none", root, slow, args.repeat, chunk_bytes=cb)[0]
            print(f"| {fname} | none | 1.00 | {base:.3f} | 1.00 |", flush=True)
            for cname, spec in save_specs(field):
                t, config, stored = save_seconds(field, spec, root, slow, args.repeat, chunk_bytes=cb)
                if cname == "auto" or cname.startswith("AutoLossy"):
                    picked = config.get("cname", config["id"]) if cname == "auto" else codec_label(config)
                    cname = f"{cname} (picked {picked})"
                print(f"| {fname} | {cname} | {field.nbytes / stored:.2f} | {t:.3f} | {base / t:.2f} |", flush=True)


def save_specs(field: np.ndarray) -> list:
    """(row name, spec) of the end-to-end saves: lossless codecs, then every lossy codec at every bound."""
    rows = [("auto", "auto"), ("lz4", "lz4"), ("zstd", "zstd"), ("shuffle+zstd", "shuffle+zstd")]
    if blosc2_codec.available():
        rows += [(n, CODECS[n]) for n in ("blosc2-lz4", "blosc2-zstd", "blosc2 zstd1 shuffle+bytedelta")]
    for label, cname, spec, bound in lossy_specs(field):
        rows.append((f"{cname} {label}", spec))
        if cname == "ZFP accuracy":  # after the three codecs of a bound: AutoLossy at that bound
            mode, b = label.split()
            rows.append((f"AutoLossy {label}", AutoLossy(**{mode: float(b)})))
    return rows


if __name__ == "__main__":
    main()
