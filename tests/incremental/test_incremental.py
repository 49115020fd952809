"""Incremental saves: the pure logic (grid, policy, duplicates, assembly) with hypothesis, and a state machine
that runs simulated multi-rank saves of a dynamic dataset through that logic against an in-memory store."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from hpcckpt.core.checksum import checksum
from hpcckpt.incremental.rules import (ChainIndex, assemble, block_grid, choose_kind, duplicates, grid_boxes, local_piece,
                                 hash_pieces)
from hpcckpt.format.metadata import ChunkTable, Metadata, Variable, parse, split_reference
from hpcckpt.core.planning import VariablePlan
from hpcckpt.core.regions import even_rows, tiling_problem, volume
from hpcckpt.core.encoding import dtype_to_json

shapes = st.lists(st.integers(0, 7), min_size=0, max_size=4).map(tuple)


@given(shape=shapes, itemsize=st.sampled_from([1, 2, 8, 24]), block=st.integers(1, 600), data=st.data())
@settings(max_examples=200, deadline=None)
def test_grid_pieces_tile_each_box_and_are_contiguous(shape, itemsize, block, data):
    lo = tuple(data.draw(st.integers(0, s)) for s in shape)
    hi = tuple(data.draw(st.integers(a, s)) for a, s in zip(lo, shape))
    pieces = list(grid_boxes(shape, itemsize, block, lo, hi))
    if not shape:
        assert pieces == [((), ())]
        return
    if volume(b - a for a, b in zip(lo, hi)) == 0:
        assert pieces == []
        return
    starts = np.asarray([p[0] for p in pieces], np.int64) - np.asarray(lo)
    stops = starts + np.asarray([p[1] for p in pieces], np.int64)
    assert tiling_problem(starts, stops, [b - a for a, b in zip(lo, hi)]) is None
    axis, rows = block_grid(shape, itemsize, block)
    local = np.arange(volume(b - a for a, b in zip(lo, hi))).reshape([b - a for a, b in zip(lo, hi)])
    for start, count in pieces:
        nbytes = volume(count) * itemsize
        assert nbytes <= block or volume(count[axis + 1:]) * itemsize > block or count[axis] == 1
        # the piece lies inside one grid cell of the global grid: aligned, never straddling a block boundary
        assert start[axis] // rows == (start[axis] + count[axis] - 1) // rows
        assert all(c == 1 for c in count[:axis])
        piece = local_piece(local, lo, start, count)
        assert piece.flags.c_contiguous and piece.shape == tuple(count)
        sel = tuple(slice(s - l, s - l + n) for s, l, n in zip(start, lo, count))
        assert piece.base is not None or piece.size <= 1  # a view of the caller's memory (no copy)
        assert np.array_equal(piece, local[sel])


@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=4), itemsize=st.sampled_from([1, 4, 8]),
       block=st.integers(1, 300), grow=st.integers(0, 50))
def test_grid_does_not_depend_on_the_row_count(shape, itemsize, block, grow):
    bigger = [shape[0] + grow] + shape[1:]
    assert block_grid(shape, itemsize, block) == block_grid(bigger, itemsize, block) or block_grid(
        shape, itemsize, block)[0] == 0 and block_grid(bigger, itemsize, block)[0] == 0


@given(depth=st.one_of(st.none(), st.integers(0, 20)), changed=st.integers(0, 100), total=st.integers(0, 100),
       k=st.integers(0, 12), t=st.floats(0, 1))
def test_policy(depth, changed, total, k, t):
    changed = min(changed, total)
    kind, reason = choose_kind(depth, changed, total, k, t)
    assert kind in ("full", "incremental") and reason
    if depth is None or depth + 1 > k or (total and changed / total > t):
        assert kind == "full"
    else:
        assert kind == "incremental"


@given(st.lists(st.lists(st.integers(0, 5), max_size=6), min_size=1, max_size=5))
def test_duplicates_keep_exactly_one_first_occurrence(keys_per_rank):
    flags = [duplicates(keys_per_rank, r) for r in range(len(keys_per_rank))]
    owners = {}
    for r, (keys, fl) in enumerate(zip(keys_per_rank, flags)):
        for i, (key, dup) in enumerate(zip(keys, fl)):
            if not dup:
                assert key not in owners
                owners[key] = (r, i)
    assert set(owners) == {k for keys in keys_per_rank for k in keys}
    for key, (r, i) in owners.items():  # the owner is the first occurrence in (rank, order)
        assert all(key not in keys_per_rank[q] for q in range(r)) and key not in keys_per_rank[r][:i]


# --------------------------------------------------------------------------- a simulated chain

BLOCK = 64
RECORD = np.dtype([("a", "<i4"), ("b", "<f8")])


def simulate_save(name, data, kinds, nranks, splits, index, store, max_chain=4, threshold=0.6, dedup=True):
    """One collective save of ``data`` by ``nranks`` simulated ranks through the real incremental logic."""
    variables = {n: VariablePlan(kinds[n], dtype_to_json(a.dtype), a.shape) for n, a in data.items()}
    dtypes = {n: a.dtype for n, a in data.items()}
    codecs = {n: {"id": "none"} for n in data}
    per_rank = []
    for r in range(nranks):
        arrays, boxes = {}, {}
        for n, a in data.items():
            lo, hi = splits[n][r]
            arrays[n] = a[lo:hi]
            boxes[n] = ((lo,) + (0,) * (a.ndim - 1), (hi,) + a.shape[1:])
        parts = [(n, boxes[n][0], arrays[n]) for n in sorted(arrays)]
        per_rank.append(hash_pieces(parts, variables, dtypes, codecs, BLOCK, index))
    total = sum(e[5] for entries in per_rank for e in entries)
    changed = sum(e[5] for entries in per_rank for e in entries if e[6] is None)
    kind, _ = choose_kind(index.depth if index is not None and len(index) else None, changed, total, max_chain,
                          threshold)
    if kind == "full":
        per_rank = [[e[:6] + (None,) for e in entries] for entries in per_rank]
    new_keys = [[e[4] for e in entries if e[6] is None] for entries in per_rank]
    parts = []
    for r, entries in enumerate(per_rank):
        new = [e for e in entries if e[6] is None]
        dup = duplicates(new_keys, r) if dedup else [False] * len(new)
        file = f"data/part-{r:06d}.bin"
        buf = bytearray()
        written = []
        for e, d in zip(new, dup):
            if not d:
                payload = e[3].tobytes()
                written.append((e[0], file, len(buf), len(payload), checksum(payload), e[1], e[2]))
                buf += payload
        store[(name, file)] = bytes(buf)
        parts.append({"written": written, "hashes": {(e[0], tuple(e[1])): e[4][0] for e, d in zip(new, dup) if not d},
                      "refs": [(e[0], *e[6], e[1], e[2], e[4][0]) for e in entries if e[6] is not None],
                      "dups": [(e[0], e[4], e[1], e[2], e[4][0]) for e, d in zip(new, dup) if d]})
    files, tables = assemble(variables, dtypes, codecs, parts)
    meta_vars = {}
    for n, plan in variables.items():
        table = ChunkTable.from_rows(tables[n][0], len(plan.shape))
        table.hash = tables[n][1]
        meta_vars[n] = Variable(n, plan.kind, dtypes[n], plan.shape, table)
    depth = index.depth + 1 if kind == "incremental" else 0
    meta = Metadata(step=None, files=files, variables=meta_vars, values={}, nranks=nranks, created="",
                    extra={"incremental": {"kind": kind, "depth": depth}})
    meta = parse(meta.to_json_bytes())  # what goes to disk parses back
    return meta, kind, per_rank


def reconstruct(name, meta, store) -> dict:
    out = {}
    for n, var in meta.variables.items():
        arr = np.zeros(var.shape, var.dtype)
        seen = np.zeros(var.shape, np.int32)
        c = var.chunks
        for k in range(len(c)):
            f = meta.files[int(c.file[k])]
            ref = split_reference(f)
            raw = store[(ref[0], ref[1]) if ref else (name, f)][int(c.offset[k]):int(c.offset[k]) + int(c.nbytes[k])]
            assert checksum(raw) == c.checksum[k]
            sel = tuple(slice(a, a + b) for a, b in zip(c.start[k], c.count[k]))
            arr[sel] = np.frombuffer(raw, var.dtype).reshape(c.count[k])
            seen[sel] += 1
        assert (seen == 1).all(), n
        out[n] = arr
    return out


class Chain(RuleBasedStateMachine):
    """Grow, shrink, modify, reshape, appear, disappear, change the rank count; save; check every version."""

    @initialize()
    def setup(self):
        self.rng = np.random.default_rng(0)
        self.data = {"f": np.arange(12 * 5, dtype=np.float64).reshape(12, 5),
                     "t": np.zeros(30, RECORD)}
        self.data["t"]["a"] = np.arange(30)
        self.kinds = {"f": "block", "t": "ragged"}
        self.nranks = 2
        self.store = {}
        self.versions = []  # (name, meta, data copy)
        self.index = None

    @rule(k=st.integers(1, 20))
    def grow(self, k):
        t = self.data["t"]
        new = np.zeros(k, RECORD)
        new["a"] = np.arange(len(t), len(t) + k)
        self.data["t"] = np.concatenate([t, new])

    @rule(k=st.integers(1, 10))
    def shrink(self, k):
        self.data["t"] = self.data["t"][:max(0, len(self.data["t"]) - k)].copy()

    @rule(row=st.integers(0, 100), value=st.floats(-5, 5))
    def modify(self, row, value):
        f = self.data["f"]
        if len(f):
            f[row % len(f)] += value + 1

    @rule(rows=st.integers(0, 16), cols=st.integers(1, 7))
    def reshape(self, rows, cols):
        old = self.data["f"]
        new = np.zeros((rows, cols))
        r, c = min(rows, old.shape[0]), min(cols, old.shape[1])
        new[:r, :c] = old[:r, :c]
        self.data["f"] = new

    @rule(name=st.sampled_from(["g", "h"]), rows=st.integers(0, 9))
    def appear(self, name, rows):
        if name not in self.data:
            self.data[name] = np.full((rows, 3), 7, np.int16)  # identical blocks: dedup
            self.kinds[name] = "block"

    @rule(name=st.sampled_from(["g", "h"]))
    def disappear(self, name):
        self.data.pop(name, None)

    @rule(n=st.integers(1, 4))
    def ranks(self, n):
        self.nranks = n

    @rule(move=st.booleans())
    def save(self, move):
        splits = {}
        for n, a in self.data.items():
            total = a.shape[0]
            if self.kinds[n] == "ragged" and move:
                cuts = sorted(self.rng.integers(0, total + 1, size=self.nranks - 1).tolist())
                b = [0, *cuts, total]
                splits[n] = [(b[r], b[r + 1]) for r in range(self.nranks)]
            else:
                splits[n] = [even_rows(total, self.nranks, r) for r in range(self.nranks)]
        name = f"step-{len(self.versions):012d}"
        prev = self.versions[-1] if self.versions else None
        meta, kind, per_rank = simulate_save(name, self.data, self.kinds, self.nranks, splits, self.index, self.store)
        got = reconstruct(name, meta, self.store)
        assert set(got) == set(self.data)
        for n in self.data:
            assert got[n].dtype == self.data[n].dtype and np.array_equal(got[n], self.data[n]), n
        info = meta.extra["incremental"]
        assert info["depth"] <= 4
        if kind == "incremental":
            # blocks stored at the same global place with the same bytes in the base are never written again
            pmeta, pdata = prev[1], prev[2]
            for entries in per_rank:
                for n, start, count, piece, key, nbytes, loc in entries:
                    if key in self.index.locations:
                        assert loc is not None
                    if n in pmeta.variables and pmeta.variables[n].shape == self.data[n].shape:
                        c = pmeta.variables[n].chunks
                        same = np.all((c.start == start) & (c.count == count), axis=1) if len(c) else []
                        if np.any(same):
                            sel = tuple(slice(a, a + b) for a, b in zip(start, count))
                            if np.array_equal(pdata[n][sel], self.data[n][sel]):
                                assert loc is not None, (n, start, count)
        else:
            assert not any(split_reference(f) for f in meta.files)
        self.index = ChainIndex.from_metadata(meta, name)
        self.versions.append((name, meta, {n: a.copy() for n, a in self.data.items()}))

    @invariant()
    def every_version_restores(self):
        for name, meta, data in self.versions[-3:]:
            got = reconstruct(name, meta, self.store)
            assert all(np.array_equal(got[n], data[n]) for n in data)


Chain.TestCase.settings = settings(max_examples=30, stateful_step_count=20, deadline=None)
TestChain = Chain.TestCase
