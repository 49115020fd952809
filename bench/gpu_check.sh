#!/usr/bin/env bash
# The whole GPU path in one short run (a few minutes on one GPU):
#   1. tests/gpu (device bytes == CPU bytes both ways for every codec; nvCOMP chunks read on the CPU and the
#      other way round; CuPy Blocks through save, load, a 2 -> 3 rank reshard, asynchronous and incremental
#      saves) plus the numpy runs of the kernels and the block hash;
#   2. bench/gpu_bench.py: device compress/decompress of 4 GiB against the CPU path, saves and loads of a
#      CuPy state against a numpy one, device block hashing and a 5%-changed incremental save.
# Needs: pip install -e .[gpu,mpich,test]  (cupy, nvidia-nvcomp; mpiexec for the reshard test).
# Usage: bash bench/gpu_check.sh [GiB]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
"$PY" -m pytest -q -p no:cacheprovider -rs tests/gpu tests/codecs/test_codecs_kernels.py tests/core/test_blockhash.py
"$PY" bench/gpu_bench.py --gib "${1:-4}"
