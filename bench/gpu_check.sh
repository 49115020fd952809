#!/usr/bin/env bash
# The whole GPU path of the codecs in one short run (< 5 minutes on one GPU):
#   1. tests/gpu (device bytes == CPU bytes, both directions, every codec with a device path);
#   2. device compress/decompress throughput of 4 GiB against the CPU path.
# Needs: pip install -e .[gpu]  (cupy-cuda12x).  Usage: bash bench/gpu_check.sh [GiB]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
"$PY" -m pytest -q tests/gpu tests/test_codecs_kernels.py
GIB=${1:-4} "$PY" - <<'PYEOF'
import os, time
import numpy as np
import cupy
from hpcckpt.codecs import Lossy, resolve
from hpcckpt.codecs.gpu import device_decode, device_encode

gib = float(os.environ["GIB"])
chunk = 64 << 20
n_chunks = int(gib * (1 << 30)) // chunk
per = chunk // 8
x = cupy.sin(cupy.linspace(0, 1000, per)) + cupy.random.default_rng(0).standard_normal(per) * 1e-3
host = cupy.asnumpy(x)
print(f"{n_chunks} chunks of {chunk >> 20} MiB = {n_chunks * chunk / 2**30:.1f} GiB (the same chunk repeated)")
for spec in ["shuffle+zstd", "shuffle+lz4", Lossy(rel=1e-4), Lossy(abs=1e-6)]:
    codec = resolve(spec, np.float64)
    stored = device_encode(codec, x)
    cupy.cuda.Device().synchronize()
    t = time.perf_counter()
    for _ in range(n_chunks):
        stored = device_encode(codec, x)
    tg = time.perf_counter() - t
    out = cupy.empty_like(x)
    t = time.perf_counter()
    for _ in range(n_chunks):
        device_decode(codec, stored, out)
    cupy.cuda.Device().synchronize()
    tgd = time.perf_counter() - t
    reps = max(1, n_chunks // 16)  # the CPU path is slower: time a sixteenth and scale
    t = time.perf_counter()
    for _ in range(reps):
        codec.encode(host)
    tc = (time.perf_counter() - t) * n_chunks / reps
    total = n_chunks * chunk / 1e9
    print(f"{str(spec):24s} ratio {chunk / stored.nbytes:7.2f}  device enc {total / tg:6.2f} GB/s  "
          f"dec {total / tgd:6.2f} GB/s  | CPU enc {total / tc:6.2f} GB/s (1 thread)")
PYEOF
