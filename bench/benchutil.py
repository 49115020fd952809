"""Helpers the benchmarks share (imported by name: the scripts run from this folder)."""

import os

import numpy as np


def drop_cache(directory: str) -> None:
    """Drop the page cache of every file under ``directory`` (clean pages only: call after fsync)."""
    for root, _, files in os.walk(directory):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def fill_rows(out: np.ndarray, row0: int, ncols: int) -> None:
    """Rows of the benchmarks' global array from ``row0`` on: element (i, j) is i*ncols + j
    (exact in float64 below 2^53), written 1 Mi elements at a time to bound the temporary."""
    flat = out.reshape(-1)
    step = 1 << 20
    for a in range(0, flat.size, step):
        b = min(flat.size, a + step)
        flat[a:b] = np.arange(row0 * ncols + a, row0 * ncols + b, dtype=np.float64)


def print_table(header: list, rows: list) -> None:
    """A Markdown table of ``rows`` under ``header``, columns padded to their widest cell."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]

    def line(r):
        return "| " + " | ".join(str(x).ljust(w) for x, w in zip(r, widths)) + " |"

    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))
