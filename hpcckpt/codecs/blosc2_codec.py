"""Lossless compression with C-Blosc2: ``codec="blosc2"``, ``"blosc2-lz4"``..., or ``hpcckpt.codecs.Blosc2(...)``.

The config stored in the metadata, e.g.
``{"id": "blosc2", "codec": "zstd", "clevel": 5, "filters": ["shuffle"], "typesize": 8, "blocksize": 0}``,
and the chunk layout (one or more C-Blosc2 chunks back to back, each decoded
by ``blosc2.decompress2``) are specified in docs/compression.md.

The ``blosc2`` package is imported only when a blosc2 variable is encoded or
decoded: hpcckpt imports, and reads every other codec, without it.

Untrusted streams: before blosc2 sees a chunk, its 32-byte header is checked
against a whitelist (blosc2 chunk format 3 to 5; compressors blosclz, lz4,
lz4hc, zstd; filters shuffle, bitshuffle, delta, bytedelta; no dictionary,
lazy, instrumented or "uninitialised" chunks; no user-defined codec or filter,
which C-Blosc2 would try to load as a plug-in) and its declared sizes against
the chunk's extent, so blosc2 only ever decodes into a buffer of exactly the
size the header declares.

Threads: a blosc2 call runs with the GIL released and may use several
threads of its own.  The save's codec thread pool (codecs/pipeline.py,
``codec_threads``) already compresses that many chunks at once, so a chunk
takes only the threads of the budget (:func:`set_threads`, the save's
``codec_threads``) that no other running blosc2 call holds: many chunks, one
thread each; one big chunk, all of them.  A load decodes one chunk at a time
(loading/reader.py) and gives it the whole budget (by default ``min(4, cores)``, as
the codec pool).
"""

from __future__ import annotations

import functools
import os
import struct
import threading

import numpy as np

from hpcckpt.errors import CheckpointError, CorruptCheckpointError
from hpcckpt.codecs.core import NAMES, Codec, CodecFamily, register_family

CODEC_ID = "blosc2"
#: compressor name -> (blosc2.Codec value, compcode of the header's flags bits 5-7)
COMPRESSORS = {"blosclz": (0, 0), "lz4": (1, 1), "lz4hc": (2, 1), "zstd": (5, 4)}
#: filter name -> blosc2.Filter value (the header's filter slots)
FILTERS = {"shuffle": 1, "bitshuffle": 2, "delta": 3, "bytedelta": 35}
MAX_FILTERS = 6
HEADER = struct.Struct("<BBBBiii6sBB6sBB")  # the 32-byte C-Blosc2 chunk header
HEADER_SIZE = HEADER.size
FORMAT_VERSIONS = (3, 4, 5)
#: The most bytes one C-Blosc2 chunk holds (BLOSC2_MAX_BUFFERSIZE); larger hpcckpt chunks are split.
MAX_PART = (1 << 31) - 1 - 32
#: hpcckpt splits a chunk into parts of at most this many bytes (a multiple of the typesize below it).
PART_BYTES = 1 << 30
DEFAULTS = {"codec": "zstd", "clevel": 5, "filters": ["shuffle"], "blocksize": 0}


def _blosc2():
    try:
        import blosc2  # imported lazily: only blosc2 variables need it
    except ImportError:
        raise CheckpointError("this variable's codec is blosc2: install the 'blosc2' package "
                              "(pip install blosc2)") from None
    return blosc2


@functools.cache
def available() -> bool:
    """Whether the blosc2 package can be imported (codec="auto" considers blosc2 only then)."""
    try:
        _blosc2()
    except CheckpointError:
        return False
    return True


# ---------------------------------------------------------------- threads

class _Budget:
    """Threads shared by the blosc2 calls of this process: each call gets at least one."""

    def __init__(self, size: int):
        self.size, self.used = size, 0
        self.lock = threading.Lock()

    def take(self) -> int:
        with self.lock:
            n = max(1, self.size - self.used)
            self.used += n
            return n

    def give(self, n: int) -> None:
        with self.lock:
            self.used -= n


_budget = _Budget(max(1, min(4, os.cpu_count() or 1)))  # pipeline.default_threads() until a save sets it


def set_threads(n: int) -> None:
    """The threads blosc2 calls of this process share (the save's codec_threads; the pipeline sets it)."""
    global _budget
    if _budget.size != n:
        _budget = _Budget(max(1, int(n)))


# ---------------------------------------------------------------- the user-facing spec

class Blosc2:
    """A C-Blosc2 codec spec.

    ``codec``: "zstd" (default), "lz4", "lz4hc" or "blosclz"; ``clevel`` 0 to 9
    (5); ``filters``: up to 6 of "shuffle", "bitshuffle", "delta", "bytedelta",
    applied in order (default ``("shuffle",)``; ``("shuffle", "bytedelta")``
    suits smooth floating-point fields); ``typesize``: the element size the
    filters use (default: the variable's itemsize, 1 above 255 bytes);
    ``blocksize``: bytes per blosc2 block, 0 for blosc2's choice.
    """

    def __init__(self, codec="zstd", clevel=5, filters=("shuffle",), typesize=None, blocksize=0):
        cfg = {"id": CODEC_ID, "codec": codec, "clevel": clevel, "filters": list(filters), "blocksize": blocksize}
        if typesize is not None:
            cfg["typesize"] = typesize
        self._config = check_blosc2_config(cfg, None, CheckpointError)

    def config(self) -> dict:
        return dict(self._config, filters=list(self._config["filters"]))

    def __repr__(self) -> str:
        return f"Blosc2({self._config})"


def default_typesize(dtype) -> int:
    itemsize = np.dtype(dtype).itemsize
    return itemsize if 1 <= itemsize <= 255 else 1


def check_blosc2_config(cfg, dtype, error=CorruptCheckpointError) -> dict:
    """The validated, normalised blosc2 config (``dtype`` None: typesize left open)."""
    if not isinstance(cfg, dict):
        raise error(f"a codec config must be an object, got {type(cfg).__name__}")
    extra = sorted(set(cfg) - {"id", "codec", "clevel", "filters", "typesize", "blocksize"})
    if cfg.get("id") != CODEC_ID or extra:
        raise error(f"a blosc2 config has unknown parameters {[str(k)[:40] for k in extra]}")
    codec = cfg.get("codec", DEFAULTS["codec"])
    if not isinstance(codec, str) or codec not in COMPRESSORS:
        raise error(f"unknown blosc2 compressor {str(codec)[:40]!r} (known: {sorted(COMPRESSORS)})")
    clevel = cfg.get("clevel", DEFAULTS["clevel"])
    if type(clevel) is not int or not 0 <= clevel <= 9:
        raise error(f"blosc2 'clevel' must be an integer in [0, 9], got {clevel!r}")
    filters = cfg.get("filters", DEFAULTS["filters"])
    if (not isinstance(filters, list) or len(filters) > MAX_FILTERS
            or not all(isinstance(f, str) and f in FILTERS for f in filters)):
        raise error(f"blosc2 'filters' must be a list of at most {MAX_FILTERS} of {sorted(FILTERS)}")
    blocksize = cfg.get("blocksize", DEFAULTS["blocksize"])
    if type(blocksize) is not int or not (blocksize == 0 or 4096 <= blocksize <= (1 << 30)):
        raise error(f"blosc2 'blocksize' must be 0 or an integer in [4096, 2^30], got {blocksize!r}")
    out = {"id": CODEC_ID, "codec": codec, "clevel": clevel, "filters": list(filters), "blocksize": blocksize}
    typesize = cfg.get("typesize")
    if typesize is None and dtype is not None:
        typesize = default_typesize(dtype)
    if typesize is not None:
        if type(typesize) is not int or not 1 <= typesize <= 255:
            raise error(f"blosc2 'typesize' must be an integer in [1, 255], got {typesize!r}")
        out["typesize"] = typesize
    return out


# ---------------------------------------------------------------- the codec

def parse_header(b, pos: int, remaining_out: int) -> tuple[int, int]:
    """(decoded bytes, stored bytes) of the C-Blosc2 chunk at ``b[pos:]``, its header whitelisted."""
    if len(b) - pos < HEADER_SIZE:
        raise CorruptCheckpointError("a blosc2 stream ends inside a chunk header")
    (version, _, flags, typesize, nbytes, blocksize, cbytes, filters, codec_id, codec_meta,
     filters_meta, reserved, flags2) = HEADER.unpack_from(b, pos)
    special = (flags2 >> 4) & 7
    compcode = flags >> 5
    if (version not in FORMAT_VERSIONS or flags & 0x05 != 0x05 or typesize == 0
            or codec_id not in {v for v, _ in COMPRESSORS.values()}
            or compcode not in (0, 1, 4)
            or not flags & 0x02 and compcode != dict(COMPRESSORS.values())[codec_id]  # 0x02: memcpyed
            or codec_meta or reserved
            or flags2 & 0x8F or special > 3):
        raise CorruptCheckpointError("a blosc2 chunk header names a format, compressor or flag hpcckpt "
                                     "does not read")
    for f, meta in zip(filters, filters_meta):
        if f not in (0, *FILTERS.values()) or meta != (typesize if f == FILTERS["bytedelta"] else 0):
            raise CorruptCheckpointError(f"a blosc2 chunk header names filter {f} (meta {meta}), which hpcckpt "
                                         "does not read")
    if not 0 < nbytes <= remaining_out or not HEADER_SIZE <= cbytes <= len(b) - pos or blocksize <= 0:
        raise CorruptCheckpointError(f"a blosc2 chunk declares {nbytes} decoded and {cbytes} stored bytes where "
                                     f"at most {remaining_out} and {len(b) - pos} remain")
    return nbytes, cbytes


class Blosc2Codec(Codec):
    """``blosc2``: see the module docstring and docs/compression.md."""

    def __init__(self, config: dict, dtype):
        self.config = config
        blosc2 = _blosc2()
        self._blosc2 = blosc2
        self.typesize = config["typesize"]
        filters = [blosc2.Filter(FILTERS[f]) for f in config["filters"]]
        self.cparams = {"codec": blosc2.Codec(COMPRESSORS[config["codec"]][0]), "clevel": config["clevel"],
                        "filters": filters, "filters_meta": [0] * len(filters), "typesize": self.typesize,
                        "blocksize": config["blocksize"], "splitmode": blosc2.SplitMode.AUTO_SPLIT}

    def part_bytes(self) -> int:
        return max(self.typesize, PART_BYTES // self.typesize * self.typesize)

    def encode(self, arr):
        data = arr.reshape(-1).view(np.uint8)
        if data.nbytes == 0:
            return np.zeros(0, np.uint8)
        step = self.part_bytes()
        threads = _budget.take()
        try:
            parts = [self._blosc2.compress2(data[i:i + step], nthreads=threads, **self.cparams)
                     for i in range(0, data.nbytes, step)]
        finally:
            _budget.give(threads)
        if len(parts) == 1:
            return np.frombuffer(parts[0], np.uint8)
        return np.frombuffer(b"".join(parts), np.uint8)

    def decode(self, stored, out):
        b = memoryview(np.ascontiguousarray(stored).reshape(-1).view(np.uint8))
        if out.nbytes == 0:
            if len(b):
                raise CorruptCheckpointError("a blosc2 stream holds bytes where none were expected")
            return
        pos = done = 0
        parts = []
        while pos < len(b):  # every header checked before anything is decoded
            nbytes, cbytes = parse_header(b, pos, out.nbytes - done)
            parts.append((pos, cbytes, done, nbytes))
            pos += cbytes
            done += nbytes
        if done != out.nbytes:
            raise CorruptCheckpointError(f"a blosc2 stream declares {done} decoded bytes where {out.nbytes} "
                                         f"were expected")
        threads = _budget.take()
        try:
            for pos, cbytes, start, nbytes in parts:
                try:
                    self._blosc2.decompress2(b[pos:pos + cbytes], dst=out[start:start + nbytes], nthreads=threads)
                except Exception as exc:  # blosc2 raises ValueError/RuntimeError for damaged streams
                    raise CorruptCheckpointError(f"blosc2 cannot decompress a chunk: {exc}") from None
        finally:
            _budget.give(threads)


def _make(config, dtype) -> Blosc2Codec:
    return Blosc2Codec(config, dtype)


register_family(CODEC_ID, CodecFamily(check=check_blosc2_config, make=_make, spec_type=Blosc2))

#: The names (codec="blosc2"...): blosc2 with the byte shuffle; "blosc2" is "blosc2-zstd".
BLOSC2_NAMES = {
    "blosc2": ("zstd", 5), "blosc2-zstd": ("zstd", 5), "blosc2-lz4": ("lz4", 5),
    "blosc2-lz4hc": ("lz4hc", 5), "blosc2-blosclz": ("blosclz", 5),
}
for _name, (_codec, _clevel) in BLOSC2_NAMES.items():
    NAMES[_name] = (lambda codec, clevel: lambda itemsize: {
        "id": CODEC_ID, "codec": codec, "clevel": clevel, "filters": ["shuffle"], "blocksize": 0,
        "typesize": itemsize if 1 <= itemsize <= 255 else 1})(_codec, _clevel)
