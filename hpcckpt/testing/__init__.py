"""Conformance suites shipped with hpcckpt: subclass one in the tests of a new implementation.

``TransportTests`` for a :class:`hpcckpt.transport.Transport`, ``CodecTests``
for a codec config, ``CheckpointerTests`` for a Checkpointer configuration
(the built-in ones' tests are such subclasses: tests/test_transport_conformance.py,
tests/test_codec_conformance.py, tests/test_checkpointer_conformance.py).
"""

from .checkpointer import CheckpointerTests
from .codec import CodecTests
from .transport import TransportTests

__all__ = ["CheckpointerTests", "CodecTests", "TransportTests"]
