"""The optional libraries of hpcckpt.adapters, installed for the tests when missing.

They build from source with pip and need Debian packages for that, so they
are not in setup.cfg's ``test`` extra (its install would fail on a machine
without those packages).  ``ensure_library(lib)`` installs the Debian
packages with apt-get (as tests/slurm does for SLURM), then the library's
requirement from setup.cfg's ``adapters`` extra with pip, so that a fresh CI
machine runs the adapter tests instead of skipping them; it skips with the
reason only where that is impossible (not root, no apt-get).  A failed pip
install fails the test.

petsc4py is the exception: its pip build compiles PETSc itself, which takes
far longer than a CI run may (docs/integrations.md, "Installing the
libraries"), so it is built only when ``HPCCKPT_BUILD_PETSC=1`` is set;
otherwise the petsc tests run where petsc4py is installed and skip elsewhere.

heat is installed only when ``HPCCKPT_INSTALL_HEAT=1`` is set, and never from
setup.cfg: heat 1.8.0 declares ``torch<2.11.1`` while the project's torch is
2.13.0 (CPU), so its requirements are installed first with torch pinned, then
heat with ``--no-deps`` (``HEAT_INSTALL``), so that pip never resolves heat's
torch pin.  It is opt-in because on a CPU torch ``import heat`` fails with
PyPI's torchvision 0.28.0 (the one release that accepts torch 2.13.0 is built
against CUDA torch: docs/integrations.md, "Installing the libraries"), after a
download of about 900 MB.
"""

from __future__ import annotations

import configparser
import importlib
import importlib.util
import os
import subprocess
import sys

import pytest

from aptget import apt_install
from mpitools import ROOT

#: library -> (module to import, Debian packages its pip build needs, a file those packages provide,
#: the environment variable that must be set for the tests to build it, or None: always)
LIBRARIES = {
    "mpi4py_fft": ("mpi4py_fft", ("libfftw3-dev",), "/usr/include/fftw3.h", None),
    "petsc": ("petsc4py", ("liblapack-dev", "libblas-dev"), "/usr/include/lapack.h", "HPCCKPT_BUILD_PETSC"),
    "heat": ("heat", (), None, "HPCCKPT_INSTALL_HEAT"),
}

#: heat's pip installs, in order: its requirements with torch pinned to the project's 2.13.0 (torchvision 0.28.0
#: is the release made for it), then heat itself with --no-deps (its torch<2.11.1 pin must never be resolved)
HEAT_INSTALL = (("torch==2.13.0", "torchvision==0.28.0", "scipy~=1.14"), ("--no-deps", "heat==1.8.0"))


def _pip_spec(module: str) -> str:
    """The requirement of ``module``'s distribution in setup.cfg's ``adapters`` extra (the one source of it)."""
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    dist = module.replace("_", "-")
    for line in cfg["options.extras_require"]["adapters"].split("\n"):
        if line.strip().lower().startswith(dist):
            return line.strip()
    raise AssertionError(f"setup.cfg's adapters extra lacks {dist}")


def ensure_library(lib: str) -> None:
    """Import ``lib``'s module, installing it (and its build's Debian packages) first when missing."""
    module, packages, header, opt_in = LIBRARIES[lib]
    if importlib.util.find_spec(module) is None:
        if opt_in and os.environ.get(opt_in) != "1":
            pytest.skip(f"{module} is not installed; {opt_in}=1 lets the tests install it (tests/optional_libs.py)")
        why = apt_install(packages, lambda: [] if header is None or os.path.exists(header) else [header])
        if why:
            pytest.skip(f"cannot build {module}: {why}")
        for args in HEAT_INSTALL if lib == "heat" else ((_pip_spec(module),),):
            proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", *args], capture_output=True,
                                  text=True, timeout=3600)
            if proc.returncode != 0:
                pytest.fail(f"pip install {' '.join(args)} failed: {(proc.stdout + proc.stderr).strip()[-600:]}")
        importlib.invalidate_caches()
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - an installed library that does not import is the test's failure
        pytest.fail(f"{module} is installed but import {module} fails: {type(exc).__name__}: {exc}")
