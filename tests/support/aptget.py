"""Install Debian packages a test needs when they are missing (the tests set up their own machine in CI).

``apt_install(packages, missing, purpose)`` runs ``apt-get update`` and
``apt-get install`` when ``missing()`` names something, and returns once
nothing is missing.  It is the one place that decides what a missing package
means for the test that needs it:

* installing is impossible on this machine (not Linux, not root, no apt-get):
  the test is skipped, with a reason that says ``apt-get cannot run here``
  (an expected skip: tests/support/expected_skips.py);
* apt-get ran and failed, timed out, or left something missing: the test
  fails with apt-get's last lines.  On a CI machine (root, apt-get) an
  infrastructure failure is then a failed run, never a skip that lets the
  run pass.

One process at a time installs (a lock file in the temporary directory):
parallel test processes (pytest-xdist workers, other runs on the machine)
wait for each other instead of failing on dpkg's lock, and find the packages
there afterwards.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

#: held while apt-get runs, so that one process at a time installs
LOCK = os.path.join(tempfile.gettempdir(), "hpcckpt-apt-get.lock")
#: the words every "installing is impossible here" skip carries (the allow-list entry matches them)
CANNOT_RUN_HERE = "apt-get cannot run here"


def why_apt_get_cannot_run() -> str | None:
    """Why this machine cannot install with apt-get (None: it can)."""
    if not sys.platform.startswith("linux"):
        return "not Linux"
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("apt-get") is None:
        return "no apt-get on PATH"
    return None


def _apt_get(cmd: list[str], timeout: float) -> str | None:
    """Run one apt-get command; None when it succeeded, else what went wrong with its output's tail."""
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"") + (exc.stderr or b"")
        tail = out.decode(errors="replace") if isinstance(out, bytes) else out
        return f"{' '.join(cmd)} did not finish in {timeout:.0f} s: {tail.strip()[-800:]}"
    if proc.returncode != 0:
        return f"{' '.join(cmd)} failed (exit {proc.returncode}): {(proc.stdout + proc.stderr).strip()[-800:]}"
    return None


def apt_install(packages, missing, purpose: str, timeout: float = 900) -> None:
    """Install ``packages`` with apt-get if ``missing()`` (a list of what is absent) is not empty; skip the test
    where that is impossible, fail it where apt-get fails (see the module's docstring).  ``purpose`` names what
    the packages are for, in the skip or failure message."""
    absent = missing()
    if not absent:
        return
    impossible = why_apt_get_cannot_run()
    if impossible:
        pytest.skip(f"{purpose}: {', '.join(absent)} missing, and {CANNOT_RUN_HERE} ({impossible}) "
                    f"to install {' '.join(packages)}")
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        if not missing():  # installed by the process that held the lock before
            return
        for cmd in (["apt-get", "update", "-q"],
                    ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]):
            failure = _apt_get(cmd, timeout)
            if failure:
                pytest.fail(f"{purpose}: {failure}", pytrace=False)
        absent = missing()
    if absent:
        pytest.fail(f"{purpose}: after apt-get install {' '.join(packages)} still missing: {absent}", pytrace=False)
