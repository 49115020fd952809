"""Transports: how the chunks of all ranks reach the storage.  Only file-per-rank for now."""
