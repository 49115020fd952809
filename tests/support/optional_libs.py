"""The optional libraries of hpcckpt.adapters, installed for the tests when missing.

``ensure_library(lib)`` makes ``lib`` importable where the tests run it and
returns the ``mpitools.Runtime`` its MPI programs run under (None: this
environment's own), so that a fresh CI machine runs the adapter tests
instead of skipping them; it skips with the reason only where that is
impossible (not root, no apt-get: tests/support/aptget.py).  A failed install,
apt-get's or pip's, fails the test.

mpi4py-fft builds from source with pip and needs FFTW's headers, so it is not
in setup.cfg's ``test`` extra (its install would fail on a machine without
them): the Debian package is installed with apt-get (as tests/slurm does for
SLURM), then the library's requirement from setup.cfg's ``adapters`` extra
with pip, into this environment.

petsc4py is used from this environment where it imports.  Elsewhere the tests
use Debian's (tests/support/petsc_env.py): its pip build compiles PETSc itself, far
longer than a CI run may take (docs/integrations.md, "Installing the
libraries"), while Debian's installs in under a minute, for Debian's Python
and OpenMPI, so its programs run in a venv of that Python under OpenMPI's
mpiexec.

Devito (tests/integrations/test_devito.py) is installed with pip in two steps
(``DEVITO_INSTALL``): its requirements within its ranges, then devito itself
with ``--no-deps``, because devito 4.8.23 caps numpy, pip and packaging at the
releases of its day (``numpy<=2.4.3``, ``pip<=26.2``, ``packaging<26.3``) and
resolving those caps would downgrade this environment's.  It compiles its
operators with the C compiler at run time: without one the tests skip.

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
import fcntl
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

from aptget import apt_install
from mpitools import ROOT, Runtime
from petsc_env import debian_runtime

#: heat's tests install it only when this variable is 1, and otherwise skip with HEAT_UNTESTED
HEAT_OPT_IN = "HPCCKPT_INSTALL_HEAT"
HEAT_UNTESTED = ("heat is tested only against stand-ins of its objects: the real library needs a torchvision built for "
                 f"the CPU torch 2.13.0, which PyPI does not have ({HEAT_OPT_IN}=1 installs PyPI's, with which "
                 "import heat fails: tests/support/optional_libs.py)")

#: library -> (module to import, Debian packages its pip build needs, a file those packages provide,
#: None (always installed when missing) or (the variable that must be 1 for the tests to install it, the skip's
#: reason otherwise)); petsc4py is never built: where this environment lacks it, Debian's is used
#: (tests/support/petsc_env.py)
LIBRARIES = {
    "mpi4py_fft": ("mpi4py_fft", ("libfftw3-dev",), "/usr/include/fftw3.h", None),
    "petsc": ("petsc4py", (), None, None),
    "heat": ("heat", (), None, (HEAT_OPT_IN, HEAT_UNTESTED)),
}

#: libraries installed the same way whose tests are their own file, not tests/integrations/test_adapters.py's library loop
OWN_TESTS = {"devito": ("devito", (), None, None)}

#: held while pip installs a library into this environment: parallel test processes (pytest-xdist workers)
#: install it once, one after the other, never two pips into one environment at a time
PIP_LOCK = os.path.join(sys.prefix, ".hpcckpt-pip-install.lock")

#: heat's pip installs, in order: its requirements with torch pinned to the project's 2.13.0 (torchvision 0.28.0
#: is the release made for it), then heat itself with --no-deps (its torch<2.11.1 pin must never be resolved)
HEAT_INSTALL = (("torch==2.13.0", "torchvision==0.28.0", "scipy~=1.14"), ("--no-deps", "heat==1.8.0"))


#: devito's pip installs, in order: its requirements within its own ranges but for the caps on numpy, pip and
#: packaging, which this environment already satisfies with newer releases; then devito itself with --no-deps
DEVITO_INSTALL = (("sympy>=1.12.1,<1.15", "psutil>=5.1,<8", "py-cpuinfo<10", "cgen>=2020.1,<2026",
                   "codepy>=2019.1,<2025", "multidict<6.3", "anytree>=2.4.3,<=2.13.0"), ("--no-deps", "devito==4.8.23"))

#: library -> its pip installs, in order, where they are not the library's line of setup.cfg's adapters extra
PIP_INSTALLS = {"heat": HEAT_INSTALL, "devito": DEVITO_INSTALL}


def _pip_spec(module: str) -> str:
    """The requirement of ``module``'s distribution in setup.cfg's ``adapters`` extra (the one source of it)."""
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    dist = module.replace("_", "-")
    for line in cfg["options.extras_require"]["adapters"].split("\n"):
        if line.strip().lower().startswith(dist):
            return line.strip()
    raise AssertionError(f"setup.cfg's adapters extra lacks {dist}")


def _pip_install(lib: str, module: str) -> None:
    """pip's installs of ``lib`` into this environment; a failed one fails the test."""
    installs = PIP_INSTALLS[lib] if lib in PIP_INSTALLS else ((_pip_spec(module),),)
    for args in installs:
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", *args], capture_output=True,
                              text=True, timeout=3600)
        if proc.returncode != 0:
            pytest.fail(f"pip install {' '.join(args)} failed: {(proc.stdout + proc.stderr).strip()[-600:]}")


def ensure_library(lib: str) -> Runtime | None:
    """Import ``lib``'s module, installing it (and its build's Debian packages) first when missing; the Runtime
    of ``lib``'s programs (None: this environment's own)."""
    module, packages, header, opt_in = {**LIBRARIES, **OWN_TESTS}[lib]
    if lib == "petsc" and importlib.util.find_spec(module) is None:
        return debian_runtime()
    if lib == "devito" and shutil.which("gcc") is None:
        pytest.skip("Devito compiles its operators with gcc, and there is no gcc on PATH")
    if importlib.util.find_spec(module) is None:
        if opt_in and os.environ.get(opt_in[0]) != "1":
            pytest.skip(opt_in[1])
        apt_install(packages, lambda: [] if header is None or os.path.exists(header) else [header], f"building {module}")
        with open(PIP_LOCK, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
            importlib.invalidate_caches()
            if importlib.util.find_spec(module) is None:  # else installed by the process that held the lock
                _pip_install(lib, module)
        importlib.invalidate_caches()
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - an installed library that does not import is the test's failure
        pytest.fail(f"{module} is installed but import {module} fails: {type(exc).__name__}: {exc}")
    return None
