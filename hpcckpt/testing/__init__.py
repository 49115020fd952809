"""Conformance suites shipped with hpcckpt: subclass one in the tests of a new implementation.

``TransportTests`` for a :class:`hpcckpt.transport.Transport`, ``StorageTests``
for a :class:`hpcckpt.storage.Storage`, ``LevelTests`` for a
:class:`hpcckpt.levels.base.Level` (under mpiexec), ``CodecTests`` for a codec config,
``CheckpointerTests`` for a Checkpointer configuration (the built-in ones'
tests are such subclasses: tests/transport/test_transport_conformance.py,
tests/storage/test_storage_conformance.py, tests/levels/test_level_conformance.py, tests/codecs/test_codec_conformance.py,
tests/saving/test_checkpointer_conformance.py).
"""

from hpcckpt.testing.checkpointer import CheckpointerTests
from hpcckpt.testing.codec import CodecTests
from hpcckpt.testing.level import LevelTests
from hpcckpt.testing.storage import StorageTests
from hpcckpt.testing.transport import TransportTests

__all__ = ["CheckpointerTests", "CodecTests", "LevelTests", "StorageTests", "TransportTests"]
