"""The Reed-Solomon level's shard layout, rebuild plans and coder (levels/rs_layout.py, rs_coder.py), without MPI.

The layout is encoded and decoded here with levels/rs_coder.py in memory, exactly as levels/rs.py does it
across ranks, so a plan that names the wrong shard or position fails on the bytes.
"""

from __future__ import annotations

import itertools
import os
import sys

import numpy as np
import pytest
import rs_spec
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcckpt import Checkpointer
from hpcckpt.errors import CheckpointError
from hpcckpt.levels import LevelOptions, parity_groups, rs_coder
from hpcckpt.levels.rs_layout import check_shape, data_stripe, holder, leader, parity_stripe, rebuild_plan, \
    segment_bytes, shard_at
from hpcckpt.transport.topology import simulated_layout


def _stripe(segments: list[bytes]) -> np.ndarray:
    """The k segments as one stripe, what levels/rs.py hands the coder."""
    return np.frombuffer(b"".join(segments), np.uint8)


@st.composite
def shapes(draw):
    k = draw(st.integers(1, 5))
    m = draw(st.integers(1, 3))
    g = draw(st.integers(k + m, k + m + 3))
    return g, k, m


@given(shapes())
def test_every_member_holds_one_shard_per_stripe_and_its_whole_file(shape):
    g, k, m = shape
    for s in range(g):
        members = [holder(g, s, q) for q in range(k + m)]
        assert len(set(members)) == k + m  # distinct members: losing m members erases at most m shards
        assert leader(g, k, s) == members[k]
    for j in range(g):
        assert sorted(shard_at(g, k, data_stripe(g, j, q), q) for q in range(k)) == [(j, "data", q) for q in range(k)]
        assert [shard_at(g, k, parity_stripe(g, k, j, t), k + t) for t in range(m)] == \
            [(j, "parity", t) for t in range(m)]


def _encode(g, k, m, files):
    """Every member's data segments and check blocks, the layout of levels/rs.py, in memory."""
    seg = segment_bytes([len(f) for f in files], k)
    data = [[np.frombuffer(f.ljust(k * seg, b"\0")[q * seg:(q + 1) * seg], np.uint8) for q in range(k)]
            for f in files]
    parity = [[None] * m for _ in range(g)]
    for s in range(g):
        if seg == 0:  # empty files: no rounds, nothing encoded (as in levels/rs.py)
            continue
        blocks = rs_coder.encode(k, m, np.concatenate([data[holder(g, s, q)][q] for q in range(k)]))
        for t in range(m):
            parity[holder(g, s, k + t)][t] = np.frombuffer(blocks[t], np.uint8)
    return seg, data, parity


@settings(max_examples=60, deadline=None)
@given(shapes(), st.data())
def test_any_m_lost_members_and_damaged_shards_within_the_bound_rebuild_exactly(shape, data):
    g, k, m = shape
    files = [data.draw(st.binary(min_size=0, max_size=60)) for _ in range(g)]
    seg, segments, parity = _encode(g, k, m, files)
    lost = data.draw(st.sets(st.integers(0, g - 1), max_size=m))
    erased = {(j, kind, i) for j in lost for kind, n in (("data", k), ("parity", m)) for i in range(n)}
    erased |= data.draw(st.sets(st.tuples(st.integers(0, g - 1), st.sampled_from(["data", "parity"]),
                                          st.integers(0, min(k, m) - 1)), max_size=2))
    tasks, why = rebuild_plan(g, k, m, erased)
    per_stripe = max(sum(shard_at(g, k, s, q) in erased for q in range(k + m)) for s in range(g))
    if per_stripe > m:
        assert tasks is None and f"rebuilds at most {m} per stripe" in why
        return
    assert why is None
    assert sorted((x, (x - s) % g) for s, x, _ in tasks) == sorted((j, i) for j, kind, i in erased if kind == "data")
    for s, x, sources in tasks:
        assert len(sources) == k and not any(shard_at(g, k, s, q) in erased for q in sources)
        if seg == 0:
            continue
        shards = [segments[holder(g, s, q)][q] if q < k else parity[holder(g, s, q)][q - k] for q in sources]
        got = rs_coder.decode(k, m, shards, sources, (x - s) % g)
        assert bytes(got) == segments[x][(x - s) % g].tobytes()


def test_a_stripe_beyond_m_erasures_is_named_by_rank():
    _, why = rebuild_plan(4, 2, 1, {(1, "data", 0), (1, "data", 1), (2, "data", 0), (2, "data", 1),
                                    (1, "parity", 0), (2, "parity", 0)}, ranks=[10, 11, 12, 13])
    assert "a (k=2, m=1) Reed-Solomon code rebuilds at most 1 per stripe" in why and "rank 11's data" in why


def test_shapes_and_options_are_checked():
    with pytest.raises(ValueError):
        check_shape(3, 2, 2)
    check_shape(4, 2, 2)
    for bad in [(0, 1), (2, 0), (2,), "ab", (200, 57), (True, 1), (2.0, 1)]:
        with pytest.raises(CheckpointError, match="rs_group must be"):
            LevelOptions.from_kwargs(local_dir="/tmp/x", rs_every=1, rs_group=bad)
    with pytest.raises(CheckpointError, match="need local_dir"):
        LevelOptions.from_kwargs(rs_every=1)
    assert LevelOptions.from_kwargs(local_dir="/tmp/x", rs_every=2, rs_group=[3, 1]).levels["rs"].rs_group == (3, 1)
    lv = LevelOptions.from_kwargs(local_dir="/tmp/x", rs_every=2).intervals()
    assert [lv.due(i)["rs"] for i in range(3)] == [True, False, True]


def test_groups_hold_at_least_k_plus_m_ranks_on_distinct_nodes():
    assert parity_groups(simulated_layout(7, 1), 3, least=3) == [[0, 1, 2], [3, 4, 5, 6]]
    assert parity_groups(simulated_layout(8, 2), 3, least=3) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert parity_groups(simulated_layout(4, 2), 3, least=3) == []  # two nodes: no (2, 1) group


@pytest.mark.parametrize("k, m", [(1, 1), (2, 2), (6, 2), (4, 4), (5, 6), (3, 8)])
def test_the_coder_rebuilds_every_data_segment_from_any_k_shards(k, m):
    """Every pattern of m erasures, check blocks and data alike: (5, 6) and (3, 8) have m >= 5, where ISA-L's
    Vandermonde-based matrix (isa_l_rs_vand) cannot decode some patterns and its Cauchy matrix can."""
    r = 37
    segments = [os.urandom(r) for _ in range(k)]
    shards = segments + [bytes(b) for b in rs_coder.encode(k, m, _stripe(segments))]
    assert all(len(b) == r for b in shards)
    for gone in itertools.combinations(range(k + m), m):
        sources = [q for q in range(k + m) if q not in gone][:k]
        for q in (q for q in gone if q < k):
            assert bytes(rs_coder.decode(k, m, [shards[p] for p in sources], sources, q)) == segments[q], (gone, q)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 200), st.integers(1, 56), st.integers(1, 300), st.integers(0, 2**32 - 1), st.data())
def test_the_coder_holds_for_any_shape_up_to_256_shards(k, m, r, seed, data):
    rng = np.random.default_rng(seed)  # up to 200 x 300 random bytes: drawn by hypothesis they fail its health check
    segments = [rng.integers(0, 256, r, dtype=np.uint8).tobytes() for _ in range(k)]
    checks = rs_coder.encode(k, m, _stripe(segments))
    assert [len(b) for b in checks] == [r] * m
    wanted = data.draw(st.integers(0, k - 1))
    gone = {wanted} | data.draw(st.sets(st.integers(0, k + m - 1), max_size=m - 1))
    sources = [q for q in range(k + m) if q not in gone][:k]
    shards = [segments[q] if q < k else checks[q - k] for q in sources]
    assert bytes(rs_coder.decode(k, m, shards, sources, wanted)) == segments[wanted]


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 12), st.integers(1, 8), st.integers(1, 64), st.data())
def test_the_coder_is_the_code_of_format_md_section_11(k, m, r, data):
    """Check blocks and decoding equal those of tests/support/rs_spec.py, written from the specification alone."""
    segments = [data.draw(st.binary(min_size=r, max_size=r)) for _ in range(k)]
    checks = [bytes(b) for b in rs_coder.encode(k, m, _stripe(segments))]
    assert checks == rs_spec.check_blocks(k, m, segments)
    positions = sorted(data.draw(st.permutations(range(k + m)))[:k])
    shards = [segments[p] if p < k else checks[p - k] for p in positions]
    assert rs_spec.solve(k, m, positions, shards) == segments
    for q in (q for q in range(k) if q not in positions):
        assert bytes(rs_coder.decode(k, m, shards, positions, q)) == segments[q]


def test_fragment_headers_do_not_depend_on_the_bytes():
    """What rs_coder.decode relies on: the library's header for a position and size is the same whatever the
    payload, so headers made from zeros frame any shards of that size."""
    k, m, r = 4, 3, 1000
    zeros, other = (rs_coder.driver(k, m).encode(p) for p in (bytes(k * r), os.urandom(k * r)))
    assert [f[:len(f) - r] for f in zeros] == [f[:len(f) - r] for f in other]
    assert all(len(f) > r for f in zeros)  # framed: the library's own header before the block


def test_a_library_that_frames_fragments_otherwise_is_refused(monkeypatch):
    """The coder takes each block from the end of its fragment; a fragment with bytes after the block (padding)
    must stop the encoding rather than yield wrong check blocks."""
    real = rs_coder.driver

    class Padded:
        def __init__(self, k, m):
            self.inner = real(k, m)

        def encode(self, payload):
            return [f + b"\0" * 16 for f in self.inner.encode(payload)]

    monkeypatch.setattr(rs_coder, "driver", Padded)
    with pytest.raises(RuntimeError, match="not a header followed by the block"):
        rs_coder.encode(3, 2, _stripe([os.urandom(64) for _ in range(3)]))


def test_the_coder_is_available_here():
    assert rs_coder.missing() is None


def test_without_pyeclib_rs_every_is_refused_with_the_install_line(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pyeclib.ec_iface", None)  # `from pyeclib.ec_iface import ...` fails
    assert "pip install 'hpcckpt[rs]'" in rs_coder.missing()
    with pytest.raises(CheckpointError, match=r"rs_every needs the PyECLib library: pip install 'hpcckpt\[rs\]'"):
        Checkpointer(str(tmp_path / "root"), local_dir=str(tmp_path / "local"), rs_every=1, track_failures=False)
