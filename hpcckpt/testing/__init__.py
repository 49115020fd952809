"""Conformance suites shipped with hpcckpt: subclass one in the tests of a new implementation.

``TransportTests`` for a :class:`hpcckpt.transport.Transport`, ``CodecTests``
for a codec config (the built-in ones' tests are such subclasses:
tests/test_transport_conformance.py, tests/test_codec_conformance.py).
"""

from .codec import CodecTests
from .transport import TransportTests

__all__ = ["CodecTests", "TransportTests"]
