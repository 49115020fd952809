"""Every registered transport passes the shipped conformance suite (hpcckpt.testing.TransportTests)."""

from __future__ import annotations

import pytest

from hpcckpt.testing import TransportTests
from hpcckpt.transport import TRANSPORTS, Transport, register
from hpcckpt.transport.aggregated import Aggregated
from hpcckpt.transport.file_per_rank import FilePerRank
from hpcckpt.transport.shared_file import SharedFile


class TestFilePerRank(TransportTests):
    transport = TRANSPORTS["file-per-rank"]


class TestAggregated(TransportTests):
    transport = TRANSPORTS["aggregated"]


class TestSharedFile(TransportTests):
    transport = TRANSPORTS["shared-file"]


def test_the_registry_holds_the_built_in_strategies_in_order():
    assert list(TRANSPORTS) == ["file-per-rank", "aggregated", "shared-file"]
    assert [type(t) for t in TRANSPORTS.values()] == [FilePerRank, Aggregated, SharedFile]
    from hpcckpt.options import STRATEGIES

    assert STRATEGIES == ("auto", *TRANSPORTS)


def test_a_transport_needs_a_real_name():
    class Nameless(Transport):
        def write(self, ctx, pieces):
            raise NotImplementedError

    with pytest.raises(ValueError):
        register(Nameless())
