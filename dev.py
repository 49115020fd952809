#!/usr/bin/env python3
"""The two Quick start commands: ``python3 dev.py demo`` and ``python3 dev.py test``.

Each works from a fresh clone with only Python 3.11+ and pip: it creates
``.venv`` beside this file (once), installs hpcckpt with its ``mpich`` and
``test`` extras into it, and runs inside it.  ``test`` runs the whole suite:
first serially (unit, property and subprocess tests), then the MPI tests under
``mpiexec -n 2``, ``-n 3`` and ``-n 4``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
VENV = os.path.join(HERE, ".venv")
BIN = os.path.join(VENV, "bin")
PY = os.path.join(BIN, "python")
STAMP = os.path.join(VENV, ".hpcckpt-installed")
#: Per-rank-count wall limit for an MPI pytest run: a hang fails the suite instead of blocking CI.
MPI_RUN_LIMIT_S = 600


def run(cmd, **kw) -> int:
    print("+", " ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=HERE, **kw)


def ensure_env() -> None:
    """Create the virtual environment and install the project into it, unless setup.cfg is unchanged since."""
    if not os.path.exists(PY):
        subprocess.check_call([sys.executable, "-m", "venv", VENV])
    cfg = os.path.join(HERE, "setup.cfg")
    if os.path.exists(STAMP) and os.path.getmtime(STAMP) >= os.path.getmtime(cfg):
        return
    subprocess.check_call([PY, "-m", "pip", "install", "-q", "--upgrade", "pip"], cwd=HERE)
    subprocess.check_call([PY, "-m", "pip", "install", "-q", "-e", ".[mpich,test]"], cwd=HERE)
    with open(STAMP, "w") as f:
        f.write(time.ctime())


def env() -> dict:
    """The environment for child processes: the venv's mpiexec and python first on PATH."""
    out = dict(os.environ)
    out["PATH"] = BIN + os.pathsep + out.get("PATH", "")
    out["VIRTUAL_ENV"] = VENV
    out.setdefault("HPCCKPT_TEST_MPIEXEC", os.path.join(BIN, "mpiexec"))
    return out


def demo(args) -> int:
    return run([PY, os.path.join("apps", "demo.py"), *args], env=env())


def test(args) -> int:
    e = env()
    failed = []
    t0 = time.time()
    if run([PY, "-m", "pytest", "tests", "-q", *args], env=e) != 0:
        failed.append("serial")
    for n in (2, 3, 4):
        cmd = [os.path.join(BIN, "mpiexec"), "-n", str(n), PY, os.path.join("tests", "mpi_pytest.py"),
               "--with-mpi", "-m", "mpi", "tests", "-q", *args]
        print("+", " ".join(cmd), flush=True)
        try:
            rc = subprocess.call(cmd, cwd=HERE, env=e, timeout=MPI_RUN_LIMIT_S)
        except subprocess.TimeoutExpired:
            print(f"MPI tests on {n} ranks did not finish in {MPI_RUN_LIMIT_S} s (a hang?)")
            rc = 1
        if rc != 0:
            failed.append(f"mpi-{n}")
    print(f"\nwhole suite: {time.time() - t0:.0f} s; " + (f"FAILED: {', '.join(failed)}" if failed else "all runs passed"))
    return 1 if failed else 0


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("demo", "test"):
        print(__doc__)
        print("usage: python3 dev.py demo|test [extra args]")
        return 2
    ensure_env()
    return {"demo": demo, "test": test}[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
