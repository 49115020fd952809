"""Helpers the benchmarks share (imported by name: the scripts run from this folder)."""

import os


def drop_cache(directory: str) -> None:
    """Drop the page cache of every file under ``directory`` (clean pages only: call after fsync)."""
    for root, _, files in os.walk(directory):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
