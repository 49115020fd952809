"""Device (CuPy) arrays beside numpy ones: telling them apart and moving their bytes to and from the host.

A ``Block`` or ``Ragged`` may hold a CuPy array.  Everything that does I/O
works on host bytes, so a device array crosses to the host exactly once per
save, as late as possible (after its codec's filters ran on the device, see
codecs/gpu.py) and into page-locked ("pinned") memory from CuPy's pinned
memory pool, which reuses freed buffers: after the first save of a layout a
device-to-host copy allocates nothing.

CuPy is imported only when a device array is actually seen, so CPU-only
installations never need it.
"""

from __future__ import annotations

import numpy as np


def is_device_array(obj) -> bool:
    """True for a GPU array (CuPy, or anything exposing ``__cuda_array_interface__``), False for numpy."""
    return not isinstance(obj, np.ndarray) and hasattr(obj, "__cuda_array_interface__") and hasattr(obj, "dtype")


def array_module(arr):
    """numpy or cupy, whichever ``arr`` belongs to."""
    if not is_device_array(arr):
        return np
    import cupy  # noqa: PLC0415 - only on GPU ranks

    return cupy


def as_local_array(obj):
    """What the save pipeline works on: a device array as it is, anything else through ``np.asarray``."""
    return obj if is_device_array(obj) else np.asarray(obj)


def pinned_empty(shape, dtype) -> np.ndarray:
    """A numpy array in page-locked host memory from CuPy's pinned memory pool (reused once freed)."""
    import cupyx  # noqa: PLC0415

    return cupyx.empty_pinned(shape, dtype)


def to_host(arr) -> np.ndarray:
    """A C-ordered host copy of the device array ``arr`` in pinned memory (a numpy array passes through)."""
    if not is_device_array(arr):
        return arr
    with arr.device:  # work on a device array runs on its device, also from helper threads
        host = pinned_empty(arr.shape, arr.dtype)
        array_module(arr).ascontiguousarray(arr).get(out=host)
    return host


def copy_into(dest, src) -> None:
    """``dest[...] = src`` where either side may live on the device (a host-device copy when they differ)."""
    if is_device_array(dest):
        with dest.device:
            dest[...] = src if is_device_array(src) else array_module(dest).asarray(src)
    elif is_device_array(src):
        if dest.flags.c_contiguous:
            with src.device:
                array_module(src).ascontiguousarray(src).get(out=dest)
        else:
            dest[...] = to_host(src)
    else:
        dest[...] = src
