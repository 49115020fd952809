"""Transports: how the chunks of all ranks reach storage (file-per-rank, aggregated, shared-file).

``TRANSPORTS`` is the registry the save looks strategies up in (and the list of
strategy names is derived from); each transport is a :class:`Transport`
registered here with :func:`register`.
"""

from hpcckpt.transport.aggregated import Aggregated
from hpcckpt.transport.base import Piece, Transport, TransportContext, Written
from hpcckpt.transport.file_per_rank import FilePerRank
from hpcckpt.transport.shared_file import SharedFile

#: strategy name -> Transport, in the order users see them.
TRANSPORTS: dict[str, Transport] = {}


def register(transport: Transport) -> Transport:
    """Make ``transport`` a strategy (``strategy=transport.name``); returns it."""
    if not transport.name or transport.name == "auto":
        raise ValueError(f"a transport needs a name other than 'auto', got {transport.name!r}")
    TRANSPORTS[transport.name] = transport
    return transport


for _transport in (FilePerRank(), Aggregated(), SharedFile()):
    register(_transport)

__all__ = ["Piece", "Transport", "TransportContext", "Written", "TRANSPORTS", "register"]
