"""Conformance suites shipped with hpcckpt: subclass one in the tests of a new implementation.

``TransportTests`` for a :class:`hpcckpt.transport.Transport` (the built-in
transports' tests are such subclasses: tests/test_transport_conformance.py).
"""

from .transport import TransportTests

__all__ = ["TransportTests"]
