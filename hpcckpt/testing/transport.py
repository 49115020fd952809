"""The conformance suite of a Transport: what the save relies on, checked on one process.

Subclass it in a pytest module and set ``transport`` (an instance)::

    class TestMine(TransportTests):
        transport = MyTransport()

Each test writes pieces through ``transport.write`` into a fresh version
directory (``tmp_path``) with a one-process communicator, then reads the
returned rows back from the files: every piece stored exactly once, at the
offset the row says, with the right checksum.
"""

from __future__ import annotations

import os

import numpy as np

from hpcckpt.core.checksum import checksum
from hpcckpt.mpi.collective import SerialComm
from hpcckpt.core.names import DATA_DIR
from hpcckpt.storage.opening import open_regular
from hpcckpt.transport.base import Piece, Transport, TransportContext
from hpcckpt.transport.topology import node_layout


class TransportTests:
    """Conformance tests every Transport must pass (pytest collects them from subclasses)."""

    transport: Transport

    def _context(self, directory) -> TransportContext:
        os.makedirs(os.path.join(directory, DATA_DIR), exist_ok=True)
        comm = SerialComm()
        layout = node_layout(comm, None) if self.transport.needs_node_layout else None
        return TransportContext(comm=comm, directory=str(directory), layout=layout)

    def _pieces(self, with_checksums: bool = True, sizes=(1, 7, 4096, 100_000)):
        rng = np.random.default_rng(7)
        out = []
        start = 0
        for n in sizes:
            payload = rng.integers(0, 256, n, dtype=np.uint8)
            out.append(Piece("v", (start,), (n,), payload, checksum(payload) if with_checksums else None))
            start += n
        return out

    def _check(self, directory, pieces, written) -> None:
        assert len(written.rows) == len(pieces)
        by_start = {p.start: p for p in pieces}
        for variable, file, offset, nbytes, digest, start, count in written.rows:
            piece = by_start.pop(tuple(start))
            assert (variable, tuple(count), nbytes) == (piece.variable, tuple(piece.count), piece.nbytes)
            fd = open_regular(os.path.join(directory, file))
            try:
                stored = os.pread(fd, nbytes, offset)
            finally:
                os.close(fd)
            assert stored == piece.payload.tobytes(), f"{file} at {offset} does not hold the piece"
            assert digest == checksum(piece.payload)
        assert not by_start
        assert written.nbytes == sum(p.nbytes for p in pieces)

    def test_every_piece_is_stored_where_its_row_says(self, tmp_path):
        pieces = self._pieces()
        written = self.transport.write(self._context(tmp_path), iter(pieces))
        self._check(tmp_path, pieces, written)

    def test_missing_checksums_are_filled_in_only_by_a_transport_that_says_so(self, tmp_path):
        if not self.transport.hashes_while_writing:
            return  # such a transport always gets checksummed pieces (the save hashes them first)
        pieces = self._pieces(with_checksums=False)
        written = self.transport.write(self._context(tmp_path), iter(pieces))
        self._check(tmp_path, pieces, written)

    def test_no_piece_at_all(self, tmp_path):
        written = self.transport.write(self._context(tmp_path), iter([]))
        assert written.rows == [] and written.nbytes == 0

    def test_a_failing_piece_source_raises_from_write(self, tmp_path):
        def pieces():
            yield from self._pieces(sizes=(16,))
            raise OSError("the encoder failed")

        try:
            self.transport.write(self._context(tmp_path), pieces())
        except OSError as exc:
            assert "the encoder failed" in str(exc)
        else:
            raise AssertionError("write returned although its pieces failed")

    def test_the_name_and_flags_are_declared(self):
        assert isinstance(self.transport.name, str) and self.transport.name not in ("", "auto")
        assert isinstance(self.transport.hashes_while_writing, bool)
        assert isinstance(self.transport.needs_node_layout, bool)
