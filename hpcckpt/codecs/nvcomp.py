"""nvCOMP (``nvidia-nvcomp-cu12``/``-cu13``) as the device-side lossless stage of chain codecs.

The stored bytes stay exactly the numcodecs formats that the CPU path writes
and reads, so what a GPU writes a CPU reads and the other way round:

* ``{"id": "lz4"}``: numcodecs' LZ4 layout is a 4-byte little-endian decoded
  size followed by one raw LZ4 block.  nvCOMP's RAW bitstream of LZ4 is such a
  block; the header is added on the host.
* ``{"id": "zstd"}``: numcodecs' Zstd stores one standard Zstandard frame,
  which nvCOMP's RAW zstd writes too.  The CPU decoder needs the frame to
  declare its decoded size; a frame that does not is compressed again on the
  host, and nvCOMP's zstd is not used again in this process.

Anything nvCOMP cannot do (not installed, a chunk over its largest raw chunk
of 16 MiB, an error) falls back to the host codec: nvCOMP only ever makes a
save or load faster, never different.  :func:`status` says what was used and
why not (bench/gpu_check.sh prints it).
"""

from __future__ import annotations

import struct
import threading

import numpy as np

from ..devices import to_host
from ..errors import CorruptCheckpointError
from .core import decoded_size

#: The largest chunk nvCOMP compresses as one raw block (LZ4 and Zstd alike).
MAX_RAW_BYTES = 1 << 24
_ALGORITHMS = {"lz4": "LZ4", "zstd": "Zstd"}
_local = threading.local()  # nvCOMP Codec objects keep scratch state: one per thread and algorithm
_disabled: dict[str, str] = {}  # numcodecs id -> why nvCOMP is not used for it


def status() -> dict[str, str]:
    """Per compressor id: "nvCOMP <version>" when the device path is usable, else the reason it is not."""
    out = {}
    for cid in _ALGORITHMS:
        if cid in _disabled:
            out[cid] = _disabled[cid]
        elif _codec(cid) is not None:
            from nvidia import nvcomp  # noqa: PLC0415

            out[cid] = f"nvCOMP {getattr(nvcomp, '__version__', '?')}"
        else:
            out[cid] = _disabled[cid]
    return out


def _codec(cid: str):
    """This thread's nvCOMP codec for the numcodecs compressor id ``cid``, or None when unusable."""
    if cid not in _ALGORITHMS or cid in _disabled:
        return None
    cache = _local.__dict__.setdefault("codecs", {})
    if cid not in cache:
        try:
            from nvidia import nvcomp  # noqa: PLC0415

            cache[cid] = nvcomp.Codec(algorithm=_ALGORITHMS[cid], bitstream_kind=nvcomp.BitstreamKind.RAW)
        except Exception as exc:  # noqa: BLE001 - not installed, no device, an older API: use the host
            _disabled[cid] = f"nvCOMP unusable: {type(exc).__name__}: {exc}"
            return None
    return cache[cid]


def _usable(config: dict, nbytes: int):
    return _codec(config["id"]) if 0 < nbytes <= MAX_RAW_BYTES else None


def compress(config: dict, data):
    """The stored bytes (a host uint8 array) of the numcodecs compressor ``config`` for the device uint8 array
    ``data``, compressed by nvCOMP on the device; None when the host codec must do it."""
    codec = _usable(config, int(data.nbytes))
    if codec is None:
        return None
    cid = config["id"]
    try:
        import cupy  # noqa: PLC0415
        from nvidia import nvcomp  # noqa: PLC0415

        cupy.cuda.Device().synchronize()  # nvCOMP runs on its own stream: the data must be ready
        compressed = cupy.asarray(codec.encode(nvcomp.as_array(data))).view(np.uint8).reshape(-1)
        cupy.cuda.Device().synchronize()
        body = to_host(compressed)
    except Exception as exc:  # noqa: BLE001
        _disabled[cid] = f"nvCOMP {cid} failed: {type(exc).__name__}: {exc}"
        return None
    if cid == "lz4":
        stored = np.empty(4 + body.nbytes, np.uint8)
        stored[:4] = np.frombuffer(struct.pack("<I", int(data.nbytes)), np.uint8)
        stored[4:] = body
        return stored
    if decoded_size(config, body) != data.nbytes:
        _disabled[cid] = "nvCOMP's zstd frames do not declare their decoded size (the CPU decoder needs it)"
        return None
    return body


def decompress(config: dict, stored: np.ndarray, out) -> bool:
    """Decode the host bytes ``stored`` into the device uint8 array ``out`` with nvCOMP; False to use the host.

    The declared size is checked first (CorruptCheckpointError), as on the host.
    """
    codec = _usable(config, int(out.nbytes))
    if codec is None:
        return False
    declared = decoded_size(config, stored)
    if declared != out.nbytes:
        raise CorruptCheckpointError(
            f"a {config['id']} stream declares {declared} decoded bytes where {out.nbytes} were expected")
    body = stored[4:] if config["id"] == "lz4" else stored
    try:
        import cupy  # noqa: PLC0415
        from nvidia import nvcomp  # noqa: PLC0415

        source = cupy.asarray(body)
        cupy.cuda.Device().synchronize()
        decoded = cupy.asarray(codec.decode(nvcomp.as_array(source))).view(np.uint8).reshape(-1)
        cupy.cuda.Device().synchronize()
    except Exception:  # noqa: BLE001 - the host decoder decides (and names a damaged stream)
        return False
    if decoded.nbytes != out.nbytes:
        return False
    out[...] = decoded
    return True
