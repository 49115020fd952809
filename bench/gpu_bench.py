"""GPU throughput: device codecs against the CPU path, and whole saves/loads of CuPy state (bench/gpu_check.sh).

    python bench/gpu_bench.py [--gib 4] [--dir /dev/shm/hpcckpt-gpu]

1. Codecs: ``--gib`` GiB in 8 MiB chunks (hpcckpt's default chunk; nvCOMP
   takes raw chunks up to 16 MiB) of a smooth float64 field with noise,
   encoded and decoded on the device (codecs/gpu.py: device filters; nvCOMP
   for zstd in the row that turns it on) against the CPU codec on one thread
   (a sixteenth of the chunks, scaled).  Ratio and GB/s of raw data; "none" on the device
   is the device-to-host copy into pinned memory.
2. Saves and loads of one rank's 1 GiB CuPy Block against the same state as
   a numpy Block (median of 3), to ``--dir`` (tmpfs by default, so that the
   storage is not what is measured).
3. Incremental saves on the device: block hashing (mix128 on the GPU against
   xxh3_128 of the host copy) and a save with 5% of the blocks changed
   against a full save.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time

import cupy
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import hpcckpt  # noqa: E402
from hpcckpt.core import blockhash  # noqa: E402
from hpcckpt.codecs import Lossy, nvcomp, resolve  # noqa: E402
from hpcckpt.codecs.gpu import device_decode, device_encode  # noqa: E402
from hpcckpt.core.checksum import raw_hash  # noqa: E402

CHUNK = 8 << 20


def smooth(n: int, xp):
    return xp.sin(xp.linspace(0, 1000, n)) + xp.asarray(np.random.default_rng(0).standard_normal(n)) * 1e-3


def sync():
    cupy.cuda.Device().synchronize()


def codecs(gib: float) -> None:
    per = CHUNK // 8
    n_chunks = max(1, int(gib * (1 << 30)) // CHUNK)
    x = smooth(per, cupy)
    host = cupy.asnumpy(x)
    total = n_chunks * CHUNK / 1e9
    print(f"\n## codecs: {n_chunks} chunks of {CHUNK >> 20} MiB = {n_chunks * CHUNK / 2**30:.1f} GiB; "
          f"nvCOMP by default: {nvcomp.status()['zstd']}")
    print(f"{'codec':26s} {'ratio':>7s} {'dev enc':>9s} {'dev dec':>9s} {'CPU enc':>9s} {'CPU dec':>9s}  GB/s")
    for spec in ["none", "zstd", "shuffle+lz4", "shuffle+zstd", "shuffle+zstd nvCOMP", Lossy(rel=1e-4),
                 Lossy(abs=1e-6)]:
        use_nvcomp = str(spec).endswith(" nvCOMP")
        os.environ.pop(nvcomp.ENABLE, None)
        if use_nvcomp:
            os.environ[nvcomp.ENABLE] = "1"
            print(f"  ({nvcomp.status()['zstd']})")
        codec = resolve(spec.split()[0] if use_nvcomp else spec, np.float64)
        stored = device_encode(codec, x)  # warm-up: kernels compiled, pools filled
        out = cupy.empty_like(x)
        device_decode(codec, stored, out)
        sync()
        t = time.perf_counter()
        for _ in range(n_chunks):
            stored = device_encode(codec, x)
        t_enc = time.perf_counter() - t
        t = time.perf_counter()
        for _ in range(n_chunks):
            device_decode(codec, stored, out)
        sync()
        t_dec = time.perf_counter() - t
        reps = max(1, n_chunks // 16)
        cpu_stored = codec.encode(host)
        t = time.perf_counter()
        for _ in range(reps):
            cpu_stored = codec.encode(host)
        c_enc = (time.perf_counter() - t) * n_chunks / reps
        buf = np.empty(CHUNK, np.uint8)
        t = time.perf_counter()
        for _ in range(reps):
            codec.decode(cpu_stored, buf)
        c_dec = (time.perf_counter() - t) * n_chunks / reps
        cpu = "        -         -" if spec == "none" else f"{total / c_enc:9.2f} {total / c_dec:9.2f}"
        print(f"{str(spec):26s} {CHUNK / stored.nbytes:7.2f} {total / t_enc:9.2f} {total / t_dec:9.2f} {cpu}")


def median_time(fn, repeats=3) -> float:
    times = []
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def saves(directory: str) -> None:
    rows, cols = 16384, 8192  # 1 GiB of float64
    dev = smooth(rows * cols, cupy).reshape(rows, cols)
    host = cupy.asnumpy(dev)
    gb = dev.nbytes / 1e9
    print(f"\n## save/load of a {dev.nbytes / 2**30:.0f} GiB Block to {directory} (median of 3, GB/s of raw data)")
    print(f"{'codec':26s} {'save cupy':>10s} {'save numpy':>11s} {'load cupy':>10s} {'load numpy':>11s} {'stored':>8s}")
    for spec in ["none", "shuffle+zstd", Lossy(rel=1e-4)]:
        path = os.path.join(directory, "c")
        row = []
        for arr in (dev, host):
            def save(arr=arr):
                hpcckpt.save({"u": hpcckpt.Block(arr, codec=spec)}, path, overwrite=True, fsync=False)
            row.append(gb / median_time(save))
        stored = sum(e.stat().st_size for e in os.scandir(os.path.join(path, "data")))
        for target in (cupy.empty_like(dev), np.empty_like(host)):
            row.append(gb / median_time(lambda target=target: hpcckpt.load({"u": hpcckpt.Block(target)}, path)))
        if spec == "none":
            assert cupy.asnumpy(target).tobytes() == host.tobytes()
        print(f"{str(spec):26s} {row[0]:10.2f} {row[1]:11.2f} {row[2]:10.2f} {row[3]:11.2f} "
              f"{dev.nbytes / stored:7.2f}x")
        shutil.rmtree(path)


def incremental(directory: str) -> None:
    rows, cols = 4096, 16384  # 512 MiB of float64: 128 KiB rows, 8 rows per 1 MiB block
    dev = cupy.asarray(np.random.default_rng(1).random((rows, cols)))
    host = cupy.asnumpy(dev)
    block = 1 << 20
    flat_dev, flat_host = dev.reshape(-1).view(np.uint8), host.reshape(-1).view(np.uint8)
    n = dev.nbytes // block
    t_dev = median_time(lambda: [blockhash.mix128(cupy, flat_dev[i * block:(i + 1) * block]) for i in range(n)])
    t_host = median_time(lambda: [raw_hash(flat_host[i * block:(i + 1) * block]) for i in range(n)])
    print(f"\n## incremental, {dev.nbytes >> 20} MiB in 1 MiB blocks: hashing mix128 on the GPU "
          f"{dev.nbytes / t_dev / 1e9:.1f} GB/s, xxh3_128 on one CPU core {dev.nbytes / t_host / 1e9:.1f} GB/s")
    root = os.path.join(directory, "inc")
    shutil.rmtree(root, ignore_errors=True)
    full, inc = [], []
    rng = np.random.default_rng(2)
    with hpcckpt.Checkpointer(root, incremental=True, fsync=False) as ckpt:
        ckpt.save({"u": hpcckpt.Block(dev)}, step=0)
        for step in range(1, 4):
            for b in rng.choice(rows // 8, size=max(1, rows // 8 // 20), replace=False):
                dev[b * 8, 0] += 1.0  # 5% of the blocks change
            sync()
            t = time.perf_counter()
            result = ckpt.save({"u": hpcckpt.Block(dev)}, step=step)
            inc.append(time.perf_counter() - t)
            path = os.path.join(directory, "full")
            t = time.perf_counter()
            hpcckpt.save({"u": hpcckpt.Block(dev)}, path, overwrite=True, fsync=False)
            full.append(time.perf_counter() - t)
    info = result.incremental
    print(f"5% changed: wrote {info['written_bytes'] / dev.nbytes:.1%} of the bytes; save time "
          f"{statistics.median(inc):.3f} s against a full save's {statistics.median(full):.3f} s "
          f"({statistics.median(inc) / statistics.median(full):.2f}x, median of 3)")
    shutil.rmtree(root)
    shutil.rmtree(os.path.join(directory, "full"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--dir", default="/dev/shm/hpcckpt-gpu")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    props = cupy.cuda.runtime.getDeviceProperties(0)
    print(f"device: {props['name'].decode()}, CuPy {cupy.__version__}, CPU cores {os.cpu_count()}")
    codecs(args.gib)
    os.environ.pop(nvcomp.ENABLE, None)  # the default from here on
    saves(args.dir)
    incremental(args.dir)
    shutil.rmtree(args.dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
