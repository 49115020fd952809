"""Debian's petsc4py for the petsc adapter tests: a venv of Debian's Python, its programs run under Debian's OpenMPI.

PyPI has no petsc4py wheel and its source build compiles PETSc (1.5 to 2 h
on a 2-core machine: docs/integrations.md, "Installing the libraries"), while
Debian 12's ``python3-petsc4py`` (petsc4py 3.18, built for Debian's Python
and OpenMPI) installs in under a minute.  It cannot be imported by the
project's venv (another Python, another MPI: MPICH from pip), so
``debian_runtime()``:

* installs ``DEBIAN_PACKAGES`` with apt-get when Debian's petsc4py or
  OpenMPI's mpiexec is missing (tests/support/aptget.py: skips with the reason where
  that is impossible, not root or no apt-get, and fails where apt-get fails);
* makes, once, a venv of Debian's Python that sees the system's packages
  (petsc4py through its directory on PYTHONPATH, Debian's numpy, which
  petsc4py is built against and which pip is held to) and has hpcckpt's own
  requirements (setup.cfg's ``install_requires``) from pip, under
  ``ENV_DIR``, behind a lock so that parallel tests and runs never race, and
  rebuilt when what it was made from changes;
* returns the ``mpitools.Runtime`` that runs a program there under Debian's
  OpenMPI ``mpiexec.openmpi`` (named explicitly: it is never put on PATH, so
  every other test keeps the project's mpiexec).
"""

from __future__ import annotations

import configparser
import fcntl
import glob
import json
import os
import re
import shutil
import subprocess

import pytest

from aptget import apt_install
from mpitools import ROOT, Runtime

#: what apt-get installs: petsc4py (with PETSc, OpenMPI's runtime and Debian's numpy), OpenMPI's mpiexec and
#: libraries for mpi4py's wheel, and the venv module of Debian's Python
DEBIAN_PACKAGES = ("python3-petsc4py", "libopenmpi-dev", "python3-venv")
#: the Python python3-petsc4py is built for
SYSTEM_PYTHON = "/usr/bin/python3"
#: Debian's name for OpenMPI's mpiexec (/usr/bin/mpiexec is an alternative that may point at another MPI)
OPENMPI_MPIEXEC = "/usr/bin/mpiexec.openmpi"
#: where python3-petsc4py-real<version> puts petsc4py: one directory per PETSc version and architecture
PETSC4PY_DIRS = "/usr/lib/petscdir/petsc*/*-real/lib/python3/dist-packages"
#: the venv and its lock, in the repository's ignored build directory (kept between runs)
ENV_DIR = os.path.join(ROOT, "build", "test-envs", "petsc")
STAMP = os.path.join(ENV_DIR, "hpcckpt-made-from.json")


def petsc4py_dir() -> str | None:
    """The directory holding Debian's petsc4py, the newest PETSc version's where several are installed."""
    found = [d for d in glob.glob(PETSC4PY_DIRS) if os.path.exists(os.path.join(d, "petsc4py", "__init__.py"))]

    def version(d):
        return tuple(int(n) for n in re.findall(r"\d+", d.split("/petscdir/petsc", 1)[1].split("/", 1)[0]))

    return max(found, key=version) if found else None


def _missing() -> list[str]:
    """What a petsc run needs from Debian and lacks (apt_install's ``missing``)."""
    absent = [] if petsc4py_dir() else [f"petsc4py in {PETSC4PY_DIRS}"]
    absent += [path for path in (SYSTEM_PYTHON, OPENMPI_MPIEXEC) if not os.path.exists(path)]
    if os.path.exists(SYSTEM_PYTHON) and subprocess.run([SYSTEM_PYTHON, "-c", "import ensurepip"],
                                                        capture_output=True, timeout=60).returncode != 0:
        absent.append(f"{SYSTEM_PYTHON}'s venv module (ensurepip)")
    return absent


def hpcckpt_requirements() -> list[str]:
    """setup.cfg's ``install_requires``: what hpcckpt imports, installed into the venv by pip."""
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    return [line.strip() for line in cfg["options"]["install_requires"].split("\n") if line.strip()]


def _run(cmd: list[str], what: str, timeout: float = 900, env: dict | None = None) -> str:
    """Run a step of the venv's making; a failure fails the test with the step's output."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what}: {' '.join(cmd)} did not finish in {timeout:.0f} s")
    if proc.returncode != 0:
        pytest.fail(f"{what}: {' '.join(cmd)} exited {proc.returncode}: {(proc.stdout + proc.stderr).strip()[-800:]}")
    return proc.stdout


def _made_from(petsc_dir: str) -> dict:
    """What the venv is made from: when any of it changes, the venv is made again."""
    numpy = _run([SYSTEM_PYTHON, "-c", "import numpy, sys; print(numpy.__version__, sys.version.split()[0])"],
                 "Debian's numpy").split()
    return {"petsc4py": petsc_dir, "numpy": numpy[0], "python": numpy[1], "requirements": hpcckpt_requirements()}


def _make_venv(made_from: dict) -> None:
    """A fresh venv of Debian's Python with hpcckpt's requirements, numpy held at Debian's version."""
    shutil.rmtree(ENV_DIR, ignore_errors=True)
    _run([SYSTEM_PYTHON, "-m", "venv", "--system-site-packages", ENV_DIR], "making the petsc venv", timeout=300)
    constraints = os.path.join(ENV_DIR, "constraints.txt")
    with open(constraints, "w") as f:
        f.write(f"numpy=={made_from['numpy']}\n")  # petsc4py is built against Debian's numpy: pip never replaces it
    python = os.path.join(ENV_DIR, "bin", "python")
    _run([python, "-m", "pip", "install", "-q", "-c", constraints, *made_from["requirements"]],
         "pip install of hpcckpt's requirements into the petsc venv")
    _run([python, "-c", "import petsc4py.PETSc, mpi4py.MPI, hpcckpt"], "importing petsc4py, mpi4py and hpcckpt",
         env=dict(os.environ, PYTHONPATH=os.pathsep.join((made_from["petsc4py"], ROOT))))
    with open(STAMP, "w") as f:
        json.dump(made_from, f)


def debian_runtime() -> Runtime:
    """The Runtime of Debian's petsc4py: apt-get and the venv first, where missing (see the module's docstring)."""
    apt_install(DEBIAN_PACKAGES, _missing, "Debian's petsc4py")
    petsc_dir = petsc4py_dir()
    os.makedirs(os.path.dirname(ENV_DIR), exist_ok=True)
    with open(ENV_DIR + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        made_from = _made_from(petsc_dir)
        try:
            with open(STAMP) as f:
                current = json.load(f) == made_from
        except (OSError, ValueError):
            current = False
        if not current:
            _make_venv(made_from)
    python = os.path.join(ENV_DIR, "bin", "python")
    # root may run OpenMPI only when asked; --oversubscribe: more ranks than cores (2 here)
    launcher = (OPENMPI_MPIEXEC, "--oversubscribe", *(("--allow-run-as-root",) if os.geteuid() == 0 else ()))
    return Runtime(launcher, python, (petsc_dir,))
