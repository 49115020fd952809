"""docs/format.md section 11 alone (no hpcckpt import): the RS level's shards, check blocks and a rebuild.

Written from the text of that section with numpy and xxhash only, so that the
tests comparing it with what the level writes (tests/levels/test_rs_layout.py,
tests/levels/test_rs_levels.py) check the specification, not the code against itself.
"""

from __future__ import annotations

import json
import os

import numpy as np
import xxhash


def _tables():
    """GF(2^8) with x^8 + x^4 + x^3 + x^2 + 1: the full multiplication table and the inverses."""
    exp, log, x = [0] * 510, [0] * 256, 1
    for i in range(255):
        exp[i], log[x] = x, i
        x <<= 1
        if x & 0x100:
            x ^= 0x11D
    exp[255:] = exp[:255]
    mul = np.zeros((256, 256), np.uint8)
    for a in range(1, 256):
        for b in range(1, 256):
            mul[a, b] = exp[log[a] + log[b]]
    inv = [0] + [exp[255 - log[a]] for a in range(1, 256)]
    return mul, inv


MUL, INV = _tables()


def matrix(k: int, m: int) -> np.ndarray:
    """The (k + m) x k encoding matrix: the identity over the rows inv((k + t) XOR q)."""
    rows = [[int(q == p) for q in range(k)] for p in range(k)]
    rows += [[INV[(k + t) ^ q] for q in range(k)] for t in range(m)]
    return np.array(rows, np.uint8)


def combine(coefficients, blocks) -> np.ndarray:
    """sum_i coefficients[i] * blocks[i] in GF(2^8), bytewise."""
    out = np.zeros(len(blocks[0]), np.uint8)
    for c, b in zip(coefficients, blocks):
        out ^= MUL[int(c)][np.frombuffer(bytes(b), np.uint8)]
    return out


def check_blocks(k: int, m: int, segments: list[bytes]) -> list[bytes]:
    """The m check blocks of a stripe with these k data segments."""
    a = matrix(k, m)
    return [combine(a[k + t], segments).tobytes() for t in range(m)]


def solve(k: int, m: int, positions: list[int], shards: list[bytes]) -> list[bytes]:
    """The k data segments of a stripe from k intact shards at ``positions`` (Gauss-Jordan in GF(2^8))."""
    a = matrix(k, m)[positions].astype(np.int64)
    rhs = [np.frombuffer(bytes(s), np.uint8).copy() for s in shards]
    for col in range(k):
        pivot = next(r for r in range(col, k) if a[r, col])
        a[[col, pivot]], rhs[col], rhs[pivot] = a[[pivot, col]], rhs[pivot], rhs[col]
        scale = INV[int(a[col, col])]
        a[col] = [MUL[scale, int(v)] for v in a[col]]
        rhs[col] = MUL[scale][rhs[col]]
        for r in range(k):
            if r != col and a[r, col]:
                f = int(a[r, col])
                a[r] = [int(v) ^ MUL[f, int(w)] for v, w in zip(a[r], a[col])]
                rhs[r] = rhs[r] ^ MUL[f][rhs[col]]
    return [b.tobytes() for b in rhs]


def shard_holder(g: int, stripe: int, position: int) -> int:
    return (stripe + position) % g


def read_version(vdir: str, node_of_rank) -> dict:
    """Every member's shards of every group of the version at ``vdir`` (``node_of_rank(r)``: the version
    directory on rank r's node), as section 11 lays them out: ``{(gi, j): (segments, check blocks)}``."""
    with open(os.path.join(vdir, "metadata.json"), "rb") as f:
        levels = json.loads(f.read())["extra"]["levels"]
    rs, sizes = levels["rs"], levels["sizes"]
    k, m = rs["k"], rs["m"]
    out = {}
    for gi, group in enumerate(rs["groups"]):
        seg = rs["segment"][gi]
        for j, rank in enumerate(group):
            with open(os.path.join(node_of_rank(rank), "data", f"part-{rank:06d}.bin"), "rb") as f:
                data = f.read().ljust(k * seg, b"\0")
            with open(os.path.join(node_of_rank(rank), "parity", f"rs-{rank:06d}.bin"), "rb") as f:
                parity = f.read()
            assert len(parity) == m * seg and len(data) == k * seg and sizes[rank] <= k * seg
            segments = [data[q * seg:(q + 1) * seg] for q in range(k)]
            checks = [parity[t * seg:(t + 1) * seg] for t in range(m)]
            assert [[xxhash.xxh3_64_hexdigest(s) for s in segments], [xxhash.xxh3_64_hexdigest(c) for c in checks]] \
                == rs["checksums"][gi][j]
            out[gi, j] = segments, checks
    return {"rs": rs, "sizes": sizes, "shards": out}
