"""Tracked files against a crafted checkpoint and planted links: a restore acts only on what the running
application registers, inside the registered location, and never writes through a symbolic link.

The metadata of a checkpoint is untrusted (docs/format.md): its tracked-file
records are sealed again after each edit (tests/support/metadata_tools.py), so the
refusals tested here are those of the rollback, not of the seal check.
"""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import hpcckpt
from hpcckpt import Block, CheckpointError
from hpcckpt.mpi.collective import SerialComm
from hpcckpt.root.file_manifest import Pattern, Record, glob_matches, registered_location, registration_of
from hpcckpt.root.files import ROLLBACK_SUFFIX
from metadata_tools import rewrite_metadata

VICTIM = b"precious bytes that no restore may touch\n" * 10


def state(step):
    return {"u": Block(np.full(4, float(step))), "step": step}


def template():
    return {"u": Block(np.zeros(4)), "step": None}


def save_one(root, files, step=1):
    ck = hpcckpt.Checkpointer(root, comm=SerialComm(), files=files)
    ck.save(state(step), step)
    ck.close()


def version_dir(root):
    (only,) = [d for d in os.listdir(root) if d.startswith("step-")]
    return os.path.join(root, only)


def add_records(root, *entries):
    """Append crafted records to the manifest of the only version under ``root``."""
    def edit(doc):
        doc["extra"]["files"]["entries"].extend(entries)
    rewrite_metadata(version_dir(root), edit)


def restore(root, files):
    ck = hpcckpt.Checkpointer(root, comm=SerialComm(), files=files)
    try:
        return ck.restore(template())
    finally:
        ck.close()


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "elsewhere" / "victim.txt"
    path.parent.mkdir()
    path.write_bytes(VICTIM)
    return path


@pytest.fixture
def run(tmp_path, monkeypatch):
    """A run directory (the working directory) with an output log registered as 'out/log.txt'."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "log.txt").write_bytes(b"line 1\n")
    return tmp_path


def crafted(path, mode):
    if mode == "absent":
        return {"path": path, "rank": 0, "mode": "absent"}
    return {"path": path, "rank": 0, "mode": "append", "size": 0, "tail_bytes": 1 << 20,
            "tail": "2d06800538d394c2"}  # XXH3-64 of no bytes: a size-0 append record truncates to nothing


# --------------------------------------------------------------------------- crafted records

@pytest.mark.parametrize("mode", ["absent", "append"])
@pytest.mark.parametrize("how", ["absolute", "dotdot", "unnormalised"])
def test_a_crafted_record_of_an_unregistered_path_is_ignored_with_a_warning(run, victim, mode, how):
    save_one("ck", ["out/log.txt"])
    path = {"absolute": str(victim), "dotdot": "../" + os.path.relpath(victim, run.parent),
            "unnormalised": "out/../elsewhere/victim.txt"}[how]
    add_records("ck", crafted(path, mode))
    with pytest.warns(UserWarning, match="leaves alone.*no registration of this run covers them"):
        restore("ck", ["out/log.txt"])
    assert victim.read_bytes() == VICTIM


def test_a_crafted_record_under_a_registered_glob_cannot_delete(run):
    """A glob never records 'absent': an absent record of a path the glob matches is not acted on."""
    (run / "out" / "a.csv").write_bytes(b"1,2\n")
    save_one("ck", ["out/*.csv"])
    (run / "out" / "b.csv").write_bytes(b"3,4\n")
    add_records("ck", crafted("out/b.csv", "absent"))
    with pytest.warns(UserWarning, match="'out/b.csv'"):
        restore("ck", ["out/*.csv"])
    assert (run / "out" / "b.csv").read_bytes() == b"3,4\n"


def test_a_record_registered_by_the_saving_run_only_is_left_alone(run):
    (run / "out" / "other.txt").write_bytes(b"a\n")
    save_one("ck", ["out/log.txt", "out/other.txt"])
    for name in ("log.txt", "other.txt"):
        with open(run / "out" / name, "ab") as f:
            f.write(b"after the save\n")
    with pytest.warns(UserWarning, match="'out/other.txt'"):
        restore("ck", ["out/log.txt"])
    assert (run / "out" / "log.txt").read_bytes() == b"line 1\n"  # registered now: rolled back
    assert (run / "out" / "other.txt").read_bytes() == b"a\nafter the save\n"  # not registered now: untouched


def test_a_glob_match_through_a_symlinked_directory_is_not_rolled_back(run, victim):
    (run / "out" / "a").mkdir()
    (run / "out" / "a" / "x.log").write_bytes(b"x\n")
    save_one("ck", ["out/*/x.log"])
    os.rename(victim, victim.parent / "x.log")
    target = victim.parent / "x.log"
    (run / "out" / "evil").symlink_to(victim.parent, target_is_directory=True)
    add_records("ck", crafted("out/evil/x.log", "append"))
    with pytest.warns(UserWarning, match="resolves outside the registered one"):
        restore("ck", ["out/*/x.log"])
    assert target.read_bytes() == VICTIM


def test_a_glob_does_not_record_files_through_a_symlinked_directory(run, victim):
    (run / "out" / "evil").symlink_to(victim.parent, target_is_directory=True)
    os.rename(victim, victim.parent / "x.log")
    ck = hpcckpt.Checkpointer("ck", comm=SerialComm(), files=["out/*/x.log"])
    ck.save(state(1), 1)
    ck.close()
    from hpcckpt.root.files import records_of
    assert records_of(version_dir("ck")) == []


# --------------------------------------------------------------------------- symbolic links

def test_a_tracked_path_that_is_a_link_is_refused_at_the_save(run):
    (run / "out" / "real.bin").write_bytes(b"a" * 100)
    (run / "out" / "link.bin").symlink_to(run / "out" / "real.bin")
    ck = hpcckpt.Checkpointer("ck", comm=SerialComm(), files={"out/link.bin": "inplace"})
    with pytest.raises(CheckpointError, match="is a symbolic link.*register the file it points to.*real.bin"):
        ck.save(state(1), 1)
    ck.close()
    assert hpcckpt.Checkpointer("ck", comm=SerialComm()).latest() is None


def test_a_glob_skips_symbolic_links(run):
    (run / "out" / "a.csv").write_bytes(b"1\n")
    (run / "out" / "latest.csv").symlink_to(run / "out" / "a.csv")
    save_one("ck", ["out/*.csv"])
    from hpcckpt.root.files import records_of
    assert [r.path for r in records_of(version_dir("ck"))] == ["out/a.csv"]


@pytest.mark.parametrize("mode", ["inplace", "append"])
def test_a_file_replaced_by_a_link_is_refused_and_the_target_untouched(run, victim, mode):
    (run / "out" / "data.bin").write_bytes(b"a" * 3000)
    save_one("ck", {"out/data.bin": mode})
    os.unlink(run / "out" / "data.bin")
    (run / "out" / "data.bin").symlink_to(victim)
    with pytest.raises(CheckpointError, match="'out/data.bin' was replaced by something else.*symbolic link"):
        restore("ck", {"out/data.bin": mode})
    assert victim.read_bytes() == VICTIM
    assert os.path.islink(run / "out" / "data.bin")


def test_a_planted_link_at_the_rollback_temporary_is_not_written_through(run, victim):
    (run / "out" / "data.bin").write_bytes(b"a" * 3000)
    save_one("ck", {"out/data.bin": "inplace"})
    (run / "out" / "data.bin").write_bytes(b"b" * 3000)
    planted = run / "out" / (".data.bin" + ROLLBACK_SUFFIX)
    planted.symlink_to(victim)
    restore("ck", {"out/data.bin": "inplace"})
    assert victim.read_bytes() == VICTIM
    assert (run / "out" / "data.bin").read_bytes() == b"a" * 3000
    assert not os.path.lexists(planted)


# --------------------------------------------------------------------------- the pure rule

def rec(path, mode="append", rank=0):
    return Record(path=path, rank=rank, mode=mode)


@pytest.mark.parametrize("path, mode, registered, covered", [
    ("out/log.txt", "append", [Pattern("out/log.txt")], True),
    ("out/log.txt", "absent", [Pattern("out/log.txt")], True),
    ("out/log.txt", "inplace", [Pattern("out/log.txt")], False),  # registered append-only now
    ("out/log.txt", "append", [Pattern("./out//log.txt")], True),  # the registration is normalised
    ("out/../log.txt", "append", [Pattern("out/../log.txt")], False),  # saves record normalised paths
    ("/etc/passwd", "absent", [Pattern("out/*.txt")], False),
    ("out/a.txt", "absent", [Pattern("out/*.txt")], False),  # a glob records no absent file
    ("out/a.txt", "append", [Pattern("out/*.txt")], True),
    ("out/sub/a.txt", "append", [Pattern("out/*.txt")], False),  # '*' does not cross '/'
    ("out/.a.txt", "append", [Pattern("out/*.txt")], False),  # nor match a hidden name
    ("out/rank-3.log", "append", [Pattern("out/rank-{rank}.log")], True),
    ("out/rank-2.log", "append", [Pattern("out/rank-{rank}.log")], False),  # recorded by rank 3
])
def test_which_records_a_registration_covers(path, mode, registered, covered):
    assert (registration_of(rec(path, mode, rank=3 if "rank" in path else 0), registered) is not None) == covered


@pytest.mark.parametrize("name, location", [("out/log.txt", "out"), ("log.txt", "."), ("/var/log/x", "/var/log"),
                                            ("out/*/x.log", "out"), ("/x*/y", "/"), ("*.log", ".")])
def test_the_registered_location_is_the_leading_directories_without_glob_characters(name, location):
    assert registered_location(name) == location


components = st.sampled_from(["a", "b", ".h", "ab", "a.txt", "b.csv"])
pattern_components = st.sampled_from(["a", "*", "?", "a*", "*.txt", "[ab]", ".*", "b.csv", "*b*"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(components, min_size=1, max_size=3), min_size=1, max_size=6),
       st.lists(pattern_components, min_size=1, max_size=3))
def test_glob_matches_agrees_with_glob_glob_on_a_real_tree(tmp_path_factory, files, pattern):
    base = tmp_path_factory.mktemp("tree")
    made = set()
    for parts in files:
        path = base.joinpath(*parts)
        if any(str(m).startswith(str(path) + os.sep) or str(path).startswith(str(m) + os.sep) for m in made):
            continue  # a name that is both a file and a directory
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
        made.add(path)
    cwd = os.getcwd()
    os.chdir(base)
    try:
        joined = "/".join(pattern)
        expected = sorted(p for p in glob.glob(joined) if os.path.isfile(p))
        got = sorted(os.path.relpath(p, base) for p in made if glob_matches(joined, os.path.relpath(p, base)))
    finally:
        os.chdir(cwd)
    assert got == expected
