"""Storage backends: where the bytes of a version live.

``Storage`` (base.py) is the interface with its call order; ``POSIX``
(posix.py, the default) and ``MemoryStorage`` (memory.py) implement it, and
``hpcckpt.testing.StorageTests`` is the conformance suite a new one passes.
"""

from hpcckpt.storage.base import Storage
from hpcckpt.storage.memory import MemoryStorage
from hpcckpt.storage.posix import POSIX, PosixStorage

__all__ = ["MemoryStorage", "POSIX", "PosixStorage", "Storage"]
