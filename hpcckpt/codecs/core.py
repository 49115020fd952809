"""Codec objects, their JSON configs, and the whitelist that untrusted configs are checked against.

A variable's codec is stored in the metadata as one JSON object (its config):

* ``{"id": "none"}``: the chunk's bytes are the array's C-ordered bytes;
* a numcodecs config, ``{"id": "blosc", ...}``, ``{"id": "zstd", ...}`` or
  ``{"id": "lz4", ...}``: decodable by ``numcodecs.get_codec(config)`` alone;
* ``{"id": "hpcckpt.chain", "codecs": [filter..., compressor]}``: numcodecs
  configs applied in order on write and in reverse on read (the filter is a
  byte ``shuffle``), so again numcodecs alone decodes it;
* ``{"id": "hpcckpt.quantize", "abs" | "rel": bound, "compressor": {...}}``:
  the error-bounded lossy codec of lossy.py (its chunk layout is in
  docs/compression.md).

Configs read from disk are untrusted: :func:`from_config` accepts only the ids
above, with every parameter type- and range-checked, and never imports or
unpickles anything a config names.  Every decode checks that the decoded size
is exactly the chunk's extent.
"""

from __future__ import annotations

import struct
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable

import numpy as np

from hpcckpt.errors import CheckpointError, CorruptCheckpointError

NONE = {"id": "none"}
#: The named codecs (``codec="lz4"``...) and the configs they stand for; ``{itemsize}`` is the dtype's.
NAMES = {
    "none": lambda itemsize: dict(NONE),
    "lz4": lambda itemsize: {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1, "blocksize": 0},
    "zstd": lambda itemsize: {"id": "blosc", "cname": "zstd", "clevel": 3, "shuffle": 1, "blocksize": 0},
    "lz4hc": lambda itemsize: {"id": "blosc", "cname": "lz4hc", "clevel": 5, "shuffle": 1, "blocksize": 0},
    "shuffle+lz4": lambda itemsize: {"id": "hpcckpt.chain", "codecs": [
        {"id": "shuffle", "elementsize": itemsize}, {"id": "lz4", "acceleration": 1}]},
    "shuffle+zstd": lambda itemsize: {"id": "hpcckpt.chain", "codecs": [
        {"id": "shuffle", "elementsize": itemsize}, {"id": "zstd", "level": 1, "checksum": False}]},
}
AUTO = "auto"
_BLOSC_CNAMES = ("lz4", "lz4hc", "zstd", "blosclz", "zlib")
_MAX_CHAIN = 4


def _numcodecs():
    import numcodecs  # imported lazily: reading an uncompressed checkpoint does not need it

    return numcodecs


class Codec(ABC):
    """One variable's codec: ``encode`` a C-contiguous array to stored bytes, ``decode`` them back.

    Call order: the save makes one codec object per variable from its config
    (``from_config``, after rank 0 chose it) and calls ``encode`` once per chunk,
    from the codec threads (so ``encode`` must be thread-safe); the load makes
    one per variable from the validated config in the metadata and calls
    ``decode`` once per chunk read, after the chunk's checksum was verified.

    ``config`` is what the metadata stores (a reader in another language
    decodes it from docs/compression.md alone); ``lossy`` is the capability
    flag that a decoded chunk may differ from the saved one (within the bound
    its config records).  A new codec family registers itself with
    :func:`register_family` and passes ``hpcckpt.testing.CodecTests``.
    """

    lossy = False
    config: dict

    @abstractmethod
    def encode(self, arr: np.ndarray) -> np.ndarray:
        """The stored bytes (flat uint8) of the C-contiguous chunk ``arr``."""

    @abstractmethod
    def decode(self, stored: np.ndarray, out: np.ndarray) -> None:
        """Fill ``out`` (uint8, exactly the chunk's decoded size) from ``stored``; CorruptCheckpointError if bad.

        Every size the stream declares is checked against ``out`` before
        anything is written into it: a crafted stream never over- or under-fills it.
        """

    @property
    def is_none(self) -> bool:
        return self.config["id"] == "none"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config})"


class NoneCodec(Codec):
    def __init__(self):
        self.config = dict(NONE)

    def encode(self, arr):
        return arr.reshape(-1).view(np.uint8)

    def decode(self, stored, out):
        if stored.nbytes != out.nbytes:
            raise CorruptCheckpointError(f"stored {stored.nbytes} bytes where {out.nbytes} were expected")
        out[...] = stored


# ---------------------------------------------------------------- lossless stages (numcodecs)

#: Bytes 0 and 1 of every c-blosc 1.x chunk: the blosc format version and its compressors' format version.
BLOSC_VERSIONS = (2, 1)


def decoded_size(config: dict, stored) -> int | None:
    """The decoded size a compressed buffer declares in its own header (None when it cannot tell).

    A blosc chunk of another format than c-blosc 1.x's (BLOSC_VERSIONS: a C-Blosc2 chunk, or an unknown
    version) is CorruptCheckpointError: it belongs to no blosc chunk hpcckpt writes (docs/compression.md).
    """
    b = memoryview(stored).cast("B")
    cid = config["id"]
    if cid == "blosc":
        if len(b) < 16:
            return None
        if (b[0], b[1]) != BLOSC_VERSIONS:
            raise CorruptCheckpointError(f"a blosc chunk header says format version {b[0]} (compressor format "
                                         f"{b[1]}); hpcckpt reads c-blosc 1.x chunks, versions {BLOSC_VERSIONS}")
        nbytes, _, cbytes = struct.unpack_from("<III", b, 4)
        return nbytes if cbytes == len(b) else None
    if cid == "lz4":
        return struct.unpack_from("<I", b, 0)[0] if len(b) >= 4 else None
    if cid == "zstd":
        return _zstd_content_size(b)
    return None


ZSTD_MAGIC = 0xFD2FB528


def zstd_frames(b) -> list[tuple[int, int, int]] | None:
    """``(start, end, decoded size)`` of each Zstandard frame of a stream of concatenated frames (RFC 8878).

    None when the stream is malformed, or when a frame does not declare its
    decoded size (the decoders here need it).  numcodecs' Zstd writes one
    frame; nvCOMP on a GPU writes one per sub-chunk (codecs/nvcomp.py), and
    numcodecs decodes both.  Only headers are read: one step per block.
    """
    frames, pos, n = [], 0, len(b)
    while pos < n:
        start = pos
        if n - pos < 6 or int.from_bytes(bytes(b[pos:pos + 4]), "little") != ZSTD_MAGIC:
            return None
        fhd = int(b[pos + 4])
        fcs_flag, single, checksum, did_flag = fhd >> 6, (fhd >> 5) & 1, (fhd >> 2) & 1, fhd & 3
        pos += 5 + (0 if single else 1) + (0, 1, 2, 4)[did_flag]
        size = (1 if single else 0, 2, 4, 8)[fcs_flag]
        if size == 0 or pos + size > n:
            return None
        content = int.from_bytes(bytes(b[pos:pos + size]), "little") + (256 if size == 2 else 0)
        pos += size
        last = False
        while not last:
            if pos + 3 > n:
                return None
            header = int.from_bytes(bytes(b[pos:pos + 3]), "little")
            last, kind, block = header & 1, (header >> 1) & 3, header >> 3
            if kind == 3:
                return None
            pos += 3 + (1 if kind == 1 else block)
        pos += 4 * checksum
        if pos > n:
            return None
        frames.append((start, pos, content))
    return frames


def _zstd_content_size(b) -> int | None:
    frames = zstd_frames(b)
    return sum(f[2] for f in frames) if frames else None


class Compressor:
    """A whitelisted lossless numcodecs codec with size-checked decoding."""

    def __init__(self, config: dict):
        self.config = config
        cfg = dict(config)
        cid = cfg.pop("id")
        nc = _numcodecs()
        self._codec = {"blosc": nc.Blosc, "zstd": nc.Zstd, "lz4": nc.LZ4}[cid](**cfg)

    def compress(self, data) -> np.ndarray:
        if data.nbytes == 0:
            return np.zeros(0, np.uint8)
        return np.frombuffer(self._codec.encode(data), np.uint8)

    def decompress(self, stored, out: np.ndarray) -> None:
        if out.nbytes == 0:
            if stored.nbytes:
                raise CorruptCheckpointError("a compressed stream holds bytes where none were expected")
            return
        declared = decoded_size(self.config, stored)
        if declared != out.nbytes:
            raise CorruptCheckpointError(
                f"a {self.config['id']} stream declares {declared} decoded bytes where {out.nbytes} were expected")
        try:
            self._codec.decode(stored, out=out)
        except Exception as exc:  # numcodecs raises RuntimeError/ValueError for damaged streams
            raise CorruptCheckpointError(f"{self.config['id']} cannot decompress a chunk: {exc}") from None


class NumcodecsCodec(Codec):
    """A single numcodecs compressor (blosc with its own shuffle, zstd, lz4)."""

    def __init__(self, config: dict):
        self.config = config
        self.compressor = Compressor(config)

    def encode(self, arr):
        return self.compressor.compress(arr)

    def decode(self, stored, out):
        self.compressor.decompress(stored, out)


class ChainCodec(Codec):
    """Byte-shuffle filter(s) then one compressor: ``{"id": "hpcckpt.chain", "codecs": [...]}``.

    The CPU path uses numcodecs' own Shuffle, so that the GPU path (kernels.shuffle
    on the device) is checked against an independent implementation.
    """

    def __init__(self, config: dict):
        self.config = config
        nc = _numcodecs()
        self.filters = [nc.Shuffle(elementsize=c["elementsize"]) for c in config["codecs"][:-1]]
        self.compressor = Compressor(config["codecs"][-1])

    def encode(self, arr):
        data = arr.reshape(-1).view(np.uint8)
        for f in self.filters:
            data = np.asarray(f.encode(data)).view(np.uint8)
        return self.compressor.compress(data)

    def decode(self, stored, out):
        if not self.filters:
            self.compressor.decompress(stored, out)
            return
        tmp = np.empty(out.nbytes, np.uint8)
        self.compressor.decompress(stored, tmp)
        for i, f in enumerate(reversed(self.filters)):
            if out.nbytes % f.elementsize:
                raise CorruptCheckpointError("a shuffled chunk is not a whole number of elements")
            dest = out if i == len(self.filters) - 1 else np.empty(out.nbytes, np.uint8)
            f.decode(tmp, out=dest)
            tmp = dest


# ---------------------------------------------------------------- validation (the whitelist)

def _check(cond: bool, message: str, error) -> None:
    if not cond:
        raise error(message)


def _int(cfg, key, lo, hi, error, default=None):
    value = cfg.get(key, default)
    _check(type(value) is int and lo <= value <= hi, f"codec parameter {key!r} must be an integer in "
           f"[{lo}, {hi}], got {value!r}", error)
    return value


def _keys(cfg, allowed, error):
    extra = sorted(set(cfg) - set(allowed) - {"id"})
    _check(not extra, f"codec {cfg.get('id')!r} has unknown parameters {extra}", error)


def check_compressor(cfg, error=CorruptCheckpointError) -> dict:
    """Validate a lossless compressor config (blosc, zstd, lz4); the normalised config."""
    _check(isinstance(cfg, dict), f"a codec config must be an object, got {type(cfg).__name__}", error)
    cid = cfg.get("id")
    if cid == "blosc":
        _keys(cfg, ("cname", "clevel", "shuffle", "blocksize", "typesize"), error)
        cname = cfg.get("cname", "lz4")
        _check(cname in _BLOSC_CNAMES, f"unknown blosc compressor {cname!r}", error)
        out = {"id": "blosc", "cname": cname, "clevel": _int(cfg, "clevel", 0, 9, error, 5),
               "shuffle": _int(cfg, "shuffle", -1, 2, error, 1),
               "blocksize": _int(cfg, "blocksize", 0, 1 << 31, error, 0)}
        if cfg.get("typesize") is not None:
            out["typesize"] = _int(cfg, "typesize", 1, 255, error)
        return out
    if cid == "zstd":
        _keys(cfg, ("level", "checksum"), error)
        checksum = cfg.get("checksum", False)
        _check(type(checksum) is bool, "zstd 'checksum' must be a boolean", error)
        return {"id": "zstd", "level": _int(cfg, "level", -131072, 22, error, 0), "checksum": checksum}
    if cid == "lz4":
        _keys(cfg, ("acceleration",), error)
        return {"id": "lz4", "acceleration": _int(cfg, "acceleration", 1, 1 << 16, error, 1)}
    raise error(f"codec {str(cid)[:40]!r} is not a known lossless compressor (known: blosc, zstd, lz4)")


@dataclass(frozen=True)
class CodecFamily:
    """A codec id that a module beyond this one implements, registered by that module (no import cycle).

    ``check(config, dtype, error)``: the validated, normalised config (raises
    ``error``); ``make(config, dtype)``: the codec object of a validated config;
    ``spec_type``: the user-facing spec class whose ``config()`` is its JSON form.
    """

    check: Callable[[dict, np.dtype, type], dict]
    make: Callable[[dict, np.dtype], "Codec"]
    spec_type: type


#: codec id -> family, filled by the family's own module when hpcckpt.codecs is imported (lossy.py).
FAMILIES: dict[str, CodecFamily] = {}


def register_family(codec_id: str, family: CodecFamily) -> None:
    """Make ``codec_id`` known to check_config, from_config and spec_to_json."""
    FAMILIES[codec_id] = family


#: spec id -> a user-facing spec class whose ``config()`` names a choice made at save time, never a stored codec
#: (``AutoLossy``, auto_lossy.py); filled by that module.
SPEC_TYPES: dict[str, type] = {}


def register_spec(spec_id: str, spec_type: type) -> None:
    """Make ``spec_type`` a codec spelling of spec_to_json whose JSON form (id ``spec_id``) resolve refuses."""
    SPEC_TYPES[spec_id] = spec_type


def check_config(cfg, dtype, error=CorruptCheckpointError) -> dict:
    """Validate any variable codec config for a variable of ``dtype``; the normalised config."""
    _check(isinstance(cfg, dict), f"a codec config must be an object, got {type(cfg).__name__}", error)
    cid = cfg.get("id")
    if cid == "none":
        _keys(cfg, (), error)
        return dict(NONE)
    if cid == "hpcckpt.chain":
        _keys(cfg, ("codecs",), error)
        codecs = cfg.get("codecs")
        _check(isinstance(codecs, list) and 1 <= len(codecs) <= _MAX_CHAIN,
               f"a codec chain lists 1 to {_MAX_CHAIN} codecs", error)
        filters = []
        for f in codecs[:-1]:
            _check(isinstance(f, dict) and f.get("id") == "shuffle", "only 'shuffle' filters may precede "
                   "the compressor of a chain", error)
            _keys(f, ("elementsize",), error)
            filters.append({"id": "shuffle", "elementsize": _int(f, "elementsize", 1, 1 << 16, error)})
        return {"id": "hpcckpt.chain", "codecs": filters + [check_compressor(codecs[-1], error)]}
    if cid in FAMILIES:
        return FAMILIES[cid].check(cfg, dtype, error)
    return check_compressor(cfg, error)


def from_config(cfg, dtype, error=CorruptCheckpointError) -> Codec:
    """The codec object for a (validated here) config of a variable of ``dtype``."""
    cfg = check_config(cfg, dtype, error)
    cid = cfg["id"]
    if cid == "none":
        return NoneCodec()
    if cid == "hpcckpt.chain":
        return ChainCodec(cfg)
    if cid in FAMILIES:
        return FAMILIES[cid].make(cfg, dtype)
    return NumcodecsCodec(cfg)


def max_stored_bytes(raw_bytes: int) -> int:
    """An upper bound on the stored size of a chunk of ``raw_bytes`` with any codec (for metadata validation)."""
    return 2 * raw_bytes + 4096


def spec_to_json(spec):
    """The JSON-able form of a user's codec spec (a name, a Lossy, a numcodecs codec, a config dict, None)."""
    if spec is None or isinstance(spec, str):
        return spec
    if any(isinstance(spec, t) for t in [f.spec_type for f in FAMILIES.values()] + list(SPEC_TYPES.values())):
        return spec.config()
    if isinstance(spec, dict):
        return dict(spec)
    get_config = getattr(spec, "get_config", None)
    if callable(get_config) and hasattr(spec, "codec_id"):
        return get_config()
    raise CheckpointError(f"codec must be a name, hpcckpt.codecs.Lossy, a numcodecs codec or a config dict; "
                          f"got {type(spec).__name__}")


def resolve(spec, dtype) -> Codec:
    """The codec object for a user's spec (JSON form) and a variable's dtype; CheckpointError if unusable.

    ``"auto"`` and the SPEC_TYPES are not resolved here (see auto.py, auto_lossy.py).
    """
    dtype = np.dtype(dtype)
    spec = spec_to_json(spec)
    if spec is None:
        return NoneCodec()
    if isinstance(spec, str):
        if spec not in NAMES:
            raise CheckpointError(f"unknown codec {spec!r}; known: {sorted(NAMES) + [AUTO]}")
        spec = NAMES[spec](dtype.itemsize)
    if isinstance(spec, dict) and spec.get("id") in SPEC_TYPES:
        raise CheckpointError(f"codec {spec['id']!r} is chosen per variable by a save, it is not a codec itself")
    return from_config(spec, dtype, error=CheckpointError)
