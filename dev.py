#!/usr/bin/env python3
"""The two Quick start commands: ``python3 dev.py demo`` and ``python3 dev.py test``.

Each works from a fresh clone with only Python 3.11+ and pip: it creates
``.venv`` beside this file (once), installs hpcckpt with its ``mpich`` and
``test`` extras into it, and runs inside it.  ``test`` runs the whole suite:
first the serial tests (unit, property and subprocess tests; not the MPI-only
tests, marker ``mpi``) in parallel processes (pytest-xdist, one per core;
tests/conftest.py keeps each file, and each directory that starts daemons, on
one process), failing on any skip not listed in
tests/support/expected_skips.py, then the MPI tests under ``mpiexec -n 2``,
``-n 3`` and ``-n 4``, and prints after each part its counts and time.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
VENV = os.path.join(HERE, ".venv")
BIN = os.path.join(VENV, "bin")
PY = os.path.join(BIN, "python")
STAMP = os.path.join(VENV, ".hpcckpt-installed")
#: Per-rank-count wall limit for an MPI pytest run: a hang fails the suite instead of blocking CI.
MPI_RUN_LIMIT_S = 600
#: Processes of the serial part (pytest-xdist's ``-n``): one per core, at least two.
SERIAL_WORKERS = max(2, os.cpu_count() or 1)
#: The serial part leaves out the MPI-only tests (the mpiexec parts run them), lists every skip with its reason, and
#: fails on a skip whose reason is not in tests/support/expected_skips.py.
SERIAL_SELECTION = ("-m", "not mpi", "-rs", "--only-expected-skips")
#: pytest's closing line, e.g. "2198 passed, 429 skipped, 9 warnings in 410.21s (0:06:50)"
SUMMARY = re.compile(r"^=*\s*(\d+ (passed|failed|skipped|errors?|xfailed|xpassed|deselected)\b.*) in [\d.]+s")


def run(cmd, **kw) -> int:
    print("+", " ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=HERE, **kw)


def ensure_env() -> None:
    """Create the virtual environment and install the project into it, unless setup.cfg is unchanged since."""
    cfg = os.path.join(HERE, "setup.cfg")
    if os.path.exists(PY) and os.path.exists(STAMP) and os.path.getmtime(STAMP) >= os.path.getmtime(cfg):
        print(f"dev.py: using {VENV} (hpcckpt and its extras installed there; setup.cfg unchanged since)", flush=True)
        return
    print(f"dev.py: installing hpcckpt with its mpich and test extras into {VENV} with pip (a fresh environment "
          "takes a few minutes; later runs reuse it until setup.cfg changes)", flush=True)
    t0 = time.time()
    if not os.path.exists(PY):
        subprocess.check_call([sys.executable, "-m", "venv", VENV])
    subprocess.check_call([PY, "-m", "pip", "install", "-q", "--upgrade", "pip"], cwd=HERE)
    subprocess.check_call([PY, "-m", "pip", "install", "-q", "-e", ".[mpich,test]"], cwd=HERE)
    with open(STAMP, "w") as f:
        f.write(time.ctime())
    print(f"dev.py: installed in {time.time() - t0:.0f} s", flush=True)


def run_part(name: str, cmd: list[str], env: dict, timeout: float | None = None) -> tuple[int, str]:
    """Run one part of the suite with its output passed through (a thread reads it, so that a silent hang
    still meets ``timeout``, after which the part's whole process group is killed); its exit status and a line with pytest's counts and the part's time."""
    print(f"\n=== {name}: " + " ".join(cmd), flush=True)
    t0, counts = time.time(), ["no pytest summary line"]
    proc = subprocess.Popen(cmd, cwd=HERE, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # its own process group: a hang is killed with its ranks

    def relay():
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            found = SUMMARY.match(line.strip())
            if found:
                counts[0] = found.group(1)

    reader = threading.Thread(target=relay, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        print(f"{name} did not finish in {timeout:.0f} s (a hang?)")
        rc, counts[0] = 1, f"killed after {timeout:.0f} s"
    reader.join()
    line = f"{name}: {'passed' if rc == 0 else f'FAILED (exit {rc})'}, {counts[0]}, {time.time() - t0:.0f} s"
    print(f"=== {line}", flush=True)
    return rc, line


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
    failed, lines = [], []
    t0 = time.time()
    parts = [("serial", [PY, "-m", "pytest", "tests", "-q", "-n", str(SERIAL_WORKERS), *SERIAL_SELECTION, *args], None)]
    for n in (2, 3, 4):
        parts.append((f"mpi-{n}", [os.path.join(BIN, "mpiexec"), "-n", str(n), PY, os.path.join("tests", "mpi_pytest.py"),
                                   "--with-mpi", "-m", "mpi", "tests", "-q", *args], MPI_RUN_LIMIT_S))
    for name, cmd, limit in parts:
        rc, line = run_part(name, cmd, e, limit)
        lines.append(line)
        if rc != 0:
            failed.append(name)
    print("\n" + "\n".join(lines))
    print(f"whole suite: {time.time() - t0:.0f} s; " + (f"FAILED: {', '.join(failed)}" if failed else "all runs passed"))
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
