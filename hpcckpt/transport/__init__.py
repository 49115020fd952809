"""Transports: how the chunks of all ranks reach storage (file-per-rank, aggregated, shared-file)."""

from .aggregated import write_aggregated
from .base import Piece, TransportContext, Written
from .file_per_rank import write_file_per_rank
from .shared_file import write_shared_file

WRITERS = {"file-per-rank": write_file_per_rank, "aggregated": write_aggregated, "shared-file": write_shared_file}

__all__ = ["Piece", "TransportContext", "Written", "WRITERS"]
