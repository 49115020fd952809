"""The one check every GPU test module starts with: CuPy and a usable device, else skip with the reason."""

from __future__ import annotations

import pytest


def require_gpu():
    """The cupy module; skips the calling test module (with a message) when there is no usable GPU."""
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed: GPU tests skipped")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no device")
        cupy.zeros(1).sum()  # a first kernel: CuPy imports without a driver, and fails only at first use
    except Exception as exc:  # noqa: BLE001 - any CUDA failure means: no usable GPU
        pytest.skip(f"no usable GPU ({type(exc).__name__}: {exc}): GPU tests skipped", allow_module_level=True)
    return cupy
