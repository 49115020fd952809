"""The options that shape how the ranks write: ``max_writers`` (transport/throttle.py) and ``mpiio_hints``
(transport/shared_file.py) have the effect docs/io.md gives them.

Run the MPI part with ``mpiexec -n N python tests/mpi_pytest.py --with-mpi -m mpi tests/transport/test_transport_options.py``.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from hpcckpt import Block, Checkpointer
from hpcckpt.transport import file_per_rank, throttle


class TokenComm:
    """The point-to-point calls write_turn makes, recorded in ``events`` with what the body does."""

    def __init__(self, rank, events):
        self.rank, self.events = rank, events

    def Get_rank(self):
        return self.rank

    def recv(self, source, tag):
        self.events.append(("recv", source))

    def send(self, obj, dest, tag):
        self.events.append(("send", dest))


@pytest.mark.parametrize("writers, k, rank, expected", [
    (range(5), 2, 0, [("write",), ("send", 2)]),
    (range(5), 2, 2, [("recv", 0), ("write",), ("send", 4)]),
    (range(5), 2, 3, [("recv", 1), ("write",)]),
    ([0, 2, 4, 6], 1, 4, [("recv", 2), ("write",), ("send", 6)]),  # aggregators: the writers' own numbering
    (range(3), 3, 1, [("write",)]),  # no more writers than allowed: no tokens
    (range(5), None, 3, [("write",)]),
])
def test_a_writer_waits_for_the_one_k_before_it_and_hands_on_to_the_one_k_after(writers, k, rank, expected):
    events = []
    with throttle.write_turn(TokenComm(rank, events), list(writers), k):
        events.append(("write",))
    assert events == expected


def test_a_failed_write_still_hands_on_its_turn():
    events = []
    with pytest.raises(OSError), throttle.write_turn(TokenComm(1, events), list(range(4)), 1):
        raise OSError(28, "No space left on device")
    assert events == [("recv", 0), ("send", 2)]


# ------------------------------------------------------------ under mpiexec
@pytest.fixture
def comm():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _state(comm):
    a = np.arange(4096.0) + 10000 * comm.rank
    return {"u": Block(a, (comm.rank * a.size,), (comm.size * a.size,))}


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(60)
@pytest.mark.parametrize("max_writers", [1, None])
def test_max_writers_reaches_the_throttle_and_every_write_is_in_its_turn(comm, mpi_tmp, monkeypatch, max_writers):
    real_turn, real_append = throttle.write_turn, file_per_rank.SequentialFile.append
    turns, outside = [], []

    @contextlib.contextmanager
    def turn(c, writers, k):
        turns.append((list(writers), k))
        with real_turn(c, writers, k):
            turns.append("held")
            yield
            turns.append("released")

    def append(self, *args, **kwargs):
        if turns[-1] != "held":
            outside.append(self.name)
        return real_append(self, *args, **kwargs)

    monkeypatch.setattr(file_per_rank, "write_turn", turn)
    monkeypatch.setattr(file_per_rank.SequentialFile, "append", append)
    with Checkpointer(mpi_tmp, strategy="file-per-rank", max_writers=max_writers, track_failures=False) as ck:
        ck.save(_state(comm), 1)
    assert turns == [(list(range(comm.size)), max_writers), "held", "released"] and not outside, (turns, outside)


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(60)
def test_mpiio_hints_reach_the_shared_files_open(comm, mpi_tmp, monkeypatch):
    from mpi4py import MPI

    opened, real = [], MPI.File

    class RecordingFile(real):
        """MPI.File, whose Open records the hints it is given."""

        @classmethod
        def Open(cls, c, path, amode, info=MPI.INFO_NULL):
            opened.append({info.Get_nthkey(i): info.Get(info.Get_nthkey(i)) for i in range(info.Get_nkeys())})
            return real.Open(c, path, amode, info)

    monkeypatch.setattr(MPI, "File", RecordingFile)
    hints = {"cb_buffer_size": 1 << 20, "romio_cb_write": "enable"}
    with Checkpointer(mpi_tmp, strategy="shared-file", mpiio_hints=hints, track_failures=False) as ck:
        ck.save(_state(comm), 1)
        got = ck.restore({"u": Block(np.zeros(4096), (comm.rank * 4096,), (comm.size * 4096,))})
    assert opened == [{"cb_buffer_size": "1048576", "romio_cb_write": "enable"}], opened
    assert np.array_equal(got["u"].local, np.arange(4096.0) + 10000 * comm.rank)
