"""Tracked output files (docs/files.md), serially: records, incremental blocks, exact rollback, refusals.

The pure part (hpcckpt.root.file_manifest) is tested with hypothesis; the rest
drives a Checkpointer through random appends and in-place rewrites and
checks that restoring any kept version gives every file's exact bytes at
that save, and that a missing or replaced file is refused with no file
touched.
"""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import hpcckpt
from hpcckpt import Block, CheckpointError
from hpcckpt.mpi.collective import SerialComm
from hpcckpt.errors import CorruptCheckpointError
from hpcckpt.root.files import ROLLBACK_SUFFIX
from hpcckpt.root.file_manifest import Record, manifest, parse_manifest, patterns, reuse

SEED = int(os.environ.get("HPCCKPT_TEST_SEED", "0"))
hexes = st.text("0123456789abcdef", min_size=32, max_size=32)
paths = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), min_size=1, max_size=8)


# --------------------------------------------------------------------------- pure part

@given(st.lists(hexes, max_size=20), st.lists(st.tuples(hexes, st.sampled_from(["@a/x", "@b/y"]),
                                                        st.integers(0, 10**6)), max_size=20))
def test_reuse_keeps_exactly_the_blocks_with_the_same_hash_at_the_same_index(hashes, previous):
    got = reuse(hashes, previous)
    assert len(got) == len(hashes)
    for i, (h, where) in enumerate(zip(hashes, got)):
        if i < len(previous) and previous[i][0] == h:
            assert where == (previous[i][1], previous[i][2])
        else:
            assert where is None


records_st = st.lists(st.one_of(
    st.builds(lambda p, r: Record(path=p, rank=r, mode="absent"), paths, st.integers(0, 9)),
    st.builds(lambda p, r, size, tb, tail: Record(path=p, rank=r, mode="append", size=size, tail_bytes=tb, tail=tail),
              paths, st.integers(0, 9), st.integers(0, 10**9), st.integers(1, 2**20),
              st.text("0123456789abcdef", min_size=16, max_size=16)),
    st.builds(lambda p, r, bb, n, blob: Record(path=p, rank=r, mode="inplace", size=bb * n, block_bytes=bb,
                                               blocks=[("0" * 32, blob, k * bb) for k in range(n)]),
              paths, st.integers(0, 9), st.integers(1, 4096), st.integers(0, 5),
              st.sampled_from(["tracked/r000000.bin", "@step-000000000001/tracked/r000002.bin"]))),
    unique_by=lambda r: r.path)


@given(records_st)
def test_manifest_round_trips(records):
    assert parse_manifest(manifest(records)) == records


@settings(max_examples=200)
@given(records_st.filter(bool), st.data())
def test_a_damaged_manifest_is_refused(records, data):
    doc = manifest(records)
    entry = data.draw(st.sampled_from(doc["entries"]))
    key = data.draw(st.sampled_from(sorted(entry)))
    entry[key] = data.draw(st.sampled_from([None, -1, "", 2**70, [], {}]))
    with pytest.raises(CorruptCheckpointError):
        parse_manifest(doc)


def test_manifest_refusals():
    good = manifest([Record(path="a", rank=0, mode="inplace", size=10, block_bytes=4,
                            blocks=[("0" * 32, "tracked/r000000.bin", 0)] * 3)])
    for bad in ({**good, "blobs": ["../escape"]}, {**good, "blobs": ["/abs"]}, {**good, "version": 2},
                {**good, "extra": 1}, {**good, "entries": [good["entries"][0]] * 2},
                {**good, "entries": [{**good["entries"][0], "size": 13}]}):  # 13 bytes need 4 blocks
        with pytest.raises(CorruptCheckpointError):
            parse_manifest(bad)
    with pytest.raises(CheckpointError, match="recorded by rank 0 and rank 1"):
        manifest([Record(path="a", rank=0, mode="absent"), Record(path="a", rank=1, mode="absent")])


@pytest.mark.parametrize("files, kwargs, message", [
    (["x"], {"mode": "rewrite"}, "mode"), ([""], {}, "non-empty"), ([3], {}, "non-empty"),
    (["log.{step}"], {}, "placeholder"), (["x"], {"block_bytes": 0}, "block_bytes"),
    ({"x": "sometimes"}, {}, "mode")])
def test_bad_registrations_are_refused(files, kwargs, message):
    with pytest.raises(CheckpointError, match=message):
        patterns(files, **kwargs)


# --------------------------------------------------------------------------- with a Checkpointer

def state(step):
    return {"u": Block(np.full(4, float(step))), "step": step}


def template():
    return {"u": Block(np.zeros(4)), "step": None}


def snapshot(paths):
    return {p: (open(p, "rb").read() if os.path.exists(p) else None) for p in paths}


class App:
    """An application writing a log (append-only), a binary series rewritten in place, and per-step files."""

    def __init__(self, workdir, rng):
        self.dir, self.rng = workdir, rng
        self.log = os.path.join(workdir, "log.txt")
        self.series = os.path.join(workdir, "series.bin")
        self.late = os.path.join(workdir, "late.txt")  # created only after a few steps: absent before
        with open(self.series, "wb") as f:
            f.write(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40000))))

    def paths(self):
        return [self.log, self.series, self.late] + sorted(
            os.path.join(self.dir, n) for n in os.listdir(self.dir) if n.startswith("out-"))

    def step(self, k):
        with open(self.log, "a") as f:
            f.write(f"step {k} " + "x" * self.rng.randrange(0, 3000) + "\n")
        size = os.path.getsize(self.series)
        with open(self.series, "r+b") as f:
            for _ in range(self.rng.randrange(0, 4)):
                at = self.rng.randrange(size + 1)
                f.seek(at)
                f.write(bytes([k % 256]) * self.rng.randrange(1, 5000))  # may grow the file
            if self.rng.random() < 0.2:
                f.truncate(self.rng.randrange(1, os.path.getsize(self.series) + 1))
        with open(os.path.join(self.dir, f"out-{k:03d}.csv"), "w") as f:
            f.write(f"{k},{k * k}\n")
        if k >= 3:
            with open(self.late, "a") as f:
                f.write(f"{k}\n")


def tracked(root, workdir, **kw):
    ck = hpcckpt.Checkpointer(root, comm=SerialComm(), files=[os.path.join(workdir, "log.txt"),
                                                              os.path.join(workdir, "late.txt"),
                                                              os.path.join(workdir, "out-*.csv")], **kw)
    return ck.track_files(os.path.join(workdir, "series.bin"), mode="inplace", block_bytes=1024)


@pytest.mark.parametrize("seed", range(SEED, SEED + 3))
def test_restoring_any_kept_version_gives_every_files_exact_bytes(tmp_path, seed):
    rng = random.Random(seed)
    work = tmp_path / "work"
    work.mkdir()
    app = App(str(work), rng)
    root = str(tmp_path / "ck")
    ck = tracked(root, str(work), keep=3)
    snaps, stored = {}, []
    for k in range(1, 9):
        app.step(k)
        result = ck.save(state(k), k)
        snaps[k] = snapshot(app.paths())
        stored.append(result.path)
    kept = ck.steps()
    ck.close()
    assert kept[-3:] == [6, 7, 8]  # keep=3, plus the older versions whose stored blocks these reference
    for k in sorted(rng.sample(kept, 4), reverse=True):  # append-only files can only go back in time
        ck2 = tracked(root, str(work))
        got = ck2.restore(template(), step=k)
        assert got["step"] == k
        now = snapshot(app.paths())
        for path, content in snaps[k].items():
            if os.path.basename(path).startswith("out-") and content is None:
                continue
            assert now[path] == content, (k, path)
        # a per-step file of a later step matched the glob after the save: it is left alone, never deleted
        assert all(now[p] is not None for p in now if os.path.basename(p).startswith("out-"))
        ck2.close()
    ck3 = tracked(root, str(work))
    with pytest.raises(CheckpointError, match="shorter"):  # the log's later lines are gone: refused, not faked
        ck3.restore(template(), step=8)
    ck3.close()


def test_only_changed_blocks_are_stored_and_references_survive_retention(tmp_path):
    work = tmp_path / "w"
    work.mkdir()
    series = work / "s.bin"
    series.write_bytes(bytes(range(256)) * 64)  # 16 KiB: 16 blocks of 1 KiB
    root = str(tmp_path / "ck")
    ck = hpcckpt.Checkpointer(root, comm=SerialComm(), keep=1).track_files(str(series), "inplace", 1024)
    ck.save(state(1), 1)
    contents = {1: series.read_bytes()}
    for k in (2, 3):
        with open(series, "r+b") as f:
            f.seek(1024 * k + 5)
            f.write(b"\xff" * 10)
        ck.save(state(k), k)
        contents[k] = series.read_bytes()
        tracked_blob = os.path.join(ck.last_result.path, "tracked", "r000000.bin")
        assert os.path.getsize(tracked_blob) == 1024  # one changed block stored, 15 referenced
    assert ck.steps() == [1, 2, 3]  # keep=1, but step 3 references blocks stored by steps 1 and 2
    ck.close()
    series.write_bytes(b"garbage")
    ck = hpcckpt.Checkpointer(root, comm=SerialComm(), files={str(series): "inplace"})
    ck.restore(template())
    assert series.read_bytes() == contents[3]
    ck.close()


def test_missing_or_replaced_files_are_refused_and_nothing_is_touched(tmp_path):
    work = tmp_path / "w"
    work.mkdir()
    log, series = work / "log", work / "series"
    log.write_text("one\n")
    series.write_bytes(b"a" * 3000)
    root = str(tmp_path / "ck")
    files = {str(log): "append", str(series): "inplace"}
    ck = hpcckpt.Checkpointer(root, comm=SerialComm(), files=files)
    ck.save(state(1), 1)
    ck.close()
    later = {"log": "one\ntwo\n", "series": b"b" * 3000}

    def reset():
        for p in (log, series):
            if p.is_dir():
                p.rmdir()
            elif p.exists():
                p.unlink()
        log.write_text(later["log"])
        series.write_bytes(later["series"])

    cases = {
        "missing": lambda: series.unlink(),
        "a directory": lambda: (series.unlink(), series.mkdir()),
        "log rewritten": lambda: log.write_text("ONE\ntwo\n"),
        "log shorter": lambda: log.write_text("on"),
    }
    for name, damage in cases.items():
        reset()
        damage()
        before = {p: (p.read_bytes() if p.is_file() else "dir" if p.is_dir() else None) for p in (log, series)}
        ck = hpcckpt.Checkpointer(root, comm=SerialComm(), files=files)
        with pytest.raises(CheckpointError, match="missing|replaced|rewritten|shorter"):
            ck.restore(template())
        after = {p: (p.read_bytes() if p.is_file() else "dir" if p.is_dir() else None) for p in (log, series)}
        assert after == before, name
        assert not [n for n in os.listdir(work) if n.endswith(ROLLBACK_SUFFIX)], name  # no temporary copy left
        ck.close()
    reset()
    ck = hpcckpt.Checkpointer(root, comm=SerialComm(), files=files)
    ck.restore(template())
    assert log.read_text() == "one\n" and series.read_bytes() == b"a" * 3000
    ck.close()


def test_a_checkpointer_without_tracked_files_leaves_files_alone(tmp_path):
    log = tmp_path / "log"
    log.write_text("a\n")
    root = str(tmp_path / "ck")
    ck = hpcckpt.Checkpointer(root, comm=SerialComm(), files=str(log))
    ck.save(state(1), 1)
    ck.close()
    log.write_text("a\nb\n")
    plain = hpcckpt.Checkpointer(root, comm=SerialComm())
    plain.restore(template())
    assert log.read_text() == "a\nb\n"
    plain.close()


def test_a_damaged_stored_block_is_refused(tmp_path):
    series = tmp_path / "s"
    series.write_bytes(b"x" * 5000)
    root = str(tmp_path / "ck")
    ck = hpcckpt.Checkpointer(root, comm=SerialComm(), files={str(series): "inplace"})
    path = ck.save(state(1), 1).path
    ck.close()
    series.write_bytes(b"y" * 5000)
    blob = os.path.join(path, "tracked", "r000000.bin")
    data = bytearray(open(blob, "rb").read())
    data[100] ^= 1
    open(blob, "wb").write(bytes(data))
    ck = hpcckpt.Checkpointer(root, comm=SerialComm(), files={str(series): "inplace"})
    with pytest.raises(CheckpointError, match="damaged"):
        ck.restore(template())
    assert series.read_bytes() == b"y" * 5000
    ck.close()


@pytest.mark.parametrize("engine", [{"asynchronous": True}, {"asynchronous": True, "incremental": True},
                                    {"local_dir": "local"}])
def test_tracked_files_roll_back_with_asynchronous_and_node_local_saves(tmp_path, engine):
    """The files are recorded at the save call (the application goes on writing while the data are written in
    the background), and a restore brings them back to that content."""
    log, field = tmp_path / "out.log", tmp_path / "field.bin"
    options = {**engine, **({"local_dir": str(tmp_path / "local")} if "local_dir" in engine else {})}
    ck = hpcckpt.Checkpointer(str(tmp_path / "ck"), comm=SerialComm(), track_failures=False, handle_signals=False,
                              files={str(log): "append", str(field): "inplace"}, **options)
    u = np.arange(1000.0)
    expected = {}
    for step in (1, 2, 3):
        with open(log, "a") as f:
            f.write(f"step {step}\n")
        field.write_bytes(bytes([step]) * (3000 + 700 * step))
        u += 1
        ck.save({"u": hpcckpt.Block(u)}, step)
        expected = {"log": log.read_bytes(), "field": field.read_bytes(), "u": u.copy()}
        with open(log, "a") as f:  # written after the call, while the save may still be in flight
            f.write("after the checkpoint\n")
        field.write_bytes(b"lost" * 10)
    ck.close()
    ck = hpcckpt.Checkpointer(str(tmp_path / "ck"), comm=SerialComm(), track_failures=False, handle_signals=False,
                              files={str(log): "append", str(field): "inplace"}, **options)
    got = np.zeros_like(u)
    ck.restore({"u": hpcckpt.Block(got)})
    ck.close()
    assert np.array_equal(got, expected["u"])
    assert log.read_bytes() == expected["log"] and field.read_bytes() == expected["field"]


def spec_rebuild(version_dir: str) -> dict:
    """docs/format.md section 9 alone (json + xxhash, no hpcckpt): each record's content, or its length and tail."""
    import json

    import xxhash

    doc = json.loads(open(os.path.join(version_dir, "metadata.json"), "rb").read())
    files = doc["extra"]["files"]
    assert files["version"] == 1
    out = {}
    for e in files["entries"]:
        if e["mode"] == "inplace":
            parts = []
            for i, (f, off, h) in enumerate(zip(e["blocks"]["file"], e["blocks"]["offset"], e["blocks"]["hash"])):
                blob = files["blobs"][f]
                path = (os.path.join(os.path.dirname(version_dir), *blob[1:].split("/", 1)) if blob.startswith("@")
                        else os.path.join(version_dir, blob))
                n = min(e["block_bytes"], e["size"] - i * e["block_bytes"])
                with open(path, "rb") as fh:
                    fh.seek(off)
                    data = fh.read(n)
                assert xxhash.xxh3_128_hexdigest(data) == h
                parts.append(data)
            out[e["path"]] = b"".join(parts)
        elif e["mode"] == "append":
            out[e["path"]] = (e["size"], e["tail_bytes"], e["tail"])
        else:
            out[e["path"]] = None
    return out


def test_format_section_9_alone_rebuilds_every_version(tmp_path):
    import xxhash

    rng = random.Random(SEED)
    work = tmp_path / "work"
    work.mkdir()
    app = App(str(work), rng)
    ck = tracked(str(tmp_path / "ck"), str(work))
    for k in range(1, 6):
        app.step(k)
        path = ck.save(state(k), k).path
        snap = snapshot(app.paths())
        for p, got in spec_rebuild(path).items():
            if isinstance(got, tuple):
                size, tail_bytes, tail = got
                assert size == len(snap[p])
                assert format(xxhash.xxh3_64_intdigest(snap[p][max(0, size - tail_bytes):size]), "016x") == tail
            else:
                assert got == snap[p], (k, p)
    ck.close()


def test_a_literal_path_absent_at_the_version_is_removed_and_a_new_glob_match_is_kept(tmp_path):
    late, early = tmp_path / "late.log", tmp_path / "out-1.csv"
    early.write_text("1\n")
    root = str(tmp_path / "ck")
    files = [str(late), str(tmp_path / "out-*.csv")]
    ck = hpcckpt.Checkpointer(root, comm=SerialComm(), files=files)
    ck.save(state(1), 1)
    ck.close()
    late.write_text("written after the checkpoint\n")
    (tmp_path / "out-2.csv").write_text("2\n")
    ck = hpcckpt.Checkpointer(root, comm=SerialComm(), files=files)
    ck.restore(template())
    ck.close()
    assert not late.exists() and early.read_text() == "1\n" and (tmp_path / "out-2.csv").read_text() == "2\n"
