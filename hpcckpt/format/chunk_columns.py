"""The columnar chunk table of format version 3: a variable's chunks as uint64 columns, deflated, base64.

A chunk table of many rows parsed as JSON arrays costs one Python object per
number (``json.loads``), then they become arrays again; as one block of
little-endian uint64 columns it is decoded by ``numpy.frombuffer``.  The
block is deflated (zlib level 1; docs/performance.md, "Columnar chunk
tables", has the sizes and timings) and stored as a
base64 string *inside* metadata.json, so the metadata's own checksum covers it
and no second file can go missing or be swapped.  docs/format.md, section
3.3.1, specifies it; this module encodes and decodes it (pure: no I/O, no MPI)
and holds :class:`HexDigests`, the digest columns kept as words.

Decoding treats the block as untrusted: every bound (rows, columns, the
inflated size) is checked before memory is allocated for it, and anything
wrong is one CorruptCheckpointError.
"""

from __future__ import annotations

import base64
import struct
import zlib
from collections.abc import Sequence

import numpy as np
import xxhash

from hpcckpt.core.blockhash import NAME as DEVICE_HASH_TAG  # hash_kind 1: a block hashed on a GPU, "mix128:<32 hex digits>"
from hpcckpt.core.encoding import b64decode_canonical
from hpcckpt.errors import CorruptCheckpointError

#: A writer stores every chunk table of a version in this form when the version has at least this many chunks in
#: all (fewer stay readable JSON arrays); a reader takes either form at any size (format version 3).
COLUMNAR_MIN_CHUNKS = 4096
#: The first 8 bytes of a decoded block, then block version, column count, row count and the body's XXH3-64.
MAGIC = b"HCKCOLS\0"
BLOCK_VERSION = 1
HEADER = struct.Struct("<8sIIQQ")
#: A decoded block is at most 1 GiB (about 13 million chunks of a 3-d variable), and the blocks of one
#: metadata.json 2 GiB together (the 256 MiB file limit holds about 18 million chunks at 14.6 bytes each, 1.8 GiB
#: decoded); larger is refused before anything is inflated (metadata.parse adds up the claims of all the file's
#: tables first), so a small stream cannot claim a huge allocation.
MAX_BLOCK_BYTES = 1 << 30
MAX_TOTAL_BYTES = 1 << 31
#: The columns after the start and count ones when the table has content hashes (incremental saves).
HASH_COLUMNS = ("hash_hi", "hash_lo", "hash_kind")
KEYS = frozenset({"columns", "rows", "data"})
_LIMIT = 1 << 62  # integer columns lie in [0, 2^62), as in the JSON form


class HexDigests(Sequence):
    """A column of digests held as uint64 words (most significant first), read as docs/format.md's hex strings.

    ``words`` is ``(n, w)``: one 16-hex-digit word per digit group (w = 1 for
    chunk checksums, 2 for the 128-bit content hashes); ``tagged`` marks the
    rows whose string carries the ``mix128:`` prefix (a GPU hash).  Item ``k`` is
    the string a JSON table would hold, made when asked, so decoding a table
    costs no Python object per row and broadcasting it pickles 8 bytes a word.
    """

    __slots__ = ("words", "tagged")

    def __init__(self, words: np.ndarray, tagged: np.ndarray | None = None):
        self.words = words
        self.tagged = tagged

    @classmethod
    def from_strings(cls, values: Sequence[str], width: int, tagged: bool = False) -> "HexDigests":
        """The words of validated hex strings of ``16 * width`` digits; with ``tagged``, a row may be
        ``mix128:``-prefixed (content hashes)."""
        if isinstance(values, HexDigests):
            return values
        prefix, marks = DEVICE_HASH_TAG + ":", None
        if tagged and set(map(len, values)) != {16 * width}:  # (C loops; most columns have no tagged row)
            marks = np.fromiter((v.startswith(prefix) for v in values), bool, len(values))
            marks = marks if marks.any() else None
        digits = "".join(values) if marks is None else "".join(
            v[len(prefix):] if m else v for v, m in zip(values, marks.tolist()))
        words = np.frombuffer(bytes.fromhex(digits), ">u8").astype(np.uint64).reshape(len(values), width)
        return cls(words, marks)

    def __len__(self) -> int:
        return len(self.words)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        text = "".join(format(int(w), "016x") for w in self.words[k])
        return f"{DEVICE_HASH_TAG}:{text}" if self.tagged is not None and self.tagged[k] else text

    def __iter__(self):
        width = 16 * self.words.shape[1]
        digits = self.words.astype(">u8").tobytes().hex()
        texts = [digits[i:i + width] for i in range(0, len(digits), width)]
        if self.tagged is not None:
            for k in np.flatnonzero(self.tagged).tolist():
                texts[k] = f"{DEVICE_HASH_TAG}:{texts[k]}"
        return iter(texts)

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and len(self) == len(other) and list(self) == list(other)

    __hash__ = None  # mutable, like the list it stands for

    def __repr__(self) -> str:
        return f"HexDigests({len(self)} rows)"


def column_names(ndim: int, hashes: bool) -> list[str]:
    """The columns of a table of ``ndim`` axes, in their stored order (docs/format.md, 3.3.1)."""
    return (["file", "offset", "nbytes", "checksum"] + [f"start_{i}" for i in range(ndim)]
            + [f"count_{i}" for i in range(ndim)] + (list(HASH_COLUMNS) if hashes else []))


def encode(table) -> dict:
    """The JSON entry of a ChunkTable in the columnar form: ``{"columns", "rows", "data"}``."""
    n, ndim = len(table), table.start.shape[1]
    names = column_names(ndim, table.hash is not None)
    cols = np.empty((len(names), n), "<u8")
    cols[0], cols[1], cols[2] = table.file, table.offset, table.nbytes
    cols[3] = HexDigests.from_strings(table.checksum, 1).words[:, 0]
    cols[4:4 + ndim], cols[4 + ndim:4 + 2 * ndim] = table.start.T, table.count.T
    if table.hash is not None:
        hashes = HexDigests.from_strings(table.hash, 2, tagged=True)
        cols[-3:-1] = hashes.words.T
        cols[-1] = hashes.tagged if hashes.tagged is not None else 0
    body = cols.tobytes()
    deflate = zlib.compressobj(1)
    packed = deflate.compress(HEADER.pack(MAGIC, BLOCK_VERSION, len(names), n, xxhash.xxh3_64_intdigest(body)))
    packed += deflate.compress(body) + deflate.flush()
    return {"columns": names, "rows": n, "data": base64.b64encode(packed).decode("ascii")}


def decoded_size(doc: dict, ndim: int) -> int:
    """The bytes the block of a columnar entry decodes to, from its ``columns`` and ``rows``, both checked, and
    at most MAX_BLOCK_BYTES (CorruptCheckpointError), before anything is decoded."""
    _expect(isinstance(doc, dict) and KEYS == set(doc), f"a columnar chunk table has exactly the keys {sorted(KEYS)}")
    plain = column_names(ndim, False)
    _expect(doc["columns"] in (plain, column_names(ndim, True)),
            f"the columns must be {plain}, optionally followed by {list(HASH_COLUMNS)}")
    rows = doc["rows"]
    _expect(type(rows) is int and rows >= 0, "rows must be a non-negative integer")
    size = HEADER.size + 8 * len(doc["columns"]) * rows
    _expect(size <= MAX_BLOCK_BYTES, f"the decoded block would be {size} bytes (at most {MAX_BLOCK_BYTES})")
    return size


def decode(doc: dict, ndim: int) -> dict:
    """The columns of a columnar entry, checked: ``file``, ``offset``, ``nbytes`` (int64, n), ``start``,
    ``count`` (int64, (n, ndim)), ``checksum`` and ``hash`` (HexDigests; hash None without one).

    CorruptCheckpointError for anything malformed: keys, names, sizes, base64 (canonical only),
    the zlib stream, magic, header counts, the body's hash, integers outside
    [0, 2^62), a ``hash_kind`` other than 0 or 1.  The caller checks what
    needs the rest of the version (file indexes, bounds, coverage).
    """
    size = decoded_size(doc, ndim)
    columns, rows, data = doc["columns"], doc["rows"], doc["data"]
    _expect(isinstance(data, str) and data.isascii(), "data must be an ASCII base64 string")
    try:
        packed = b64decode_canonical(data)
    except ValueError as exc:
        raise CorruptCheckpointError(f"data is not valid base64 ({exc})") from None
    inflate = zlib.decompressobj()
    try:
        block = inflate.decompress(packed, size + 1)  # never more than the header announces, plus one to notice
    except zlib.error as exc:
        raise CorruptCheckpointError(f"data is not a valid zlib stream ({exc})") from None
    _expect(inflate.eof and not inflate.unused_data and len(block) == size,
            f"data inflates to {len(block)}{'+' if not inflate.eof else ''} bytes, not the {size} of "
            f"{len(columns)} columns x {rows} rows (truncated or trailing bytes)")
    magic, version, ncols, nrows, digest = HEADER.unpack_from(block)
    _expect(magic == MAGIC, f"the block does not start with {MAGIC!r}")
    _expect(version == BLOCK_VERSION, f"block version {version} is not supported (this hpcckpt reads {BLOCK_VERSION})")
    _expect(ncols == len(columns) and nrows == rows, f"the block's header says {ncols} columns x {nrows} rows, "
            f"the table {len(columns)} x {rows}")
    body = memoryview(block)[HEADER.size:]
    _expect(xxhash.xxh3_64_intdigest(body) == digest, "the block fails its checksum")
    cols = np.frombuffer(body, "<u8").reshape(len(columns), rows)
    ints = (cols[0:3], cols[4:4 + 2 * ndim])
    _expect(all(bool((c < _LIMIT).all()) for c in ints), "an integer column has values outside [0, 2^62)")
    out = {key: cols[i].astype(np.int64) for i, key in enumerate(("file", "offset", "nbytes"))}
    out["start"] = np.ascontiguousarray(cols[4:4 + ndim].T, dtype=np.int64)
    out["count"] = np.ascontiguousarray(cols[4 + ndim:4 + 2 * ndim].T, dtype=np.int64)
    out["checksum"] = HexDigests(cols[3:4].T.astype(np.uint64))
    out["hash"] = None
    if columns == column_names(ndim, True):
        kind = cols[-1]
        _expect(bool((kind <= 1).all()), "hash_kind must be 0 or 1")
        tagged = kind.astype(bool)
        out["hash"] = HexDigests(np.ascontiguousarray(cols[-3:-1].T, dtype=np.uint64), tagged if tagged.any() else None)
    return out


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise CorruptCheckpointError(message)
