"""The device side of the codecs: encode a (CuPy) array on its device, decode into one.

The filters run where the data is, through kernels.py with ``xp`` = cupy, so
that only filtered or compressed bytes cross to the host:

* ``hpcckpt.quantize``: the narrow integer deltas (2 bytes per float64 element
  at a typical 1e-4 bound instead of 8) cross; their lossless stage runs on
  the host with numcodecs;
* ``hpcckpt.chain`` (shuffle + lz4/zstd): the shuffle runs on the device and
  nvCOMP compresses on the device when it is installed (nvcomp.py), so only
  compressed bytes cross; without nvCOMP the shuffled bytes cross and
  numcodecs compresses them;
* codecs without device filters (blosc, which shuffles inside its own frames,
  and "none") cross as they are, after one device-to-host copy.

The stored bytes are those of the CPU codecs (byte for byte, except nvCOMP's
compressed streams, which are in the same numcodecs format but come from
another compressor), whatever device wrote them: tests/codecs/test_codecs_kernels.py
runs these functions with ``xp`` = numpy and compares bytes with the CPU
codecs; tests/gpu/ does it with CuPy.  Host copies go through CuPy's pinned
memory pool (devices.to_host), so repeated saves reuse page-locked buffers.

Every function runs on the array's own device (a rank that drives GPU 3 also
compresses on GPU 3 from the codec threads, whose current device would
otherwise be GPU 0).
"""

from __future__ import annotations

import contextlib

import numpy as np

from hpcckpt.core.devices import array_module, is_device_array, to_host
from hpcckpt.errors import CorruptCheckpointError
from hpcckpt.codecs import kernels, nvcomp
from hpcckpt.codecs.core import ChainCodec, Codec, NoneCodec
from hpcckpt.codecs.lossy import QuantizeCodec


def _on_device_of(arr):
    return arr.device if is_device_array(arr) else contextlib.nullcontext()


def _owned(xp, host):
    """``host`` as an array the caller owns (a numpy input's views are copied: it may be the caller's data)."""
    return np.array(host, copy=True) if xp is np else host


def device_encode(codec: Codec, x, xp=None) -> np.ndarray:
    """The stored bytes (host uint8) of the chunk ``x`` (a C-contiguous array of module ``xp``), filtered on its device."""
    xp = xp or array_module(x)
    with _on_device_of(x):
        if isinstance(codec, QuantizeCodec):
            fields, streams = codec.filter(xp, x)
            return codec.finish(fields, [to_host(s) for s in streams])
        if isinstance(codec, ChainCodec):
            data = x.reshape(-1).view(np.uint8)
            for f in codec.filters:
                data = kernels.shuffle(xp, data, f.elementsize)
            if xp is not np:
                stored = nvcomp.compress(codec.compressor.config, data)
                if stored is not None:
                    return stored
            return codec.compressor.compress(to_host(data))
        host = to_host(x)  # typed: blosc takes its typesize from the array
        if isinstance(codec, NoneCodec):
            return _owned(xp, host.reshape(-1).view(np.uint8))
        return codec.encode(host)


def device_decode(codec: Codec, stored: np.ndarray, out, xp=None) -> None:
    """Decode host bytes ``stored`` into ``out`` (a C-contiguous array of module ``xp``), unfiltering on its device."""
    xp = xp or array_module(out)
    flat = out.reshape(-1)
    with _on_device_of(out):
        if isinstance(codec, NoneCodec):
            if stored.nbytes != flat.nbytes:
                raise CorruptCheckpointError(f"stored {stored.nbytes} bytes where {flat.nbytes} were expected")
            if xp is np:
                flat.view(np.uint8)[...] = stored
            else:  # one synchronous copy from the (pinned) read buffer, no staging copy
                flat.view(np.uint8).set(np.ascontiguousarray(stored))
            return
        if isinstance(codec, QuantizeCodec):
            fields, streams = codec.unpack(stored, int(flat.size))
            flat[...] = codec.unfilter(xp, fields, [xp.asarray(s) for s in streams])
            return
        if isinstance(codec, ChainCodec):
            dev = xp.empty(flat.nbytes, np.uint8)
            if xp is np or not nvcomp.decompress(codec.compressor.config, stored, dev):
                host = np.empty(flat.nbytes, np.uint8)
                codec.compressor.decompress(stored, host)
                dev = xp.asarray(host)
            for f in reversed(codec.filters):
                dev = kernels.unshuffle(xp, dev, f.elementsize)
            flat.view(np.uint8)[...] = dev
            return
        host = np.empty(flat.nbytes, np.uint8)
        codec.decode(stored, host)
        flat.view(np.uint8)[...] = xp.asarray(host)
