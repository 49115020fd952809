"""The conformance suite of a Storage: what the save and load paths rely on, checked on one process.

Subclass it in a pytest module and define ``make(tmp_path)``, which returns
``(storage, base directory)``::

    class TestMine(StorageTests):
        def make(self, tmp_path):
            return MyStorage(), "/somewhere"

The tests follow the call order of :class:`hpcckpt.storage.Storage`: versions
made exclusively, files appended and read back exactly (hashes included),
metadata replaced atomically and read bounded, names confined to their
version, and a whole ``hpcckpt.save`` / ``hpcckpt.load`` round trip over it,
with a damaged file refused.  Then the operations of a Checkpointer root:
looking at a path without opening it, making, renaming, linking and removing
names (each refusing what it does not do), a bounded head read, a held file
that knows whether its name is still its own, and a root's whole bookkeeping
(versions, retention, the writer lock, the halt file, the histories,
compaction) over the storage.  Last the files the node-local levels write in
place: a name taken over from a stale attempt (never through a link),
positional writes, truncation, copies from a file being read, reads that stop
where the file ends, and a best-effort removal of a tree.

Objects a backend may not have at all (symbolic links, FIFOs) are planted
through the back door ``plant(storage, path, kind)``, which a subclass
defines where it can (the default skips those tests, as zarr's StoreTests
skip what a store does not support).
"""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from hpcckpt.core.checksum import hexdigest, new_hasher
from hpcckpt.errors import CheckpointError, CorruptCheckpointError
from hpcckpt.core.names import DATA_DIR, METADATA_FILE, rank_file
from hpcckpt.storage.base import DIRECTORY, FILE, LINK, Storage


class StorageTests:
    """Conformance tests every Storage must pass (pytest collects them from subclasses)."""

    def make(self, tmp_path) -> tuple[Storage, str]:
        raise NotImplementedError

    def plant(self, storage: Storage, path: str, kind: str, target: str | None = None) -> None:
        """Put an object of ``kind`` (``"link"`` to ``target``, ``"fifo"``) at ``path`` behind the storage's
        back; skips the test where the backend has no such objects."""
        pytest.skip(f"{type(storage).__name__} has no {kind}s")

    def _file(self, storage: Storage, path: str, data: bytes = b"abcde") -> str:
        handle = storage.create(path)
        storage.append(handle, data)
        storage.close(handle, fsync=False)
        return path

    def _version(self, tmp_path, name: str = "v1"):
        storage, base = self.make(tmp_path)
        directory = os.path.join(base, name)
        storage.make_version(directory)
        return storage, base, directory

    def test_versions_are_made_exclusively(self, tmp_path):
        storage, base, directory = self._version(tmp_path)
        assert storage.exists(directory) and storage.exists(os.path.join(directory, DATA_DIR))
        assert DATA_DIR in storage.listdir(directory)
        with pytest.raises(FileExistsError):
            storage.make_version(directory)

    def test_appended_bytes_read_back_exactly_with_their_hashes(self, tmp_path):
        storage, _, directory = self._version(tmp_path)
        path = os.path.join(directory, rank_file(0))
        pieces = [np.arange(n, dtype=np.uint8) for n in (1, 1000, 70_000)]
        handle = storage.create(path)
        hashers = [new_hasher() for _ in pieces]
        total = 0
        for piece, hasher in zip(pieces, hashers):
            total += storage.append(handle, piece, hasher)
        storage.close(handle, fsync=True)
        assert total == sum(p.nbytes for p in pieces)
        with pytest.raises(FileExistsError):
            storage.create(path)
        handle, size = storage.open_read(path)
        try:
            assert size == total
            out = np.empty(total, np.uint8)
            check = [new_hasher() for _ in pieces]
            storage.read_segments(handle, 0, out, path, [(p.nbytes, h) for p, h in zip(pieces, check)])
            assert np.array_equal(out, np.concatenate(pieces))
            assert [hexdigest(h) for h in check] == [hexdigest(h) for h in hashers]
            part = np.empty(10, np.uint8)
            storage.read_segments(handle, 1001, part, path, [(10, None)])
            assert np.array_equal(part, pieces[2][:10])
            with pytest.raises(CorruptCheckpointError, match="truncated"):
                storage.read_segments(handle, total - 5, np.empty(10, np.uint8), path, [(10, None)])
        finally:
            storage.close_read(handle)

    def test_metadata_is_replaced_atomically_and_read_bounded(self, tmp_path):
        storage, _, directory = self._version(tmp_path)
        path = os.path.join(directory, METADATA_FILE)
        with pytest.raises(FileNotFoundError):
            storage.read_file(path, 100)
        storage.atomic_write(path, b"x" * 50)
        storage.atomic_write(path, b"new", fsync=False)
        assert storage.read_file(path, 100) == b"new"
        storage.atomic_write(path, b"y" * 101)
        with pytest.raises(CorruptCheckpointError):
            storage.read_file(path, 100)
        storage.sync_directory(directory)
        with pytest.raises(FileNotFoundError):
            storage.open_read(os.path.join(directory, DATA_DIR, "absent.bin"))

    def test_names_stay_inside_their_version(self, tmp_path):
        storage, base, directory = self._version(tmp_path)
        assert storage.resolve(directory, rank_file(3)).endswith(rank_file(3))
        for bad in ("../v2/data/x.bin", "/etc/passwd", "data/../../x"):
            with pytest.raises(CheckpointError):
                storage.resolve(directory, bad)
        other = os.path.join(base, "v0")
        storage.make_version(other)
        with pytest.raises(CorruptCheckpointError, match="not a committed"):
            storage.resolve(directory, "@v0/" + rank_file(0))
        storage.atomic_write(os.path.join(other, METADATA_FILE), b"{}")
        assert storage.resolve(directory, "@v0/" + rank_file(0)).endswith(os.path.join("v0", rank_file(0)))

    def test_remove_takes_the_whole_version(self, tmp_path):
        storage, base, directory = self._version(tmp_path)
        handle = storage.create(os.path.join(directory, rank_file(0)))
        storage.append(handle, b"abc")
        storage.close(handle, fsync=False)
        storage.remove(directory)
        assert not storage.exists(directory) and not storage.exists(os.path.join(directory, rank_file(0)))
        storage.remove(directory)  # absent: nothing to do

    def test_a_whole_save_and_load_round_trip(self, tmp_path):
        import hpcckpt

        storage, base = self.make(tmp_path)
        path = os.path.join(base, "ck")
        u = np.arange(5000, dtype=np.float64).reshape(50, 100)
        p = np.arange(30, dtype=np.int32).reshape(10, 3)
        hpcckpt.save({"u": hpcckpt.Block(u), "p": hpcckpt.Ragged(p), "t": 7}, path, storage=storage,
                     chunk_bytes=4096, codec="zstd")
        got = hpcckpt.load({"u": hpcckpt.Block(np.zeros((50, 100))), "p": hpcckpt.Ragged(), "t": None}, path,
                           storage=storage)
        assert np.array_equal(got["u"].local, u) and np.array_equal(got["p"].local, p) and got["t"] == 7
        with hpcckpt.open(path, storage=storage) as view:
            assert view.verify() == [] and np.array_equal(view.read("u", (slice(10, 20), slice(5, 9))), u[10:20, 5:9])
        with pytest.raises(CheckpointError, match="already holds"):
            hpcckpt.save({"t": 8}, path, storage=storage)
        hpcckpt.save({"u": hpcckpt.Block(u + 1)}, path, storage=storage, overwrite=True, chunk_bytes=4096)
        data = os.path.join(path, rank_file(0))
        handle, size = storage.open_read(data)
        storage.close_read(handle)
        storage.remove(data)
        short = storage.create(data)
        storage.append(short, np.zeros(size - 8, np.uint8))
        storage.close(short, fsync=False)
        with pytest.raises(CorruptCheckpointError):
            hpcckpt.load({"u": hpcckpt.Block(np.zeros((50, 100)))}, path, storage=storage)

    # ----------------------------------------------------------------- root
    def test_stat_looks_without_opening_and_tells_objects_apart(self, tmp_path):
        storage, base, directory = self._version(tmp_path)
        path = self._file(storage, os.path.join(directory, rank_file(0)))
        st = storage.stat(path)
        assert (st.kind, st.size) == (FILE, 5) and storage.is_file(path) and not storage.is_directory(path)
        assert storage.stat(directory).kind == DIRECTORY and storage.is_directory(directory)
        assert storage.stat(os.path.join(directory, "absent")) is None
        assert storage.stat(os.path.join(directory, "absent", "below")) is None
        with pytest.raises(NotADirectoryError):
            storage.stat(os.path.join(path, "below-a-file"))
        assert not storage.is_file(os.path.join(path, "below-a-file"))
        assert not storage.is_file(os.path.join(directory, "absent"))
        storage.atomic_write(path, b"other", fsync=False)  # the same size, another object
        assert storage.stat(path).identity != st.identity and storage.stat(path).size == 5
        assert storage.realpath(os.path.join(base, ".", "v1", "..", "v1")) == storage.realpath(directory)

    def test_make_directories_makes_parents_once_and_refuses_a_file(self, tmp_path):
        storage, base = self.make(tmp_path)
        deep = os.path.join(base, "a", "b", "c")
        storage.make_directories(deep)
        storage.make_directories(deep)  # a directory already: nothing to do
        assert storage.is_directory(deep) and storage.listdir(os.path.join(base, "a")) == ["b"]
        self._file(storage, os.path.join(deep, "f"))
        with pytest.raises(FileExistsError):
            storage.make_directories(os.path.join(deep, "f"))

    def test_replace_renames_in_one_step_and_link_never_replaces(self, tmp_path):
        storage, base, directory = self._version(tmp_path)
        a = self._file(storage, os.path.join(directory, "a"), b"old")
        b = self._file(storage, os.path.join(directory, "b"), b"new")
        storage.replace(b, a)
        assert storage.read_file(a, 10) == b"new" and not storage.exists(b)
        with pytest.raises(FileNotFoundError):
            storage.replace(b, a)
        storage.link(a, b)
        assert storage.read_file(b, 10) == b"new" and storage.stat(b).identity == storage.stat(a).identity
        c = self._file(storage, os.path.join(directory, "c"), b"ccc")
        with pytest.raises(FileExistsError):
            storage.link(c, a)
        assert storage.read_file(a, 10) == b"new"
        storage.remove_file(b)
        assert storage.read_file(a, 10) == b"new"  # the other name keeps the file
        with pytest.raises(FileNotFoundError):
            storage.link(b, os.path.join(directory, "d"))
        moved = os.path.join(base, "v2")
        storage.replace(directory, moved)
        assert storage.read_file(os.path.join(moved, "a"), 10) == b"new" and not storage.exists(directory)

    def test_removals_take_only_what_they_name(self, tmp_path):
        storage, base, directory = self._version(tmp_path)
        path = self._file(storage, os.path.join(directory, rank_file(0)))
        data = os.path.join(directory, DATA_DIR)
        with pytest.raises(OSError):
            storage.remove_file(data)
        assert storage.is_directory(data)
        with pytest.raises(OSError) as full:
            storage.remove_directory(data)
        assert full.value.errno in (errno.ENOTEMPTY, errno.EEXIST) and storage.is_file(path)
        with pytest.raises(NotADirectoryError):
            storage.remove_directory(path)
        with pytest.raises(OSError):
            storage.remove_tree(path)
        assert storage.is_file(path)
        storage.remove_file(path)
        with pytest.raises(FileNotFoundError):
            storage.remove_file(path)
        storage.remove_directory(data)
        with pytest.raises(FileNotFoundError):
            storage.remove_directory(data)
        self._file(storage, os.path.join(directory, "x"))
        storage.make_directories(os.path.join(directory, "d", "e"))
        storage.remove_tree(directory)
        assert not storage.exists(directory) and storage.is_directory(base)
        storage.remove_tree(directory)  # absent: nothing to do

    def test_read_head_reads_at_most_what_is_asked(self, tmp_path):
        storage, _, directory = self._version(tmp_path)
        path = self._file(storage, os.path.join(directory, "halt"), b"first line\nsecond")
        assert storage.read_head(path, 5) == b"first"
        assert storage.read_head(path, 1000) == b"first line\nsecond"
        with pytest.raises(FileNotFoundError):
            storage.read_head(os.path.join(directory, "absent"), 10)
        with pytest.raises(CorruptCheckpointError, match="directory"):
            storage.read_head(os.path.join(directory, DATA_DIR), 10)

    def test_a_held_file_knows_whether_its_name_is_still_its_own(self, tmp_path):
        storage, _, directory = self._version(tmp_path)
        path = os.path.join(directory, ".lock")
        handle = storage.create(path)
        try:
            storage.append(handle, b"{}")
            storage.sync(handle)
            assert storage.names_handle(path, handle) and storage.read_file(path, 10) == b"{}"
            storage.replace(path, path + ".aside")
            assert not storage.names_handle(path, handle)
            storage.atomic_write(path, b"{}")  # someone else's file under the name
            assert not storage.names_handle(path, handle)
            storage.replace(path + ".aside", path)
            assert storage.names_handle(path, handle)
        finally:
            storage.close(handle, fsync=False)

    def test_links_and_fifos_are_seen_for_what_they_are(self, tmp_path):
        storage, base, directory = self._version(tmp_path)
        target = self._file(storage, os.path.join(directory, "target"))
        link, fifo, dir_link = (os.path.join(base, n) for n in ("link", "fifo", "dir-link"))
        self.plant(storage, link, "link", target)
        self.plant(storage, dir_link, "link", directory)
        self.plant(storage, fifo, "fifo")
        st = storage.stat(link)
        assert st.kind == LINK and st.target == target and storage.stat(link, follow=True).kind == FILE
        assert storage.is_directory(dir_link) and storage.realpath(dir_link) == storage.realpath(directory)
        assert storage.stat(fifo).kind == "fifo" and storage.stat(fifo).describe() == "a FIFO"
        with pytest.raises(CorruptCheckpointError, match="FIFO"):
            storage.read_head(fifo, 10)  # refused, never waiting for a writer
        with pytest.raises(OSError):
            storage.remove_tree(dir_link)  # a link to a tree is not the tree
        storage.replace(link, os.path.join(base, "moved"))  # the link itself moves
        assert storage.stat(os.path.join(base, "moved")).kind == LINK and storage.read_file(target, 10) == b"abcde"
        storage.remove_file(os.path.join(base, "moved"))
        storage.remove_file(fifo)
        assert storage.read_file(target, 10) == b"abcde" and not storage.exists(fifo)

    def test_a_roots_versions_live_in_it(self, tmp_path):
        """Listing, retention that keeps what a kept version references, compaction and gc, over the storage."""
        import hpcckpt
        from hpcckpt.incremental.chain import compact
        from hpcckpt.root.catalog import current, gc, list_versions, resolve_version
        from hpcckpt.storage.commit import commit_version
        from hpcckpt.storage.metadata_file import read_metadata

        storage, base = self.make(tmp_path)
        root = os.path.join(base, "root")
        storage.make_directories(root)
        paths = {step: os.path.join(root, f"step-{step:012d}") for step in (1, 2, 3, 4)}
        for step, shift in ((1, 0.0), (2, 5.0), (3, 0.0)):
            hpcckpt.save({"u": hpcckpt.Block(np.arange(100.0) + shift)}, paths[step], step=step, storage=storage)
        meta = read_metadata(paths[3], storage)  # step 3 holds step 1's bytes: refer to them instead
        own = meta.files
        meta.files = [f"@step-000000000001/{f}" for f in own]
        commit_version(paths[3], meta, storage=storage)
        for f in own:
            storage.remove_file(os.path.join(paths[3], f))
        storage.make_version(paths[4])  # a leftover: never committed
        entries = list_versions(root, storage)
        assert [(e.step, e.committed) for e in entries] == [(1, True), (2, True), (3, True), (4, False)]
        assert resolve_version(root, storage)[0] == paths[3]
        removed = gc(root, keep=1, storage=storage)
        assert sorted(removed) == ["step-000000000002", "step-000000000004"]  # step 1 is referenced: kept
        assert [e.step for e in current(list_versions(root, storage))] == [1, 3]
        assert len(compact(root, keep=1, storage=storage)) == 1
        assert gc(root, keep=1, storage=storage) == ["step-000000000001"]
        got = hpcckpt.load({"u": hpcckpt.Block(np.zeros(100))}, paths[3], storage=storage)
        assert np.array_equal(got["u"].local, np.arange(100.0))

    def test_a_roots_bookkeeping_lives_in_it(self, tmp_path):
        """The writer lock, the halt file, the failure and bandwidth histories, over the storage."""
        import json

        from hpcckpt.policy.history import FailureHistory
        from hpcckpt.root import halt, lock
        from hpcckpt.transport import io_history

        storage, base = self.make(tmp_path)
        root = os.path.join(base, "root")
        storage.make_directories(root)
        lock_path = os.path.join(root, lock.LOCK_FILE)
        held = lock.acquire(root, storage=storage)
        assert json.loads(storage.read_file(lock_path, 1000))["pid"] == os.getpid()
        with pytest.warns(RuntimeWarning, match="this process took it"):
            again = lock.acquire(root, storage=storage)
        lock.release(held)  # no longer its own: the taker's file stays
        assert storage.exists(lock_path)
        lock.release(again)
        assert not storage.exists(lock_path)
        storage.atomic_write(lock_path, json.dumps({"format": "hpcckpt-lock", "hostname": "elsewhere",
                                                    "pid": 4242}).encode())
        with pytest.raises(CheckpointError, match="being written by another job"):
            lock.acquire(root, storage=storage)
        assert lock.break_lock(root, storage=storage)["hostname"] == "elsewhere"
        assert not storage.exists(lock_path)

        assert halt.requested(root, storage) is None
        halt.request(root, "  maintenance   at 5 ", storage=storage)
        assert halt.requested(root, storage) == "maintenance at 5"
        assert halt.withdraw(root, storage) and not halt.withdraw(root, storage)

        history = FailureHistory.load(root, storage=storage)
        history.job_start(100.0, job_id="7", restart_count=0)
        assert FailureHistory.load(root, storage=storage).runs[0].job_id == "7"
        storage.atomic_write(history.path, b"not json")
        with pytest.warns(RuntimeWarning, match="malformed"):
            assert FailureHistory.load(root, storage=storage).runs == []
        assert storage.read_file(history.path + ".bad", 100) == b"not json"

        io_history.record(root, "file-per-rank", 2, 1 << 20, 0.5, storage=storage)
        io_history.flush(root, forget=True)
        assert [r["strategy"] for r in io_history.read_file(root, storage)] == ["file-per-rank"]

    # ------------------------------------------------------- files written in place
    def test_a_file_written_in_place(self, tmp_path):
        """create_replacing takes the name over; write_at, append and truncate put the bytes where they say."""
        storage, _, directory = self._version(tmp_path)
        path = self._file(storage, os.path.join(directory, "x.part"), b"stale bytes")
        handle = storage.create_replacing(path)
        try:
            storage.write_at(handle, 6, b"gh")  # past the end: a gap of zeros
            storage.append(handle, b"ab")  # at the start: after the bytes appended so far, not after write_at's
            storage.write_at(handle, 1, b"B")
            storage.sync(handle)
            assert storage.read_file(path, 100) == b"aB\0\0\0\0gh"
            storage.truncate(handle, 3)
            storage.append(handle, b"c")  # after "ab"
            storage.truncate(handle, 5)
            with pytest.raises(OSError) as negative:
                storage.write_at(handle, -1, b"z")
            assert negative.value.errno == errno.EINVAL
            with pytest.raises(OSError) as negative:
                storage.truncate(handle, -1)
            assert negative.value.errno == errno.EINVAL
        finally:
            storage.close(handle, fsync=True)
        assert storage.read_file(path, 100) == b"aBc\0\0"
        with pytest.raises(CorruptCheckpointError, match="directory"):
            storage.create_replacing(os.path.join(directory, DATA_DIR))
        assert storage.is_directory(os.path.join(directory, DATA_DIR))

    def test_read_at_and_append_from_read_what_the_file_holds(self, tmp_path):
        storage, _, directory = self._version(tmp_path)
        src = self._file(storage, os.path.join(directory, "src"), b"0123456789")
        source, size = storage.open_read(src)
        try:
            out = bytearray(4)
            assert storage.read_at(source, 3, out) == 4 and out == b"3456"
            assert storage.read_at(source, 8, out) == 2 and out[:2] == b"89"
            assert storage.read_at(source, 10, out) == 0
            with pytest.raises(OSError) as negative:
                storage.read_at(source, -1, out)
            assert negative.value.errno == errno.EINVAL
            copy = os.path.join(directory, "copy")
            handle = storage.create_replacing(copy)
            paced = []
            try:
                storage.append(handle, b">")
                assert storage.append_from(handle, source, size, src, paced.append) == size
                with pytest.raises(OSError, match="src"):
                    storage.append_from(handle, source, size + 1, src)
            finally:
                storage.close(handle, fsync=False)
        finally:
            storage.close_read(source)
        assert storage.read_file(copy, 100)[:11] == b">0123456789" and paced and paced[-1] == size

    def test_create_replacing_removes_a_planted_link_never_its_target(self, tmp_path):
        storage, base, directory = self._version(tmp_path)
        target = self._file(storage, os.path.join(directory, "target"))
        link = os.path.join(base, "x.part")
        self.plant(storage, link, "link", target)
        handle = storage.create_replacing(link)
        storage.append(handle, b"new")
        storage.close(handle, fsync=False)
        assert storage.stat(link).kind == FILE and storage.read_file(link, 10) == b"new"
        assert storage.read_file(target, 10) == b"abcde"

    def test_discard_tree_removes_what_it_can_and_never_raises(self, tmp_path):
        storage, base, directory = self._version(tmp_path)
        self._file(storage, os.path.join(directory, DATA_DIR, "x"))
        storage.discard_tree(directory)
        assert not storage.exists(directory) and storage.is_directory(base)
        storage.discard_tree(directory)  # absent: nothing to do
        kept = self._file(storage, os.path.join(base, "file"))
        storage.discard_tree(kept)  # not a tree: stays, no error
        assert storage.is_file(kept)

    def test_discard_tree_never_follows_a_link(self, tmp_path):
        storage, base, directory = self._version(tmp_path)
        kept = self._file(storage, os.path.join(directory, DATA_DIR, "x"))
        link = os.path.join(base, "dir-link")
        self.plant(storage, link, "link", directory)
        storage.discard_tree(link)
        assert storage.read_file(kept, 10) == b"abcde"
