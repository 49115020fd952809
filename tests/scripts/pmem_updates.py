"""Updates one persistent-memory image back to back until killed (tests/levels/test_pmem.py kills it at random instants).

``python pmem_updates.py IMAGE BLOCK COUNT``: resumes after the newest version
the image holds (k0), computes versions k0 + 1 ... k0 + COUNT
(``version_data``) first, prints ``ready``, then stores them one after the
other, printing each k once its update returned, and then waits to be killed.
Nearly all the time between ``ready`` and the last print is spent in updates.
"""

from __future__ import annotations

import sys
import time

import numpy as np

SIZE = (4 << 20) + 123
CONTENT_BLOCK = 256


def version_data(k: int, n: int = SIZE) -> np.ndarray:
    """Version k of the state: 256-byte content blocks, a quarter of them rewritten at each version (block b
    last changed at version k - (b + k) % 4), byte i of a block last changed at v being (7 i + 131 v) mod 256;
    so consecutive versions differ in part only."""
    blocks = np.arange(-(-n // CONTENT_BLOCK), dtype=np.int64)
    last = k - ((blocks + k) % 4)
    base = (np.arange(n, dtype=np.int64) * 7 % 256).astype(np.uint8)
    return base + np.repeat((last * 131 % 256).astype(np.uint8), CONTENT_BLOCK)[:n]


def main(path: str, block: int, count: int) -> None:
    from hpcckpt.levels.pmem import PmemImage

    img = PmemImage(path, 0, 1, block)
    k0 = max((int(h["name"][1:]) for h in img.headers() if h is not None), default=0)
    versions = [version_data(k) for k in range(k0 + 1, k0 + count + 1)]
    print("ready", flush=True)
    for k, data in enumerate(versions, k0 + 1):
        img.update(data, f"v{k}")
        print(k, flush=True)
    time.sleep(600)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
