"""The ``hpcckpt`` command line: ls, inspect, verify, gc, interval; errors as one line, never a traceback.

Checkpoints are real ones written by hpcckpt.Checkpointer / hpcckpt.save in one
process (comm=None, no mpiexec).  Most commands run through ``main([...])`` with
capsys; a few through ``python -m hpcckpt`` in a subprocess, as a user would.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hpcckpt
from hpcckpt import cli
from hpcckpt.format.metadata import FORMAT_VERSION
from hpcckpt.policy import FailureHistory, daly, estimate_mtbf, expected_waste, young
from metadata_tools import rewrite_metadata
from testpaths import REPO

ROOT_DIR = REPO
PART = "data/part-000000.bin"


def make_state(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    u = rng.standard_normal((6, 5))
    rec = np.zeros(4, dtype=[("x", "<f4"), ("id", "<i8")])
    rec["id"] = np.arange(4)
    return {"u": hpcckpt.Block(u, offset=(0, 0), global_shape=(6, 5)),
            "p": hpcckpt.Ragged(rec),
            "step": seed, "time": 0.5 * seed, "name": "demo", "bad": float("nan"), "arr": np.arange(3)}


def step_dir(root, step: int, revision: int = 0) -> str:
    return os.path.join(root, f"step-{step:012d}" + (f".r{revision}" if revision else ""))


@pytest.fixture
def root(tmp_path, table_form):
    """A Checkpointer root with committed steps 0, 5 and 10 (several chunks per variable), its chunk tables in
    each form (JSON arrays, columnar)."""
    path = str(tmp_path / "ckpt")
    ck = hpcckpt.Checkpointer(path, comm=None, chunk_bytes=64)
    for step in (0, 5, 10):
        ck.save(make_state(step), step=step)
    ck.close()
    return path


def add_superseded(root: str) -> None:
    """Make step 10 have two revisions: the copy .r1 is newer, the original is superseded."""
    shutil.copytree(step_dir(root, 10), step_dir(root, 10, 1))


def add_partial(root: str, step: int = 20, age: float | None = None) -> str:
    """The leftover of an interrupted save: data written, metadata never renamed into place."""
    path = step_dir(root, step)
    shutil.copytree(step_dir(root, 10), path)
    os.remove(os.path.join(path, "metadata.json"))
    if age is not None:
        old = os.path.getmtime(path) - age
        for d, _, files in os.walk(path):
            for name in [*files, None]:
                p = d if name is None else os.path.join(d, name)
                os.utime(p, (old, old))
    return path


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc: int, err: str, *needles: str) -> None:
    assert rc != 0
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("hpcckpt: error: ")
    for needle in needles:
        assert needle in lines[0]


def flip_bit(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x10]))


# --------------------------------------------------------------------------- help and usage

@pytest.mark.parametrize("command", [[], ["ls"], ["inspect"], ["verify"], ["gc"], ["interval"], ["simulate"]])
def test_help_everywhere(capsys, command):
    rc, out, err = run_cli(capsys, *command, "--help")
    assert rc == 0
    assert out.startswith("usage: hpcckpt" + (f" {command[0]}" if command else ""))
    assert err == ""


def test_no_command_prints_usage(capsys):
    rc, out, err = run_cli(capsys)
    assert rc == 2
    assert "usage: hpcckpt" in err


def test_usage_error_is_argparse_style(capsys, root):
    rc, out, err = run_cli(capsys, "gc", root, "--keep", "0")
    assert rc == 2
    assert "Traceback" not in err
    assert "--keep: must be at least 1" in err


# --------------------------------------------------------------------------- ls

def test_ls_committed(capsys, root):
    rc, out, err = run_cli(capsys, "ls", root)
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["STEP", "VERSION", "STATE", "SIZE", "CREATED", "VARS", "VALUES"]
    body = [line.split() for line in lines[1:4]]
    assert [row[0] for row in body] == ["0", "5", "10"]
    assert all(row[2] == "committed" for row in body)
    assert all(row[-2:] == ["2", "5"] for row in body)  # u, p; step, time, name, bad, arr
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(step_dir(root, 5)) for f in fs)
    assert cli.common.human_bytes(size) == " ".join(body[1][3:5])
    assert "3 versions: 3 committed (newest step 10)" in out


def test_ls_partial_and_superseded(capsys, root):
    add_superseded(root)
    add_partial(root)
    rc, out, err = run_cli(capsys, "ls", root)
    assert rc == 0, err
    states = {line.split()[1]: line.split()[2] for line in out.splitlines()[1:] if line.split()[1:2]
              and line.split()[1].startswith("step-")}
    assert states == {"step-000000000000": "committed", "step-000000000005": "committed",
                      "step-000000000010": "superseded", "step-000000000010.r1": "committed",
                      "step-000000000020": "partial"}
    assert "1 superseded, 1 partial" in out
    rc, out, _ = run_cli(capsys, "ls", root, "--json")
    doc = json.loads(out)
    assert [(v["name"], v["state"]) for v in doc["versions"]][-3:] == [
        ("step-000000000010", "superseded"), ("step-000000000010.r1", "committed"), ("step-000000000020", "partial")]
    assert doc["versions"][-1]["created"] is None


def test_ls_damaged_metadata_is_listed_not_fatal(capsys, root):
    with open(os.path.join(step_dir(root, 5), "metadata.json"), "w") as f:
        f.write('{"format": "hpcckpt", "format_version": 99}')
    rc, out, err = run_cli(capsys, "ls", root)
    assert rc == 0, err
    assert re.search(r"step-000000000005\s+damaged", out)
    assert "format version 99 is not supported" in out


def test_ls_failure_history_footer(capsys, tmp_path):
    path = str(tmp_path / "ckpt")
    ck = hpcckpt.Checkpointer(path, comm=None)
    ck.save(make_state(), step=1)
    ck.close()
    history = FailureHistory.load(path)
    t = 1.0e9
    for hours in (5, 7, 9):  # three runs killed after 5, 7 and 9 hours
        history.job_start(t)
        history.heartbeat(t + hours * 3600)
        t += (hours + 1) * 3600
    history.job_start(t)
    history.clean_end(t + 3600)
    expected = estimate_mtbf(FailureHistory.load(path))
    rc, out, err = run_cli(capsys, "ls", path)
    assert rc == 0, err
    footer = out.splitlines()[-1]
    assert footer == (f"failure history: 5 runs; {expected.n_failures} failures in "
                      f"{cli.common.duration_text(expected.exposure)} of running time, so a failure is expected "
                      f"about every {cli.common.duration_text(expected.mtbf)}")
    assert expected.n_failures >= 3
    rc, out, err = run_cli(capsys, "ls", path, "--details")
    assert rc == 0, err
    assert out.splitlines()[-1] == footer + f"; estimate: {expected}"  # the estimator's own words, on request
    rc, out, _ = run_cli(capsys, "ls", path, "--prior-mtbf", "2h", "--json")
    doc = json.loads(out)["failure_history"]
    assert doc["mtbf_s"] == pytest.approx(estimate_mtbf(FailureHistory.load(path), prior_mtbf=7200).mtbf)
    assert doc["prior_mtbf_s"] == 7200


def test_ls_malformed_history_reported_and_left_alone(capsys, root):
    path = os.path.join(root, "failure_history.json")
    with open(path, "w") as f:
        f.write("{not json")
    rc, out, err = run_cli(capsys, "ls", root)
    assert rc == 0
    assert "is unreadable" in out.splitlines()[-1]
    assert os.path.exists(path) and not os.path.exists(path + ".bad")  # ls is read-only


def test_ls_without_history_has_no_footer(capsys, root):
    os.remove(os.path.join(root, "failure_history.json"))
    rc, out, _ = run_cli(capsys, "ls", root)
    assert rc == 0
    assert "failure history" not in out


def test_ls_errors(capsys, tmp_path, root):
    rc, _, err = run_cli(capsys, "ls", tmp_path / "absent")
    assert_one_line_error(rc, err, "no such checkpoint root")
    rc, _, err = run_cli(capsys, "ls", step_dir(root, 5))
    assert_one_line_error(rc, err, "single checkpoint version", "hpcckpt inspect")


def test_ls_of_a_directory_holding_roots_below_names_them(capsys, tmp_path):
    for sub, steps in (("a/ckpt", (1, 2)), ("b/c/ckpt", (3,)), ("d/e/f/ckpt", (4,))):  # the last is 4 levels down
        with hpcckpt.Checkpointer(str(tmp_path / sub), comm=None) as ck:
            for step in steps:
                ck.save(make_state(step), step=step)
    rc, out, err = run_cli(capsys, "ls", tmp_path)
    assert rc == 0, err
    a, c = str(tmp_path / "a" / "ckpt"), str(tmp_path / "b" / "c" / "ckpt")
    assert out.splitlines() == [f"{tmp_path} is not a Checkpointer root (it holds no versions); the roots below it:",
                                f"  {a}    2 versions", f"  {c}  1 version",
                                f"point hpcckpt at one of them: hpcckpt ls {a}"]
    rc, out, _ = run_cli(capsys, "ls", tmp_path, "--json")
    assert rc == 0 and json.loads(out)["roots_below"] == [{"root": a, "versions": 2}, {"root": c, "versions": 1}]


def test_ls_of_a_directory_with_no_root_within_reach_fails(capsys, tmp_path):
    (tmp_path / "x" / "y").mkdir(parents=True)
    rc, _, err = run_cli(capsys, "ls", tmp_path)
    assert_one_line_error(rc, err, f"{tmp_path}: no checkpoint versions", "no Checkpointer root up to 3 levels below")
    rc, out, _ = run_cli(capsys, "ls", tmp_path, "--json")
    assert rc == 1 and json.loads(out)["versions"] == [] and json.loads(out)["roots_below"] == []


# --------------------------------------------------------------------------- inspect

def test_inspect_text(capsys, root):
    rc, out, err = run_cli(capsys, "inspect", step_dir(root, 5))
    assert rc == 0, err
    assert re.search(r"^step\s+5$", out, re.M)
    assert re.search(r"^written by\s+1 rank$", out, re.M)
    assert re.search(r"^\s+u\s+block\s+6x5\s+<f8\s+none\s+\d+\s+240 B\s+240 B$", out, re.M)
    assert re.search(r"^\s+p\s+ragged\s+4\s+\[\('x', '<f4'\), \('id', '<i8'\)\]\s+none", out, re.M)
    assert re.search(r"^\s+name\s+= 'demo'$", out, re.M)
    assert re.search(r"^\s+bad\s+= nan$", out, re.M)
    assert PART in out
    assert "chunks of" not in out


def test_inspect_chunks(capsys, root):
    rc, out, _ = run_cli(capsys, "inspect", step_dir(root, 5), "--chunks")
    assert rc == 0
    assert "chunks of u" in out
    assert re.search(r"^\s+0\s+\[0:\d, 0:5\]\s+" + re.escape(PART) + r"\s+\d+\s+\d+\s+[0-9a-f]{16}$", out, re.M)


def test_inspect_root_shows_newest(capsys, root):
    rc, out, _ = run_cli(capsys, "inspect", root)
    assert rc == 0
    assert "newest committed version step-000000000010" in out
    assert re.search(r"^step\s+10$", out, re.M)


def test_inspect_json(capsys, root):
    rc, out, err = run_cli(capsys, "inspect", step_dir(root, 5), "--json", "--chunks")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["format"] == "hpcckpt" and doc["format_version"] == FORMAT_VERSION and doc["checksum"] == "xxh3_64"
    assert doc["step"] == 5 and doc["nranks"] == 1
    assert doc["files"] == [{"name": PART, "size": os.path.getsize(os.path.join(step_dir(root, 5), PART))}]
    u = doc["variables"]["u"]
    assert (u["kind"], u["shape"], u["dtype"], u["codec"]) == ("block", [6, 5], "<f8", {"id": "none"})
    assert u["nbytes"] == 240 == sum(c["nbytes"] for c in u["chunks"])
    assert u["nchunks"] == len(u["chunks"]) > 1
    p = doc["variables"]["p"]
    assert p["dtype"] == [["x", "<f4"], ["id", "<i8"]]
    assert doc["values"]["name"] == "demo"
    assert doc["values"]["bad"] == {"$hpcckpt": "float", "value": "nan"}
    # the chunk table is enough to read the data back by hand
    with hpcckpt.open(step_dir(root, 5)) as view:
        expected = view.read("u")
    got = np.empty((6, 5))
    for c in u["chunks"]:
        with open(os.path.join(step_dir(root, 5), c["file"]), "rb") as f:
            f.seek(c["offset"])
            block = np.frombuffer(f.read(c["nbytes"]), "<f8").reshape(c["count"])
        got[tuple(slice(a, a + n) for a, n in zip(c["start"], c["count"]))] = block
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("version", [1, 2])
def test_inspect_gives_an_old_version_its_own_format_version(capsys, version):
    path = os.path.join(ROOT_DIR, "tests", "data", f"v{version}", "plain")
    rc, out, _ = run_cli(capsys, "inspect", path)
    assert rc == 0 and re.search(rf"^format\s+hpcckpt format version {version},", out, re.M)
    rc, out, _ = run_cli(capsys, "inspect", path, "--json")
    assert rc == 0 and json.loads(out)["format_version"] == version
    rc, out, _ = run_cli(capsys, "verify", path)
    assert rc == 0 and out.startswith("OK: ")


def test_inspect_json_without_chunks(capsys, root):
    rc, out, _ = run_cli(capsys, "inspect", step_dir(root, 0), "--json")
    doc = json.loads(out)
    assert "chunks" not in doc["variables"]["u"]


# --------------------------------------------------------------------------- verify

def test_verify_version_ok(capsys, root):
    rc, out, err = run_cli(capsys, "verify", step_dir(root, 5))
    assert rc == 0, out + err
    total = 240 + 4 * 12
    assert re.fullmatch(rf"OK: \S+: \d+ chunks, {total} B verified in [\d.]+(us|ms|s)\n", out)
    assert err == ""  # no progress bar: small and not a terminal


def test_verify_root_checks_every_committed_version(capsys, root):
    add_superseded(root)
    add_partial(root)
    flip_bit(os.path.join(step_dir(root, 10), PART), 3)  # the superseded revision: not checked
    rc, out, err = run_cli(capsys, "verify", root)
    assert rc == 0, out + err
    assert "3 versions" in out and "skipped 2 partial or superseded" in out


def test_verify_bit_flip(capsys, root):
    target = os.path.join(step_dir(root, 5), PART)
    flip_bit(target, os.path.getsize(target) - 5)
    rc, out, err = run_cli(capsys, "verify", step_dir(root, 5))
    assert rc == 1
    corrupt = [line for line in out.splitlines() if line.startswith("CORRUPT:")]
    assert len(corrupt) == 1
    assert os.path.realpath(target) in corrupt[0] and "fails its checksum" in corrupt[0]
    assert out.splitlines()[-1].startswith("FAILED: 1 problem")
    # on a root, the damaged version is named too and the others still pass
    rc, out, _ = run_cli(capsys, "verify", root)
    assert rc == 1 and os.path.realpath(target) in out and out.count("CORRUPT:") == 1


def test_verify_truncated(capsys, root):
    target = os.path.join(step_dir(root, 10), PART)
    os.truncate(target, os.path.getsize(target) // 2)
    rc, out, err = run_cli(capsys, "verify", step_dir(root, 10))
    assert rc == 1
    assert "truncated" in out and os.path.realpath(target) in out
    assert "Traceback" not in out + err


def test_verify_missing_data_file(capsys, root):
    target = os.path.join(step_dir(root, 0), PART)
    os.remove(target)
    rc, out, _ = run_cli(capsys, "verify", step_dir(root, 0))
    assert rc == 1
    assert f"data file {os.path.realpath(target)} is missing" in out


def test_verify_missing_metadata(capsys, root):
    path = add_partial(root)
    rc, out, err = run_cli(capsys, "verify", path)
    assert_one_line_error(rc, err, "metadata.json is missing", path)
    rc, out, err = run_cli(capsys, "inspect", path)
    assert_one_line_error(rc, err, "metadata.json is missing")


def test_verify_malformed_metadata(capsys, root):
    meta = os.path.join(step_dir(root, 5), "metadata.json")
    with open(meta, "r+b") as f:
        f.truncate(100)
    rc, out, err = run_cli(capsys, "verify", step_dir(root, 5))
    assert rc == 1 and "CORRUPT:" in out and "metadata.json" in out and "fails its checksum" in out
    rc, out, err = run_cli(capsys, "inspect", step_dir(root, 5))
    assert_one_line_error(rc, err, "metadata.json", "fails its checksum")


def test_verify_path_traversal_is_reported(capsys, root):
    rewrite_metadata(step_dir(root, 5), lambda doc: doc.update(files=["../../etc/passwd"]))
    rc, out, err = run_cli(capsys, "verify", step_dir(root, 5))
    assert rc == 1 and "leaves the checkpoint directory" in out


def test_verify_progress_bar(capsys, root, monkeypatch):
    rc, out, err = run_cli(capsys, "verify", step_dir(root, 5), "--progress")
    assert rc == 0 and "verify" in err and "B" in err
    # automatic: only above the threshold and on a terminal
    monkeypatch.setattr(cli.verify, "PROGRESS_THRESHOLD", 10)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    rc, out, err = run_cli(capsys, "verify", step_dir(root, 5))
    assert rc == 0 and "verify" in err
    rc, out, err = run_cli(capsys, "verify", step_dir(root, 5), "--no-progress")
    assert rc == 0 and err == ""


def test_verify_single_save_directory(capsys, tmp_path):
    path = str(tmp_path / "one")
    hpcckpt.save(make_state(3), path, comm=None)
    rc, out, _ = run_cli(capsys, "verify", path)
    assert rc == 0 and out.startswith("OK: ")


def test_inspect_and_verify_zero_d_and_empty_variables(capsys, tmp_path):
    path = str(tmp_path / "v")
    hpcckpt.save({"s": hpcckpt.Block(np.array(2.5), offset=(), global_shape=()),
                  "e": hpcckpt.Block(np.zeros((0, 3)), offset=(0, 0), global_shape=(0, 3))}, path, comm=None)
    rc, out, err = run_cli(capsys, "inspect", path, "--chunks")
    assert rc == 0, err
    assert re.search(r"^\s+s\s+block\s+\(\)\s+<f8\s+none\s+1\s+8 B", out, re.M)
    assert re.search(r"^\s+e\s+block\s+0x3\s+<f8\s+none\s+0\s+0 B", out, re.M)
    rc, out, err = run_cli(capsys, "verify", path)
    assert rc == 0 and out.startswith("OK: ") and "1 chunk, 8 B" in out


# --------------------------------------------------------------------------- gc

def names(root: str) -> list[str]:
    return sorted(n for n in os.listdir(root) if n.startswith("step-"))


def test_gc_removes_leftovers_and_superseded(capsys, root):
    add_superseded(root)
    add_partial(root, age=3600)
    rc, out, err = run_cli(capsys, "gc", root)
    assert rc == 0, err
    assert names(root) == ["step-000000000000", "step-000000000005", "step-000000000010.r1"]
    assert re.search(r"^removed\s+step-000000000020\s.*partial", out, re.M)
    assert re.search(r"^removed\s+step-000000000010\s.*superseded by step-000000000010\.r1", out, re.M)
    assert out.splitlines()[-1].startswith("removed 2 versions")
    rc, out, _ = run_cli(capsys, "gc", root)  # nothing left to do
    assert rc == 0 and "removed 0 versions" in out


def test_gc_keeps_a_partial_that_may_be_in_progress(capsys, root):
    add_partial(root)  # just written: a save may be running
    rc, out, _ = run_cli(capsys, "gc", root)
    assert rc == 0 and "step-000000000020" in names(root) and "a save may be running" in out
    rc, out, _ = run_cli(capsys, "gc", root, "--grace", "0")
    assert rc == 0 and "step-000000000020" not in names(root)


def test_gc_keep(capsys, root):
    rc, out, _ = run_cli(capsys, "gc", root, "--keep", "1")
    assert rc == 0
    assert names(root) == ["step-000000000010"]
    assert out.count("beyond --keep 1") == 2
    with hpcckpt.open(step_dir(root, 10)) as view:
        assert view.values["step"] == 10


def test_gc_dry_run(capsys, root):
    add_partial(root, age=3600)
    before = names(root)
    rc, out, _ = run_cli(capsys, "gc", root, "--keep", "2", "--dry-run")
    assert rc == 0
    assert names(root) == before
    assert re.search(r"^would remove\s+step-000000000000\s.*beyond --keep 2", out, re.M)
    assert re.search(r"^would remove\s+step-000000000020\s.*partial", out, re.M)
    assert "dry run: would remove 2 versions" in out


def test_gc_errors(capsys, tmp_path):
    rc, _, err = run_cli(capsys, "gc", tmp_path / "absent")
    assert_one_line_error(rc, err, "no such checkpoint root")


def test_incremental_chain(capsys, tmp_path, table_form):
    """Incremental versions reference their base's data: gc keeps the base, verify checks the bytes it holds."""
    path = str(tmp_path / "inc")
    ck = hpcckpt.Checkpointer(path, comm=None, incremental=True, block_bytes=4096)
    u = np.zeros((64, 64))
    for s in range(3):
        u[s] = s + 1
        ck.save({"u": hpcckpt.Block(u, offset=(0, 0), global_shape=u.shape)}, step=s)
    ck.close()
    rc, out, _ = run_cli(capsys, "inspect", step_dir(path, 2), "--chunks")
    assert rc == 0 and "@step-000000000000/" + PART in out and "MISSING" not in out
    rc, out, _ = run_cli(capsys, "gc", path, "--keep", "1")
    assert rc == 0
    assert names(path) == ["step-000000000000", "step-000000000002"]
    assert re.search(r"^kept\s+step-000000000000\s.*a kept version references its data", out, re.M)
    rc, out, _ = run_cli(capsys, "verify", path)
    assert rc == 0, out
    base_file = os.path.join(step_dir(path, 0), PART)
    flip_bit(base_file, os.path.getsize(base_file) - 1)
    rc, out, _ = run_cli(capsys, "verify", step_dir(path, 2))
    assert rc == 1 and os.path.realpath(base_file) in out


def test_inspect_files_line_counts_own_files_apart_from_referenced_ones(capsys, tmp_path):
    """"files N, SIZE (+ R files of other versions, referenced)": N and SIZE are the version's own files only
    (N was the total, so the R references were counted twice)."""
    path = str(tmp_path / "inc")
    with hpcckpt.Checkpointer(path, comm=None, incremental=True, block_bytes=4096, track_failures=False) as ck:
        u = np.zeros((64, 64))
        for s in range(3):
            u[s] = s + 1
            ck.save({"u": hpcckpt.Block(u, offset=(0, 0), global_shape=u.shape)}, step=s)
    rc, out, _ = run_cli(capsys, "inspect", step_dir(path, 2))
    assert rc == 0
    listed = re.findall(r"^  (\S+)  +(\d[\d.]* \S+)$", out.split("variables")[0], re.M)
    own = [n for n, _ in listed if not n.startswith("@")]
    refs = [n for n, _ in listed if n.startswith("@")]
    assert own and refs, out
    m = re.search(r"^files +(\d+), ([\d.]+ \S+) \(\+ (\d+) files? of other versions, referenced\)$", out, re.M)
    assert m, out
    assert (int(m.group(1)), int(m.group(3))) == (len(own), len(refs)), out
    own_bytes = sum(os.path.getsize(os.path.join(step_dir(path, 2), n)) for n in own)
    from hpcckpt.cli.common import human_bytes
    assert m.group(2) == human_bytes(own_bytes), out
    rc, out, _ = run_cli(capsys, "inspect", step_dir(path, 0))  # a full version: no references, no "(+ ...)"
    assert re.search(r"^files +1, [\d.]+ \S+$", out, re.M), out


def test_compressed_variable(capsys, tmp_path):
    pytest.importorskip("numcodecs")
    path = str(tmp_path / "c")
    hpcckpt.save({"c": hpcckpt.Block(np.zeros((100, 100)), offset=(0, 0), global_shape=(100, 100))}, path,
                 comm=None, codec="zstd")
    rc, out, _ = run_cli(capsys, "inspect", path, "--json")
    var = json.loads(out)["variables"]["c"]
    assert var["codec"]["id"] != "none" and var["stored_bytes"] < var["nbytes"] == 80000
    rc, out, _ = run_cli(capsys, "verify", path)
    assert rc == 0 and out.startswith("OK: ")
    flip_bit(os.path.join(path, PART), 20)
    rc, out, _ = run_cli(capsys, "verify", path)
    assert rc == 1 and "fails its checksum" in out


# --------------------------------------------------------------------------- crafted metadata (fuzz)

@pytest.mark.parametrize("field,value", [("bytes", [1, "x"]), ("bytes", [None]), ("timeline", [[["write", 0, None]]]),
                                         ("timeline", 5), ("phases", {"write": []}), ("phases", {"write": [10**400]}),
                                         ("phases", {"write": [True]})])
def test_stats_of_a_malformed_timing_record_is_a_clean_error(capsys, root, field, value):
    """Found by the fuzz test below: a crafted ``extra.stats`` made ``hpcckpt stats`` crash (TypeError...)."""
    from hpcckpt.storage.metadata_file import read_metadata

    version = step_dir(root, 10)
    meta = read_metadata(version)
    meta.extra["stats"][field] = value
    with open(os.path.join(version, "metadata.json"), "wb") as f:
        f.write(meta.to_json_bytes())
    rc, _, err = run_cli(capsys, "stats", version, "--plot", os.path.join(root, "t.png"))
    assert_one_line_error(rc, err, "timing record")
    assert "internal error" not in err



#: Values a crafted metadata file may hold where the reader expects something sensible.
NASTY_INTS = st.sampled_from([0, -1, 1, 7, 2**31, 2**62, 2**63, 10**18, 10**30, -(10**30)])
NASTY_JSON = st.recursive(
    st.none() | st.booleans() | NASTY_INTS | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["", "\x00", "a\x00b", "x" * 300, "<M8[ns]", "@step-000000000000/data/part-000000.bin",
                       "data", "metadata.json"])
    | st.sampled_from([{"$hpcckpt": "ndarray", "dtype": "<f8", "shape": [10**9], "data": ""},
                       {"$hpcckpt": "scalar", "dtype": [["a", "<f8"]], "data": "AAAAAAAAAAA="},
                       {"$hpcckpt": "float", "value": "nan"}, {"$hpcckpt": 5}, {"$hpcckpt": "ndarray"}]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["phases", "bytes", "timeline",
                                                                                 "write", "plan", "kind", "a"]),
                                                                inner, max_size=3),
    max_leaves=6)
NASTY_DTYPES = st.sampled_from([np.dtype(d) for d in ("<f8", ">i4", "|u1", "|b1", "<c16", "<M8[ns]", "<U3", "|V7",
                                                     "|S5", [("a", "<f4"), ("b", "<i8", (2,))])])
NASTY_CODECS = st.sampled_from([{"id": "none"}, {"id": "blosc", "cname": "zstd", "clevel": 3, "shuffle": 1,
                                                 "blocksize": 0}, {"id": "zstd", "level": 1}, {"id": "lz4"}])


def _mutate(meta, data) -> str:
    """Apply one crafted change to the Metadata object ``meta`` (drawn from ``data``); a description of it."""
    what = data.draw(st.sampled_from(["step", "nranks", "created", "file", "value", "extra", "stats", "shape",
                                      "dtype", "kind", "codec", "chunk", "checksum", "rename"]))
    var = meta.variables[data.draw(st.sampled_from(sorted(meta.variables)))]
    if what in ("step", "nranks"):
        setattr(meta, what, data.draw(NASTY_INTS | st.none()))
    elif what == "created":
        meta.created = data.draw(NASTY_JSON)
    elif what == "file":
        meta.files[data.draw(st.integers(0, len(meta.files) - 1))] = data.draw(NASTY_JSON)
    elif what in ("value", "extra"):
        target = meta.values if what == "value" else meta.extra
        target[data.draw(st.sampled_from(sorted(target) + ["new"]))] = data.draw(NASTY_JSON)
    elif what == "stats":
        meta.extra.setdefault("stats", {})[data.draw(st.sampled_from(["phases", "bytes", "timeline"]))] = \
            data.draw(NASTY_JSON)
    elif what == "shape":
        var.shape = tuple(data.draw(st.lists(NASTY_INTS, max_size=3)))
    elif what == "dtype":
        var.dtype = data.draw(NASTY_DTYPES)
    elif what == "kind":
        var.kind = data.draw(st.sampled_from(["block", "ragged", "", "x"]))
    elif what == "codec":
        var.codec = data.draw(NASTY_CODECS)
    elif what in ("chunk", "checksum"):
        column = data.draw(st.sampled_from(["file", "offset", "nbytes", "start", "count", "checksum"]))
        values = getattr(var.chunks, column)
        k = data.draw(st.integers(0, max(0, np.size(values) - 1)))
        if column == "checksum":
            values[k] = data.draw(st.sampled_from(["0" * 16, "f" * 16, "", "xyz"]))
        elif np.size(values):
            flat = np.asarray(values).astype(object).ravel()
            flat[k] = data.draw(NASTY_INTS)
            setattr(var.chunks, column, flat.reshape(np.shape(values)))
    else:
        name = data.draw(st.sampled_from(["a\x00b", "", "hpcckpt.x", "f//u", "x" * 2000, "u.json"]))
        if data.draw(st.booleans()) or not meta.values:
            meta.variables[name] = meta.variables.pop(var.name)
        else:
            meta.values[name] = meta.values.pop(sorted(meta.values)[0])
    return what


@pytest.fixture(scope="module")
def fuzz_root(tmp_path_factory):
    """A root with one small version holding every kind of variable and value (several chunks each)."""
    path = str(tmp_path_factory.mktemp("fuzz") / "root")
    rec = np.zeros(4, dtype=[("x", "<f4"), ("id", "<i8")])
    state = {"u": hpcckpt.Block(np.arange(30.0).reshape(6, 5)), "p": hpcckpt.Ragged(rec),
             "z": hpcckpt.Block(np.ones((), np.float32)), "c": hpcckpt.Block(np.arange(40, dtype=np.int16)),
             "s": 3, "arr": np.arange(3), "t": {"a": [1, 2]}, "n": float("nan")}
    ck = hpcckpt.Checkpointer(path, comm=None, chunk_bytes=64, track_failures=False)
    ck.save(state, step=1)
    ck.close()
    return path


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_crafted_metadata_never_crashes_the_cli(fuzz_root, tmp_path_factory, data):
    """Every command answers crafted (but well-formed JSON) metadata with exit 0/1, never an internal error."""
    from hpcckpt.storage.metadata_file import read_metadata

    work = tmp_path_factory.mktemp("case")
    root = str(work / "root")
    shutil.copytree(fuzz_root, root)
    version = step_dir(root, 1)
    meta = read_metadata(version)
    changes = [_mutate(meta, data) for _ in range(data.draw(st.integers(1, 2)))]
    try:
        raw = meta.to_json_bytes()
    except (TypeError, ValueError, OverflowError, AttributeError):
        return  # a mutation the writer cannot even serialise: nothing to read back
    with open(os.path.join(version, "metadata.json"), "wb") as f:
        f.write(raw)
    for args in (["inspect", version], ["inspect", "--json", "--chunks", version], ["verify", version],
                 ["verify", root], ["export", version, str(work / "o.h5")], ["stats", version], ["ls", root],
                 ["ls", "--json", root], ["gc", "-n", root]):
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
            rc = cli.main(args)
        assert rc in (0, 1) and "internal error" not in err.getvalue(), (changes, args, err.getvalue())
    shutil.rmtree(work)


# --------------------------------------------------------------------------- interval / simulate

def test_interval_numbers(capsys):
    rc, out, err = run_cli(capsys, "interval", "--cost", "40s", "--mtbf", "12h")
    assert rc == 0, err
    c, m = 40.0, 12 * 3600.0
    for name, tau in (("Young", young(c, m)), ("Daly", daly(c, m))):
        line = next(line for line in out.splitlines() if line.startswith(name + " "))
        assert line.split()[2] == f"{tau:.0f}"
        waste = float(re.search(r"([\d.]+)%$", line).group(1))
        assert waste == pytest.approx(100 * expected_waste(tau, c, m, 0.0), abs=1e-3)
    assert round(young(c, m)) == 1859


def test_interval_bad_duration(capsys):
    rc, out, err = run_cli(capsys, "interval", "--cost", "forty", "--mtbf", "12h")
    assert rc == 2 and "bad duration" in err and "Traceback" not in err


def test_interval_multilevel_methods(capsys):
    from hpcckpt.policy import learned_levels, multilevel

    rc, out, err = run_cli(capsys, "interval", "--level-costs", "20s", "5m", "--level-mtbf", "7.5h", "30h",
                           "--work", "3d", "--method", "formula", "learned", "search")
    assert rc == 0, err
    config = multilevel.LevelConfig((20.0, 300.0), (20.0, 300.0), (1 / 27000, 1 / 108000), 3 * 86400.0)
    rows = {line.split("  ")[0]: line for line in out.splitlines()}
    for name, pattern in (("first-order (Benoit)", multilevel.formula_pattern(config)),
                          ("learned", learned_levels.predict(config)), ("search", multilevel.search(config))):
        waste = float(re.search(r"([\d.]+)%$", rows[name]).group(1))
        assert waste == pytest.approx(100 * (1 - config.work / pattern.makespan), abs=1e-3)
        assert ", ".join(map(str, pattern.counts)) in rows[name]


@pytest.mark.parametrize("args, message", [
    (("--level-costs", "20s", "5m"), "go together"),
    (("--level-costs", "20s", "5m", "--level-mtbf", "7h"), "same number of levels"),
    (("--level-costs", "20s", "--level-mtbf", "0"), "> 0"),
    ((), "give --cost and --mtbf"),
])
def test_interval_multilevel_bad_input(capsys, args, message):
    rc, out, err = run_cli(capsys, "interval", *args)
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1 and out == ""


def test_simulate_runs(capsys):
    rc, out, err = run_cli(capsys, "simulate", "--work", "1d", "--seeds", "2")
    assert rc == 0, err
    assert "daly (oracle)" in out


# --------------------------------------------------------------------------- as a user runs it

def run_module(*argv, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "hpcckpt", *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT_DIR)


def test_python_m_hpcckpt(root):
    proc = run_module("ls", root)
    assert proc.returncode == 0, proc.stderr
    assert "3 committed" in proc.stdout
    proc = run_module("verify", root)
    assert proc.returncode == 0 and proc.stdout.startswith("OK: ")
    flip_bit(os.path.join(step_dir(root, 0), PART), 0)
    proc = run_module("verify", root)
    assert proc.returncode == 1 and os.path.realpath(os.path.join(step_dir(root, 0), PART)) in proc.stdout


def test_python_m_hpcckpt_errors_are_one_line(root):
    path = add_partial(root)
    proc = run_module("inspect", path)
    assert_one_line_error(proc.returncode, proc.stderr, "metadata.json is missing")
    proc = run_module("verify", os.path.join(root, "nope"))
    assert_one_line_error(proc.returncode, proc.stderr, "no such checkpoint")
    proc = run_module("--help")
    assert proc.returncode == 0 and "interval" in proc.stdout and "verify" in proc.stdout


def test_gc_compact_dry_run_reports_what_the_real_run_removes(capsys, tmp_path):
    u = np.arange(1 << 16, dtype=np.float64)
    root = tmp_path / "ckpt"
    with hpcckpt.Checkpointer(root, incremental=True, track_failures=False, block_bytes=1 << 12) as ck:
        for step in (100, 200, 300):
            u[step] = -1.0
            ck.save({"u": hpcckpt.Block(u), "step": step}, step)
    rc, dry, _ = run_cli(capsys, "gc", root, "--keep", "1", "--compact", "-n")
    assert rc == 0 and "would compact  step-000000000300" in dry, dry
    would = sorted(line.split()[2] for line in dry.splitlines() if line.startswith("would remove"))
    rc, real, _ = run_cli(capsys, "gc", root, "--keep", "1", "--compact")
    removed = sorted(line.split()[1] for line in real.splitlines() if line.startswith("removed  "))
    assert rc == 0 and would == removed == ["step-000000000100", "step-000000000200"], (dry, real)
    with hpcckpt.open(root / "step-000000000300") as view:
        assert view.verify() == [] and np.array_equal(view.read("u"), u)


def test_ls_of_an_incremental_root_shows_kind_base_and_depth(capsys, tmp_path):
    u = np.arange(1 << 14, dtype=np.float64)
    root = tmp_path / "ckpt"
    with hpcckpt.Checkpointer(root, incremental=True, track_failures=False, block_bytes=1 << 12) as ck:
        for step in (1, 2):
            u[step] = -1.0
            ck.save({"u": hpcckpt.Block(u)}, step)
    rc, out, _ = run_cli(capsys, "ls", root)
    lines = out.splitlines()
    assert rc == 0 and lines[0].split()[-1] == "KIND", out
    assert lines[1].endswith("full") and lines[2].endswith("incremental, depth 1 on step-000000000001"), out
    rc, out, _ = run_cli(capsys, "ls", root, "--json")
    doc = json.loads(out)
    assert [v["incremental"] for v in doc["versions"]] == [
        {"kind": "full", "base": None, "depth": 0}, {"kind": "incremental", "base": "step-000000000001", "depth": 1}]


def test_ls_of_a_partial_version_says_it_is_partial(capsys, root):
    partial = os.path.join(root, "step-000000000099")
    os.makedirs(os.path.join(partial, "data"))
    rc, out, err = run_cli(capsys, "ls", partial)
    assert_one_line_error(rc, err, "partial version", "interrupted save", "hpcckpt gc")


def test_export_creates_missing_parent_directories(capsys, root, tmp_path):
    pytest.importorskip("h5py")
    out_path = tmp_path / "new" / "sub" / "out.h5"
    rc, out, err = run_cli(capsys, "export", root, out_path)
    assert rc == 0 and out_path.is_file() and out.startswith("OK: "), err


def test_output_into_a_closed_pipe_exits_0_without_a_traceback(tmp_path):
    path = tmp_path / "ck"
    hpcckpt.save({"u": hpcckpt.Block(np.arange(40_000.0))}, path, chunk_bytes=64)  # 5000 chunks: > a pipe's buffer
    here = REPO
    pipe = subprocess.run(f"set -o pipefail; {sys.executable} -m hpcckpt inspect --chunks {path} | head -c 1 >/dev/null",
                          shell=True, capture_output=True, text=True, executable="/bin/bash",
                          env=dict(os.environ, PYTHONPATH=here))
    assert pipe.returncode == 0 and "Traceback" not in pipe.stderr, (pipe.returncode, pipe.stderr)


# --------------------------------------------------------------------------- one output style

TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ"  # hpcckpt.core.humanize.format_time: UTC


def test_inspect_accepts_the_path_of_a_metadata_json(capsys, root):
    rc, by_dir, _ = run_cli(capsys, "inspect", step_dir(root, 5))
    rc2, by_file, err = run_cli(capsys, "inspect", os.path.join(step_dir(root, 5), "metadata.json"))
    assert rc == rc2 == 0, err
    assert by_file == by_dir
    rc, out, _ = run_cli(capsys, "inspect", os.path.join(step_dir(root, 5), "metadata.json"), "--json")
    assert rc == 0 and json.loads(out)["step"] == 5
    rc, out, _ = run_cli(capsys, "verify", os.path.join(step_dir(root, 5), "metadata.json"))
    assert rc == 0 and out.startswith("OK: ")
    rc, _, err = run_cli(capsys, "inspect", os.path.join(step_dir(root, 5), PART))  # another file: not a version
    assert_one_line_error(rc, err, "not a directory")


def test_times_are_utc_in_one_format_and_json_keeps_the_stored_form(capsys, root):
    with hpcckpt.open(step_dir(root, 5)) as view:
        stored = view.meta.created  # ISO 8601 with +00:00, as format.md writes it
    shown = stored.replace("T", " ").replace("+00:00", "Z")
    rc, out, _ = run_cli(capsys, "ls", root)
    assert rc == 0 and re.search(rf"^\s+5\s+step-000000000005\s+committed\s+.*\s{re.escape(shown)}\s", out, re.M)
    rc, out, _ = run_cli(capsys, "inspect", step_dir(root, 5))
    assert re.search(rf"^created\s+{TIME}$", out, re.M) and shown in out
    rc, out, _ = run_cli(capsys, "ls", root, "--json")
    assert json.loads(out)["versions"][1]["created"] == stored
    rc, out, _ = run_cli(capsys, "inspect", step_dir(root, 5), "--json")
    assert json.loads(out)["created"] == stored


@pytest.mark.parametrize("argv", [("ls", "{root}"), ("inspect", "{v5}"), ("gc", "{root}", "--keep", "1", "-n"),
                                  ("stats", "{root}"), ("interval", "--cost", "40s", "--mtbf", "12h"),
                                  ("simulate", "--work", "1d", "--seeds", "2")])
def test_every_table_has_one_upper_case_header_row(capsys, root, argv):
    rc, out, err = run_cli(capsys, *(a.format(root=root, v5=step_dir(root, 5)) for a in argv))
    assert rc == 0, err
    lines = out.splitlines()
    headers = [i for i, line in enumerate(lines) if re.fullmatch(r"\s*[A-Z][A-Z .#]*[A-Z#.]", line)]
    assert headers, out
    for i in headers:  # each header is followed by rows aligned under its columns
        starts = [m.start() for m in re.finditer(r"(?<!\S)\S+(?: \S+)*", lines[i])]
        row = lines[i + 1]
        assert len(row) >= starts[-1], (lines[i], row)
        assert all(k == 0 or row[k - 1] == " " or lines[i][k - 1] == " " for k in starts)


def test_durations_in_one_style(capsys, root):
    unit = r"[\d.]+(?:e[+-]\d+)?(?:us|ms|s|m|h|d)"
    rc, out, _ = run_cli(capsys, "stats", root)
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["plan"], ["write"])]
    assert rows and all(re.fullmatch(unit, cell) for row in rows for cell in row[1:4])
    rc, out, _ = run_cli(capsys, "interval", "--cost", "10m", "--mtbf", "1h", "--restart", "5m")
    assert "C = 10m, MTBF M = 60m, restart R = 5m" in out
    assert re.search(rf"^Young\s+{unit}\s+2078\s", out, re.M)
    add_partial(root)
    rc, out, _ = run_cli(capsys, "gc", root)
    assert re.search(rf"partial, but modified {unit} ago", out)


def test_simulate_progress_only_on_a_terminal_or_when_asked(capsys, monkeypatch):
    argv = ("simulate", "--work", "1d", "--seeds", "4")
    rc, plain, err = run_cli(capsys, *argv)
    assert rc == 0 and err == ""  # not a terminal: nothing on stderr, stdout as always
    rc, asked, err = run_cli(capsys, *argv, "--progress")
    assert rc == 0 and asked == plain and "simulate:" in err and "/4 " in err
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    rc, tty, err = run_cli(capsys, *argv)
    assert rc == 0 and tty == plain and "simulate:" in err and "/4 " in err
    rc, _, err = run_cli(capsys, *argv, "--no-progress")
    assert rc == 0 and err == ""


def test_simulate_markdown_is_the_table_of_the_docs(capsys):
    rc, out, _ = run_cli(capsys, "simulate", "--work", "1d", "--seeds", "2", "--markdown")
    assert rc == 0 and "| policy | interval | mean makespan |" in out and "|---|" in out
    rc, out, _ = run_cli(capsys, "simulate", "--work", "1d", "--seeds", "2")
    assert "|" not in out and re.search(r"^POLICY\s+INTERVAL\s+MEAN MAKESPAN", out, re.M)


def test_python_m_hpcckpt_simulate_prints_no_progress_into_a_pipe():
    proc = run_module("simulate", "--work", "1d", "--seeds", "3")
    assert proc.returncode == 0 and proc.stderr == "" and "daly (oracle)" in proc.stdout
