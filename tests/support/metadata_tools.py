"""Crafting metadata.json in tests: edit a committed version's metadata and seal it again, as the writer does.

Tests of the validation behind the seal (a chunk outside its shape, a forbidden
codec, a path that escapes) must reach that validation: an edited but unsealed
file would be refused by the seal check first, and the test would pass for the
wrong reason.
"""

from __future__ import annotations

import json
import os

import numpy as np

from hpcckpt.format import chunk_columns
from hpcckpt.format.metadata import SEAL_LENGTH, SEAL_PREFIX, ChunkTable, seal
from hpcckpt.core.names import METADATA_FILE


def sealed(doc) -> bytes:
    """Sealed metadata bytes of ``doc``: a dict (its own ``metadata_checksum`` key, if any, is dropped),
    or the bytes of a compact JSON object, sealed or not (a sealed file edited as bytes is sealed anew)."""
    if isinstance(doc, dict):
        doc = {k: v for k, v in doc.items() if k != "metadata_checksum"}
        return seal(json.dumps(doc, separators=(",", ":")).encode())
    raw = bytes(doc)
    return seal(b"{" + raw[SEAL_LENGTH:] if raw.startswith(SEAL_PREFIX) else raw)


def read_doc(directory) -> dict:
    """The metadata of the version at ``directory`` as a dict (without its checksum key)."""
    with open(os.path.join(directory, METADATA_FILE), "rb") as f:
        doc = json.loads(f.read())
    doc.pop("metadata_checksum", None)
    return doc


def rewrite_metadata(directory, edit) -> None:
    """Apply ``edit`` to the metadata document of ``directory`` (in place, or return a new dict) and seal it.

    When ``edit`` returns bytes, they are written as they are (damage the seal
    is meant to catch: truncation, garbage).
    """
    doc = read_doc(directory)
    out = edit(doc)
    out = doc if out is None else out
    with open(os.path.join(directory, METADATA_FILE), "wb") as f:
        f.write(out if isinstance(out, bytes) else sealed(out))


def json_columns(entry: dict, ndim: int) -> dict:
    """The JSON-arrays form of a chunk table entry of either form (docs/format.md 3.3), to edit in tests."""
    if "data" not in entry:
        return entry
    cols = chunk_columns.decode(entry, ndim)
    out = {"file": cols["file"].tolist(), "offset": cols["offset"].tolist(), "nbytes": cols["nbytes"].tolist(),
           "checksum": list(cols["checksum"]), "start": cols["start"].ravel().tolist(),
           "count": cols["count"].ravel().tolist()}
    return out if cols["hash"] is None else {**out, "hash": list(cols["hash"])}


def columnar(entry: dict, ndim: int) -> dict:
    """The columnar form (hpcckpt.format.chunk_columns) of a JSON-arrays chunk table entry, its values as they are."""
    n = len(entry["file"])
    table = ChunkTable(np.asarray(entry["file"], np.uint64), np.asarray(entry["offset"], np.uint64),
                       np.asarray(entry["nbytes"], np.uint64), entry["checksum"],
                       np.asarray(entry["start"], np.uint64).reshape(n, ndim),
                       np.asarray(entry["count"], np.uint64).reshape(n, ndim), entry.get("hash"))
    return chunk_columns.encode(table)
