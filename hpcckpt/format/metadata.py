"""The on-disk index of one checkpoint version: dataclasses, JSON (de)serialisation, validation.

The metadata speaks only in global terms: for each variable its kind, global
shape, dtype and codec, and a table of chunks, each a global box mapped to
(file, byte offset, stored length, checksum).  Nothing names a rank, so any
number of ranks can read it back.  docs/format.md specifies it for readers in
other languages.

Everything read from disk is untrusted: :func:`parse` first checks the
file's own checksum (every byte is covered, see :func:`seal`), then validates
types, ranges and paths (vectorised) before any caller allocates or reads a
byte.  A chunk table of many chunks is stored as a columnar block
(hpcckpt.format.chunk_columns, format version 3), decoded without a Python object per
row, so parse and validation cost a vectorised pass over the columns (docs/performance.md,
"Columnar chunk tables", has the timings).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpcckpt.core import blockhash
from hpcckpt.format import chunk_columns
from hpcckpt.core.box_index import BoxIndex
from hpcckpt.core.checksum import checksum
from hpcckpt.codecs.core import check_config as check_codec_config, max_stored_bytes
from hpcckpt.core.encoding import MAX_VALUE_DEPTH, decode_value, dtype_from_json, dtype_to_json
from hpcckpt.errors import CorruptCheckpointError
from hpcckpt.core.names import MAX_NAME_CHARS, is_reference_version, split_reference

FORMAT_NAME = "hpcckpt"
#: The version this hpcckpt writes, and every version it reads (1: before metadata checksums; 2: before the
#: columnar chunk tables of hpcckpt.format.chunk_columns, which version 3 writes for variables of many chunks).
FORMAT_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
CHECKSUM_ALGORITHM = "xxh3_64"
#: The key of the metadata checksum: the first key of a sealed file (format versions 2 and 3), in no version 1 file.
SEAL_KEY = "metadata_checksum"
#: The literal start of a sealed metadata file; 16 hex digits of its checksum and '",' follow (docs/format.md, 3).
SEAL_PREFIX = b'{"' + SEAL_KEY.encode() + b'":"'
SEAL_LENGTH = len(SEAL_PREFIX) + 16 + 2
#: Metadata longer than this is refused, counting the bytes actually read: 256 MiB holds the chunk
#: index of 65,536 ranks x 20 variables (1.3 million chunks: 66 MB as JSON arrays, 19 MB columnar) with room.
MAX_METADATA_BYTES = 256 << 20
#: Steps are at most int64 (readers in other languages hold them in one).
MAX_STEP = (1 << 63) - 1
_VARIABLE_KEYS = frozenset({"kind", "dtype", "shape", "codec", "chunks"})
_CHUNK_KEYS = frozenset({"file", "offset", "nbytes", "checksum", "start", "count", "hash"})
_MAX_NDIM = 32
_MAX_BYTES = 1 << 62
KINDS = ("block", "ragged")
_HEX_DIGITS = frozenset("0123456789abcdef")
_DEVICE_HASH_PREFIX = f"{blockhash.NAME}:"  # blocks hashed on a GPU


@dataclass
class ChunkTable:
    """Columns of a variable's chunk index (one row per chunk, all int64 except the digests).

    The digest columns are sequences of the hex strings of docs/format.md: a
    list, or, from a columnar table, a chunk_columns.HexDigests (the words,
    a string made per item asked for).
    """

    file: np.ndarray
    offset: np.ndarray
    nbytes: np.ndarray
    checksum: Sequence[str]
    start: np.ndarray  # (n, ndim)
    count: np.ndarray  # (n, ndim)
    #: optional: xxh3_128 of each chunk's decoded bytes, 32 hex digits (incremental saves; docs/incremental.md)
    hash: Sequence[str] | None = None
    #: the spatial index of the chunks' boxes, built on first use by :meth:`index` (never stored)
    _index: BoxIndex | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.file)

    def index(self) -> BoxIndex:
        """The chunks' boxes indexed for overlap queries (hpcckpt.core.box_index), built once per table."""
        if self._index is None:
            self._index = BoxIndex(self.start, self.stop)
        return self._index

    @property
    def stop(self) -> np.ndarray:
        return self.start + self.count

    @classmethod
    def empty(cls, ndim: int) -> "ChunkTable":
        z = np.zeros(0, dtype=np.int64)
        return cls(z, z.copy(), z.copy(), [], np.zeros((0, ndim), np.int64), np.zeros((0, ndim), np.int64))

    @classmethod
    def from_rows(cls, rows: list[tuple], ndim: int) -> "ChunkTable":
        """Build from ``(file, offset, nbytes, checksum, start, count)`` tuples."""
        if not rows:
            return cls.empty(ndim)
        file, offset, nbytes, checksum, start, count = zip(*rows)
        return cls(np.asarray(file, np.int64), np.asarray(offset, np.int64), np.asarray(nbytes, np.int64),
                   list(checksum), np.asarray(start, np.int64).reshape(len(rows), ndim),
                   np.asarray(count, np.int64).reshape(len(rows), ndim))

    def to_json(self, columnar: bool) -> dict:
        """The table's JSON entry: a columnar block (chunk_columns) or JSON arrays."""
        if columnar:
            return chunk_columns.encode(self)
        return {"file": self.file.tolist(), "offset": self.offset.tolist(), "nbytes": self.nbytes.tolist(),
                "checksum": list(self.checksum), "start": self.start.ravel().tolist(),
                "count": self.count.ravel().tolist(), **({"hash": list(self.hash)} if self.hash is not None else {})}


@dataclass
class Variable:
    """One distributed variable: a global array and where its chunks are stored."""

    name: str
    kind: str
    dtype: np.dtype
    shape: tuple[int, ...]
    chunks: ChunkTable
    codec: dict = field(default_factory=lambda: {"id": "none"})

    @property
    def nbytes(self) -> int:
        """Bytes of the decoded global array."""
        n = self.dtype.itemsize
        for s in self.shape:
            n *= s
        return n

    @property
    def stored_bytes(self) -> int:
        return int(self.chunks.nbytes.sum())

    def to_json(self, columnar: bool) -> dict:
        """The variable's JSON entry, its chunk table columnar or not (Metadata.to_json_bytes decides)."""
        return {"kind": self.kind, "dtype": dtype_to_json(self.dtype), "shape": list(self.shape),
                "codec": self.codec, "chunks": self.chunks.to_json(columnar)}


@dataclass
class Metadata:
    """A committed version: its variables, replicated values, data files and provenance."""

    step: int | None
    files: list[str]
    variables: dict[str, Variable]
    values: dict[str, Any]  # JSON-encoded replicated values (see encoding.encode_value)
    nranks: int
    created: str
    extra: dict = field(default_factory=dict)  # room for later features (strategy, incremental base...)
    #: the format version it was read from (a version is always written as FORMAT_VERSION)
    format_version: int = FORMAT_VERSION

    def indexed(self) -> "Metadata":
        """This metadata with every chunk table's index built (by the rank that broadcasts it: the others then
        receive it instead of each building it, O(all chunks), for itself)."""
        for var in self.variables.values():
            var.chunks.index()
        return self

    def to_json_bytes(self) -> bytes:
        """The committed bytes of ``metadata.json``: one JSON object, sealed by its own checksum.

        Every chunk table is a columnar block when the version has at least
        COLUMNAR_MIN_CHUNKS chunks in all (many small variables parse as
        slowly as one big one), JSON arrays otherwise (small checkpoints stay
        readable as text)."""
        columnar = sum(len(v.chunks) for v in self.variables.values()) >= chunk_columns.COLUMNAR_MIN_CHUNKS
        doc = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "checksum": CHECKSUM_ALGORITHM,
               "step": self.step, "created": self.created, "nranks": self.nranks, "files": self.files,
               "variables": {name: v.to_json(columnar) for name, v in self.variables.items()},
               "values": self.values, "extra": self.extra}
        return seal(json.dumps(doc, separators=(",", ":"), allow_nan=False).encode())


def seal(document: bytes) -> bytes:
    """Put the checksum of a compact JSON object inside it, as its first key, covering every other byte.

    ``{"a":1}`` becomes ``{"metadata_checksum":"<16 hex>","a":1}``: the digest
    (xxh3_64, as for chunks) covers everything after the 40-byte prefix, and the
    prefix itself is a fixed literal plus the digest, so no byte of the file can
    change unnoticed and the file stays plain JSON for other tools.
    """
    if not document.startswith(b"{") or document == b"{}":
        raise ValueError("seal takes a non-empty compact JSON object")
    body = document[1:]
    return SEAL_PREFIX + checksum(body).encode() + b'",' + body


def unseal(raw: bytes, source: str) -> bool:
    """Check the seal of metadata bytes; True when sealed and intact, False for an unsealed (version 1) file.

    CorruptCheckpointError when the seal is damaged or the checksum does not
    match (a flipped byte anywhere, or a file cut short).
    """
    if not raw.startswith(SEAL_PREFIX):
        return False
    digest, comma = raw[len(SEAL_PREFIX):SEAL_LENGTH - 2], raw[SEAL_LENGTH - 2:SEAL_LENGTH]
    if comma != b'",' or len(digest) != 16 or not _HEX_DIGITS.issuperset(digest.decode("latin-1")):
        raise CorruptCheckpointError(f"{source}: the metadata checksum at its start is damaged")
    actual = checksum(memoryview(raw)[SEAL_LENGTH:])
    if actual.encode() != digest:
        raise CorruptCheckpointError(f"{source}: the metadata fails its checksum (stored {digest.decode()}, "
                                     f"read {actual}): damaged or truncated")
    return True


def parse(raw: bytes, source: str = "metadata") -> Metadata:
    """Check, parse and validate untrusted metadata bytes; CorruptCheckpointError on anything damaged or malformed."""
    sealed = unseal(raw, source)
    try:
        doc = json.loads(raw, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError) as exc:
        raise CorruptCheckpointError(f"{source}: not valid JSON ({exc})") from None
    try:
        return _parse_doc(doc, sealed)
    except CorruptCheckpointError as exc:
        raise CorruptCheckpointError(f"{source}: {exc}") from None
    except (TypeError, KeyError, ValueError, OverflowError) as exc:
        raise CorruptCheckpointError(f"{source}: malformed metadata ({type(exc).__name__}: {exc})") from None


def _reject_constant(name):
    raise ValueError(f"{name} is not allowed")


def _unique_keys(pairs: list) -> dict:
    """A JSON object as a dict, refusing duplicate keys (JSON libraries disagree on which one wins)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        duplicate = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"the key {duplicate[:80]!r} appears twice in one object")
    return out


def _parse_doc(doc, sealed: bool) -> Metadata:
    _expect(isinstance(doc, dict), "the top level must be an object")
    _expect(doc.get("format") == FORMAT_NAME, "this is not an hpcckpt checkpoint")
    version = doc.get("format_version")
    _expect(type(version) is int, "format_version missing")
    _expect(version in READABLE_VERSIONS,
            f"format version {version} is not supported (this hpcckpt reads {', '.join(map(str, READABLE_VERSIONS))})")
    _expect(sealed == (version >= 2), f"format version {version} metadata must "
            + ("start with its checksum (the seal is missing or damaged)" if version >= 2 else "not be sealed"))
    _expect(version >= 2 or SEAL_KEY not in doc, f"format version 1 metadata has no {SEAL_KEY!r} key (a version 1 "
            "file is not sealed; one that names a checksum is a damaged or edited later version)")
    _expect(doc.get("checksum") == CHECKSUM_ALGORITHM, f"unknown checksum algorithm {doc.get('checksum')!r}")
    step = doc["step"]
    _expect(step is None or (type(step) is int and 0 <= step <= MAX_STEP),
            f"step must be null or an integer in [0, 2^63), got {str(step)[:40]}")
    files = doc["files"]
    _expect(isinstance(files, list), "files must be a list")
    for name in files:
        check_relative_path(name)
    nranks = doc["nranks"]
    _expect(type(nranks) is int and 1 <= nranks < _MAX_BYTES, "nranks must be a positive integer below 2^62")
    _expect(isinstance(doc["created"], str), "created must be a string")
    values = doc["values"]
    _expect(isinstance(values, dict), "values must be an object")
    for name, value in values.items():  # malformed or too deeply nested values fail here, before any broadcast
        decode_value(value, repr(name), wide_ints=version == 1)
    extra = doc.get("extra", {})
    _expect(isinstance(extra, dict) and _nests_at_most(extra, MAX_VALUE_DEPTH),
            f"extra must be an object nesting at most {MAX_VALUE_DEPTH} deep")
    variables_doc = doc["variables"]
    _expect(isinstance(variables_doc, dict), "variables must be an object")
    claimed = sum(_columnar_size(name, vdoc) for name, vdoc in variables_doc.items()) if version >= 3 else 0
    _expect(claimed <= chunk_columns.MAX_TOTAL_BYTES, f"the columnar chunk tables of this metadata.json would "
            f"decode to {claimed} bytes together, more than {chunk_columns.MAX_TOTAL_BYTES}")
    variables = {}
    for name, vdoc in variables_doc.items():
        _expect(name and len(name) <= MAX_NAME_CHARS, f"invalid variable name {name[:40]!r}")
        _expect(name not in values, f"{name!r} is both a variable and a replicated value")
        variables[name] = _parse_variable(name, vdoc, len(files), version)
    return Metadata(step=step, files=files, variables=variables, values=values, nranks=nranks,
                    created=doc["created"], extra=extra, format_version=version)


def _columnar_size(name: str, vdoc) -> int:
    """The bytes the columnar chunk table of a variable entry claims to decode to (chunk_columns.decoded_size,
    from its ``columns`` and ``rows`` only), 0 when it has none; checked for all tables before any is decoded."""
    if not (isinstance(vdoc, dict) and isinstance(vdoc.get("chunks"), dict) and "data" in vdoc["chunks"]
            and isinstance(vdoc.get("shape"), list)):
        return 0  # no columnar table, or an entry _parse_variable refuses
    try:
        return chunk_columns.decoded_size(vdoc["chunks"], len(vdoc["shape"]))
    except CorruptCheckpointError as exc:
        raise CorruptCheckpointError(f"chunks of {name!r}: {exc}") from None


def _nests_at_most(obj, limit: int) -> bool:
    """Whether lists and objects in ``obj`` nest at most ``limit`` deep (walked without recursion).

    The free-form ``extra`` must be bounded too: a version that parses is
    broadcast to every rank, and pickling a document nested a thousand deep
    raises RecursionError on one rank while the others wait.
    """
    stack = [(obj, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return False
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, (list, dict)))
    return True


def _parse_variable(name: str, doc, nfiles: int, version: int) -> Variable:
    _expect(isinstance(doc, dict), f"variable {name!r} must be an object")
    _expect(_VARIABLE_KEYS.issuperset(doc), f"variable {name!r} has unknown keys {sorted(set(doc) - _VARIABLE_KEYS)}")
    kind = doc["kind"]
    _expect(kind in KINDS, f"variable {name!r} has unknown kind {kind!r}")
    dtype = dtype_from_json(doc["dtype"])
    shape = doc["shape"]
    _expect(isinstance(shape, list) and len(shape) <= _MAX_NDIM
            and all(type(s) is int and 0 <= s < _MAX_BYTES for s in shape), f"variable {name!r} has an invalid shape")
    _expect(kind != "ragged" or len(shape) >= 1, f"ragged variable {name!r} needs at least one axis")
    expected = 1
    for s in shape:
        expected *= s
    _expect(expected * dtype.itemsize <= _MAX_BYTES, f"variable {name!r} is implausibly large")
    codec = doc.get("codec", {"id": "none"})
    try:  # a whitelist: only known codec ids with type- and range-checked parameters (never imports or pickle)
        codec = check_codec_config(codec, dtype)
    except CorruptCheckpointError as exc:
        raise CorruptCheckpointError(f"variable {name!r}: {exc}") from None
    chunks = _parse_chunks(name, doc["chunks"], len(shape), nfiles, version)
    if len(chunks):
        bounds = np.asarray(shape, np.int64)  # start <= shape, then count <= shape - start: no int64 overflow
        _expect(bool(np.all(chunks.start <= bounds) and np.all(chunks.count <= bounds - chunks.start)),
                f"variable {name!r} has a chunk outside its global shape")
        volumes = np.prod(chunks.count, axis=1) if shape else np.ones(len(chunks), np.int64)
        if codec["id"] == "none":
            _expect(bool(np.all(chunks.nbytes == volumes * dtype.itemsize)),
                    f"variable {name!r} has a chunk whose length does not match its extent")
        else:  # stored = compressed bytes; their decoded size is checked against the extent on every read
            _expect(bool(np.all(chunks.nbytes <= max_stored_bytes(volumes * dtype.itemsize))),
                    f"variable {name!r} has a compressed chunk longer than any codec makes it")
        covered = int(volumes.sum())
    else:
        covered = 0
    _expect(covered == expected, f"variable {name!r}: chunks cover {covered} of {expected} elements")
    return Variable(name=name, kind=kind, dtype=dtype, shape=tuple(shape), chunks=chunks, codec=codec)


def _parse_chunks(name: str, doc, ndim: int, nfiles: int, version: int) -> ChunkTable:
    _expect(isinstance(doc, dict), f"chunks of {name!r} must be an object")
    if "data" in doc:  # the columnar form (format version 3 on)
        _expect(version >= 3, f"chunks of {name!r}: a columnar chunk table needs format version 3, not {version}")
        try:
            cols = chunk_columns.decode(doc, ndim)
        except CorruptCheckpointError as exc:
            raise CorruptCheckpointError(f"chunks of {name!r}: {exc}") from None
        _check_files(name, cols["file"], nfiles)
        return ChunkTable(cols["file"], cols["offset"], cols["nbytes"], cols["checksum"], cols["start"],
                          cols["count"], cols["hash"])
    _expect(_CHUNK_KEYS.issuperset(doc), f"chunks of {name!r} have unknown columns {sorted(set(doc) - _CHUNK_KEYS)}")
    cols = {key: doc[key] for key in ("file", "offset", "nbytes", "checksum", "start", "count")}
    n = len(cols["file"])
    for key in ("file", "offset", "nbytes", "checksum"):
        _expect(isinstance(cols[key], list) and len(cols[key]) == n, f"chunks of {name!r}: column {key!r} is malformed")
    for key in ("start", "count"):
        _expect(isinstance(cols[key], list) and len(cols[key]) == n * ndim,
                f"chunks of {name!r}: column {key!r} is malformed")
    ints = {key: _int_column(name, key, cols[key]) for key in ("file", "offset", "nbytes", "start", "count")}
    _check_files(name, ints["file"], nfiles)
    checksum = cols["checksum"]
    _expect(_hex_strings(checksum, 16), f"chunks of {name!r} have malformed checksums")
    hashes = doc.get("hash")
    if hashes is not None:  # optional column (incremental saves): a content hash per chunk
        _expect(isinstance(hashes, list) and len(hashes) == n and _content_hashes(hashes),
                f"chunks of {name!r}: column 'hash' is malformed")
    return ChunkTable(ints["file"], ints["offset"], ints["nbytes"], checksum,
                      ints["start"].reshape(n, ndim), ints["count"].reshape(n, ndim), hashes)


def _check_files(name: str, file: np.ndarray, nfiles: int) -> None:
    _expect(bool(np.all((file >= 0) & (file < nfiles))), f"chunks of {name!r} name a file that is not listed")


def _hex_strings(values: list, digits: int) -> bool:
    """Whether every value is a string of exactly ``digits`` lower-case hex digits.

    Checked column-wide (C loops: types, then lengths, then the characters of
    all of them joined), as the per-item test cost more than the JSON parse of
    a version with many chunks.  Not ``int(c, 16)``: it would also take "0x..",
    "+..", "_" and non-ASCII digits.
    """
    return (set(map(type, values)) <= {str} and set(map(len, values)) <= {digits}
            and _HEX_DIGITS.issuperset("".join(values)))


def _content_hashes(values: list) -> bool:
    """Whether every value is 32 hex digits (xxh3_128), optionally prefixed by ``mix128:`` (the device hash)."""
    if not set(map(type, values)) <= {str}:
        return False
    p = _DEVICE_HASH_PREFIX
    return _hex_strings([h[len(p):] if h.startswith(p) else h for h in values], 32)


def _int_column(name: str, key: str, values: list) -> np.ndarray:
    arr = np.asarray(values) if values else np.zeros(0, np.int64)
    _expect(arr.dtype.kind in "iu" and arr.ndim == 1, f"chunks of {name!r}: column {key!r} must hold integers")
    arr = arr.astype(np.int64, casting="safe") if arr.dtype.kind == "i" else _from_unsigned(arr)
    _expect(bool(np.all((arr >= 0) & (arr < _MAX_BYTES))), f"chunks of {name!r}: column {key!r} has values "
            "outside [0, 2^62)")
    return arr


def _from_unsigned(arr: np.ndarray) -> np.ndarray:
    _expect(bool(np.all(arr < (1 << 62))), "an integer column is out of range")
    return arr.astype(np.int64)


def check_relative_path(name) -> str:
    """A data file name must be a plain relative POSIX path inside the checkpoint directory,
    or ``@NAME/path``: such a path inside the sibling version NAME (same parent directory)."""
    _expect(isinstance(name, str) and 0 < len(name) <= 4096, "a file name must be a non-empty string")
    ref = split_reference(name)
    if ref is not None:
        _expect(is_reference_version(ref[0]) and bool(ref[1]) and not ref[1].startswith("@"),
                f"file name {name[:80]!r} is not a valid reference to another version")
        check_relative_path(ref[1])
        return name
    _expect("\x00" not in name and "\\" not in name, f"file name {name[:80]!r} has forbidden characters")
    _expect(not name.startswith("/"), f"file name {name[:80]!r} is absolute")
    parts = name.split("/")
    _expect(all(p not in ("", ".", "..") for p in parts) and posixpath.normpath(name) == name,
            f"file name {name[:80]!r} leaves the checkpoint directory or is not normalised")
    return name


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise CorruptCheckpointError(message)
