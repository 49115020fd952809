"""nvCOMP (``nvidia-nvcomp-cu12``/``-cu13``) as the device-side Zstd stage of chain codecs: opt-in.

Off unless ``HPCCKPT_NVCOMP=1``: the default device shuffle + host zstd is
the faster pipeline where it was compared (bench/gpu_bench.py; the figures
are in docs/compression.md).

nvCOMP is fast only on many independent chunks at once, not on one whole
chunk compressed as one raw stream.  So a chunk is cut into ``SUB_BYTES``
sub-chunks that nvCOMP compresses in one batch, each into one standard
Zstandard frame (nvCOMP's RAW bitstream).  The stored bytes are those frames,
concatenated: still exactly what numcodecs' Zstd decodes (a Zstandard stream
may hold several frames), so what a GPU writes a CPU reads.  Every frame must
declare its decoded size (core.zstd_frames checks them all on read); a batch
whose frames do not is compressed again on the host and nvCOMP is not used
again in this process.

LZ4 stays on the host: numcodecs' LZ4 layout is one block per chunk, which
cannot be split into sub-chunks, and one 8 MiB block is the slow case above.
On load, nvCOMP decodes streams of at least ``MIN_FRAMES`` frames (GPU-written
ones); a CPU-written single-frame chunk is decompressed on the host (faster, see
above) and its bytes copied to the device.

Anything nvCOMP cannot do (not installed, an older API, an error) falls back
to the host codec: nvCOMP only ever changes where the work runs, never what is
stored.  :func:`status` says what is used and why not (bench/gpu_check.sh
prints it).
"""

from __future__ import annotations

import os
import threading

import numpy as np

from hpcckpt.core.devices import to_host
from hpcckpt.codecs.core import zstd_frames

#: Sub-chunk size: nvCOMP's own default chunk for Zstd (enough sub-chunks per chunk to fill the GPU).
SUB_BYTES = 64 << 10
#: Device decoding pays only with this many frames to decode in parallel.
MIN_FRAMES = 8
#: The environment variable that turns nvCOMP on ("1").
ENABLE = "HPCCKPT_NVCOMP"
_OFF = (f"off (set {ENABLE}=1 to use it; on an H200 it was slower than device shuffle + host zstd, "
        "docs/compression.md)")
_local = threading.local()  # nvCOMP Codec objects keep scratch state: one per thread
_disabled: dict[str, str] = {}  # "zstd" -> why nvCOMP is not used


def status() -> dict[str, str]:
    """``{"zstd": "nvCOMP <version>"}`` when the device path is on and usable, else why not."""
    if os.environ.get(ENABLE) != "1":
        return {"zstd": _OFF}
    if _codec() is None:
        return {"zstd": _disabled["zstd"]}
    from nvidia import nvcomp  # noqa: PLC0415

    return {"zstd": f"nvCOMP {getattr(nvcomp, '__version__', '?')}"}


def _codec():
    """This thread's nvCOMP Zstd codec, or None when off or unusable."""
    if os.environ.get(ENABLE) != "1" or "zstd" in _disabled:
        return None
    if not hasattr(_local, "codec"):
        try:
            from nvidia import nvcomp  # noqa: PLC0415

            _local.codec = nvcomp.Codec(algorithm="Zstd", bitstream_kind=nvcomp.BitstreamKind.RAW)
        except Exception as exc:  # noqa: BLE001 - not installed, no device, an older API: use the host
            _disabled["zstd"] = f"unusable: {type(exc).__name__}: {exc}"
            return None
    return _local.codec


def compress(config: dict, data):
    """The stored bytes (host uint8) of the compressor ``config`` for the device uint8 array ``data``,
    compressed by nvCOMP; None when the host codec must do it (not zstd, nvCOMP unusable)."""
    if config["id"] != "zstd" or not data.nbytes:
        return None
    codec = _codec()
    if codec is None:
        return None
    try:
        import cupy  # noqa: PLC0415
        from nvidia import nvcomp  # noqa: PLC0415

        cupy.cuda.Device().synchronize()  # nvCOMP runs on its own stream: the data must be ready
        parts = [nvcomp.as_array(data[i:i + SUB_BYTES]) for i in range(0, data.nbytes, SUB_BYTES)]
        frames = [cupy.asarray(f).view(np.uint8).reshape(-1) for f in codec.encode(nvcomp.as_arrays(parts))]
        cupy.cuda.Device().synchronize()
        stored = to_host(cupy.concatenate(frames))
    except Exception as exc:  # noqa: BLE001
        _disabled["zstd"] = f"failed: {type(exc).__name__}: {exc}"
        return None
    found = zstd_frames(stored)
    if found is None or sum(f[2] for f in found) != data.nbytes:
        _disabled["zstd"] = "not used: its zstd frames do not declare their decoded size (the CPU decoder needs it)"
        return None
    return stored


def decompress(config: dict, stored: np.ndarray, out) -> bool:
    """Decode the verified host bytes ``stored`` into the device uint8 array ``out`` with nvCOMP.

    False (the host decodes instead, and names a damaged stream) when the
    stream is not zstd, has fewer than MIN_FRAMES frames, does not add up to
    ``out``, or nvCOMP fails.
    """
    if config["id"] != "zstd":
        return False
    frames = zstd_frames(stored)
    if frames is None or len(frames) < MIN_FRAMES or sum(f[2] for f in frames) != out.nbytes:
        return False
    codec = _codec()
    if codec is None:
        return False
    try:
        import cupy  # noqa: PLC0415
        from nvidia import nvcomp  # noqa: PLC0415

        source = cupy.asarray(stored)
        cupy.cuda.Device().synchronize()
        decoded = codec.decode(nvcomp.as_arrays([nvcomp.as_array(source[a:b]) for a, b, _ in frames]))
        cupy.cuda.Device().synchronize()
        pos = 0
        for part, (_, _, size) in zip(decoded, frames):
            part = cupy.asarray(part).view(np.uint8).reshape(-1)
            if part.nbytes != size:
                return False
            out[pos:pos + size] = part
            pos += size
    except Exception:  # noqa: BLE001 - the host decoder decides
        return False
    return True
