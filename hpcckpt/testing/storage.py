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
with a damaged file refused.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from hpcckpt.core.checksum import hexdigest, new_hasher
from hpcckpt.errors import CheckpointError, CorruptCheckpointError
from hpcckpt.core.names import DATA_DIR, METADATA_FILE, rank_file
from hpcckpt.storage.base import Storage


class StorageTests:
    """Conformance tests every Storage must pass (pytest collects them from subclasses)."""

    def make(self, tmp_path) -> tuple[Storage, str]:
        raise NotImplementedError

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
