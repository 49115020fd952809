"""hpcckpt.testing.StorageTests for both Storage backends: POSIX directories and MemoryStorage (issue 18)."""

from __future__ import annotations

from hpcckpt.storage import POSIX, MemoryStorage
from hpcckpt.testing import StorageTests


class TestPosix(StorageTests):
    def make(self, tmp_path):
        return POSIX, str(tmp_path)


class TestMemory(StorageTests):
    def make(self, tmp_path):
        return MemoryStorage(), "/memory/run"
