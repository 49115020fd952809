"""A redundancy level registered from outside the package: its options become Checkpointer keywords, its save half
runs at the commit and its restore half rebuilds a lost data file, with no edit of hpcckpt."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, strategies as st

from hpcckpt import Block, Checkpointer
from hpcckpt.core.names import rank_file
from hpcckpt.errors import CheckpointError
from hpcckpt.levels import LevelOptions
from hpcckpt.levels.base import Level, Lost, check_int
from hpcckpt.levels.registry import LEVELS
from hpcckpt.mpi.collective import agree
from hpcckpt.storage.metadata_file import read_metadata

STEP2 = "step-000000000002"


@dataclass(frozen=True)
class MirrorOptions:
    mirror_every: int | None = None
    mirror_dir: str | None = None

    def __post_init__(self):
        check_int("mirror_every", self.mirror_every, 0, optional=True)
        if self.mirror_every and self.mirror_dir is None:
            raise CheckpointError("mirror_every needs mirror_dir")


class MirrorLevel(Level):
    """Each rank's data file copied into ``mirror_dir/<version>/``; a lost file is copied back from there."""

    key = "mirror"
    label = "MIRROR"
    title = "the mirror"
    recovers = "any lost file"
    Options = MirrorOptions

    def needs_local_dir(self) -> list[str]:
        return [] if self.options.mirror_dir is None else ["mirror_dir"]

    def available(self, node) -> bool:
        return self.options.mirror_dir is not None

    def protect(self, node, directory, sizes, fsync, what):
        mirror = os.path.join(self.options.mirror_dir, os.path.basename(directory))

        def copy():
            os.makedirs(mirror, exist_ok=True)
            shutil.copyfile(os.path.join(directory, rank_file(node.rank)),
                            os.path.join(mirror, os.path.basename(rank_file(node.rank))))

        agree(node.comm, what + " (mirror)", copy)
        return {"dir": mirror}

    def plan_rebuild(self, description, lost: Lost):
        return list(lost.ranks), None

    def rebuild(self, comm, description, plan, directory, sizes, what):
        rank = comm.Get_rank()

        def copy_back():
            if rank in plan:
                shutil.copyfile(os.path.join(description["dir"], os.path.basename(rank_file(rank))),
                                os.path.join(directory, rank_file(rank)))

        agree(comm, what + " (mirror)", copy_back)


@pytest.fixture
def mirror():
    LEVELS.register(MirrorLevel)
    try:
        yield MirrorLevel
    finally:
        del LEVELS["mirror"]


def _state(step: int) -> dict:
    return {"u": Block(np.arange(1000.0) * step), "step": step}


def test_a_registered_level_saves_and_restores_a_lost_file(tmp_path, mirror):
    kw = {"local_dir": tmp_path / "local", "mirror_dir": str(tmp_path / "mirror"), "track_failures": False}
    with Checkpointer(tmp_path / "root", mirror_every=1, flush_every=2, **kw) as ck:  # step 2 stays off the root
        for step in (1, 2):
            ck.save(_state(step), step)
        assert ck.last_result.levels == ("L1", "MIRROR")
        assert read_metadata(str(tmp_path / "local" / STEP2)).extra["levels"]["mirror"] == {
            "dir": str(tmp_path / "mirror" / STEP2)}
    os.unlink(tmp_path / "local" / STEP2 / rank_file(0))
    with Checkpointer(tmp_path / "root", **kw) as ck:  # no interval: it protects nothing, but restores
        template = {"u": Block(np.zeros(1000)), "step": 0}
        got = ck.restore(template)
        assert got["step"] == 2 and ck.engine.restored_level == "MIRROR"
        assert np.array_equal(template["u"].local, _state(2)["u"].local)


def test_hpcckpt_ls_shows_a_registered_level_as_a_column(tmp_path, mirror, capsys):
    """``hpcckpt ls`` names its level columns from the registry: a registered level has its own column."""
    from hpcckpt.cli import main

    kw = {"local_dir": tmp_path / "local", "mirror_dir": str(tmp_path / "mirror"), "track_failures": False}
    with Checkpointer(tmp_path / "root", mirror_every=2, flush_every=1, **kw) as ck:
        for step in (1, 2):
            ck.save(_state(step), step)
    main(["ls", str(tmp_path / "root")])
    out = capsys.readouterr().out
    assert "MIRROR every 2" in out
    table = [line.split() for line in out.splitlines() if line.strip().startswith(("VERSION", "step-"))]
    header = table[0]
    assert header == ["VERSION", "L1", "L2", "L3", "RS", "PM", "MIRROR", "L4"]
    rows = {row[0]: dict(zip(header, row)) for row in table[1:]}
    assert rows["step-000000000001"]["MIRROR"] == "yes"  # the 0th checkpoint of the run
    assert rows["step-000000000002"]["MIRROR"] == "-"
    assert all(row["L4"] == "yes" for row in rows.values())
    main(["ls", "--json", str(tmp_path / "root")])
    doc = json.loads(capsys.readouterr().out)
    assert [v["MIRROR"] for v in doc["levels"]["versions"]] == [True, False]


def test_a_registered_level_options_are_checked_like_the_built_in_ones(tmp_path, mirror):
    with pytest.raises(CheckpointError, match="mirror_every needs mirror_dir"):
        Checkpointer(tmp_path / "root", local_dir=tmp_path / "local", mirror_every=1, track_failures=False)
    with pytest.raises(CheckpointError, match="mirror_dir needs local_dir"):
        Checkpointer(tmp_path / "root", mirror_dir=str(tmp_path / "m"), track_failures=False)
    with pytest.raises(CheckpointError, match="mirror_every must be an integer"):
        Checkpointer(tmp_path / "root", local_dir=tmp_path / "local", mirror_every=-1, mirror_dir="m",
                     track_failures=False)


def test_an_unregistered_level_keyword_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="mirror_every"):
        Checkpointer(tmp_path / "root", local_dir=tmp_path / "local", mirror_every=1, track_failures=False)


every = st.one_of(st.none(), st.integers(0, 5))


@given(partner=every, parity=every, rs=every, flush=st.one_of(st.none(), st.integers(1, 5)), count=st.integers(0, 60))
def test_intervals_follow_the_keywords_given(partner, parity, rs, flush, count):
    """The intervals are those given (0 for the others), unless none is given: then they are derived (a partner
    copy at every checkpoint, where there is a partner)."""
    kw = {k: v for k, v in (("partner_every", partner), ("parity_every", parity), ("rs_every", rs),
                                 ("flush_every", flush)) if v is not None}
    options = LevelOptions.from_kwargs(local_dir="/tmp/x", **kw)
    assert options.derived == (not kw)
    for unavailable in ((), ("partner",)):
        intervals = options.intervals(unavailable)
        expected = {"partner": partner or 0, "parity": parity or 0, "rs": rs or 0, "pmem": 0}
        if not kw:
            expected["partner"] = 0 if unavailable else 1
        assert dict(intervals.every) == expected and intervals.flush_every == (flush or 1)
        due = intervals.due(count)
        assert due == {**{k: bool(v) and count % v == 0 for k, v in expected.items()},
                       "flush": count % (flush or 1) == 0}
