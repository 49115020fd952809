"""The device side of the codecs: encode a (CuPy) array on its device, decode into one.

The filters run where the data is, through kernels.py with ``xp`` = cupy, so
that only filtered bytes cross to the host (for ``hpcckpt.quantize`` these are
the narrow integer deltas: 2 bytes per float64 element instead of 8 at a
typical 1e-4 bound).  The lossless stage then runs on the host with numcodecs;
the stored bytes are exactly those of the CPU codec, whatever device wrote
them (tests/test_codecs_kernels.py runs these functions with ``xp`` = numpy and
compares bytes with the CPU codecs; tests/gpu/ does it with CuPy).

Codecs without device filters (blosc, which shuffles inside its own frames)
are encoded on the host after one device-to-host copy.

Not done yet: nvCOMP for the lossless stage on the device (the
``nvidia-nvcomp-cu12`` package), and CuPy arrays as ``Block`` locals in
save/load (state.py accepts numpy arrays only); see docs/compression.md.
"""

from __future__ import annotations

import numpy as np

from .core import ChainCodec, Codec, NoneCodec
from .lossy import QuantizeCodec
from . import kernels


def array_module(arr):
    """numpy or cupy, whichever ``arr`` belongs to (cupy is imported only for a CuPy array)."""
    if isinstance(arr, np.ndarray):
        return np
    import cupy  # noqa: PLC0415 - only on GPU ranks

    return cupy.get_array_module(arr)


class _PinnedPool:
    """Reused page-locked host buffers, one per size class, for device-to-host copies."""

    def __init__(self):
        self._buffers: dict[int, np.ndarray] = {}

    def to_host(self, xp, arr) -> np.ndarray:
        if xp is np:
            return arr
        import cupyx  # noqa: PLC0415

        n = int(arr.nbytes)
        size = 1 << max(20, (n - 1).bit_length())
        buf = self._buffers.get(size)
        if buf is None:
            buf = self._buffers[size] = cupyx.empty_pinned(size, np.uint8)
        host = buf[:n].view(arr.dtype).reshape(arr.shape)
        arr.get(out=host)
        return host


_pool = _PinnedPool()


def to_host(xp, arr) -> np.ndarray:
    return _pool.to_host(xp, xp.ascontiguousarray(arr))


def device_encode(codec: Codec, x, xp=None) -> np.ndarray:
    """The stored bytes of the chunk ``x`` (a C-contiguous array of module ``xp``), filtered on its device."""
    xp = xp or array_module(x)
    if isinstance(codec, QuantizeCodec):
        fields, streams = codec.filter(xp, x)
        return codec.finish(fields, [to_host(xp, s) for s in streams])
    if isinstance(codec, ChainCodec):
        data = x.reshape(-1).view(np.uint8)
        for f in codec.filters:
            data = kernels.shuffle(xp, data, f.elementsize)
        return codec.compressor.compress(np.array(to_host(xp, data), copy=xp is not np))
    host = to_host(xp, x)
    if isinstance(codec, NoneCodec):
        return np.array(host.reshape(-1).view(np.uint8), copy=xp is not np)
    return codec.encode(np.array(host, copy=xp is not np))


def device_decode(codec: Codec, stored: np.ndarray, out, xp=None) -> None:
    """Decode host bytes ``stored`` into ``out`` (a C-contiguous array of module ``xp``), unfiltering on its device."""
    xp = xp or array_module(out)
    flat = out.reshape(-1)
    if isinstance(codec, QuantizeCodec):
        fields, streams = codec.unpack(stored, int(flat.size))
        flat[...] = codec.unfilter(xp, fields, [xp.asarray(s) for s in streams])
        return
    if isinstance(codec, ChainCodec):
        data = np.empty(flat.nbytes, np.uint8)
        codec.compressor.decompress(stored, data)
        dev = xp.asarray(data)
        for f in reversed(codec.filters):
            dev = kernels.unshuffle(xp, dev, f.elementsize)
        flat.view(np.uint8)[...] = dev
        return
    host = np.empty(flat.nbytes, np.uint8)
    codec.decode(stored, host)
    flat.view(np.uint8)[...] = xp.asarray(host)
