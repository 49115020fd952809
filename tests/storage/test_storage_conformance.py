"""hpcckpt.testing.StorageTests for both Storage backends: POSIX directories and MemoryStorage."""

from __future__ import annotations

import os

from hpcckpt.storage import POSIX, MemoryStorage
from hpcckpt.testing import StorageTests


class TestPosix(StorageTests):
    def make(self, tmp_path):
        return POSIX, str(tmp_path)

    def plant(self, storage, path, kind, target=None):
        if kind == "link":
            os.symlink(target, path)
        else:
            os.mkfifo(path)


class TestMemory(StorageTests):
    def make(self, tmp_path):
        return MemoryStorage(), "/memory/run"
