"""Install Debian packages a test needs when they are missing (the tests set up their own machine in CI).

``apt_install(packages, missing)`` runs ``apt-get update`` and ``apt-get
install`` when ``missing()`` names something, and returns None when nothing
is missing afterwards, else the reason it could not be had (not Linux, not
root, no apt-get, apt failed): the caller skips with that message.  One
process at a time installs (a lock file in the temporary directory): parallel
test processes (pytest-xdist workers, other runs on the machine) wait for each
other instead of failing on dpkg's lock, and find the packages there afterwards.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile

#: held while apt-get runs, so that one process at a time installs
LOCK = os.path.join(tempfile.gettempdir(), "hpcckpt-apt-get.lock")


def apt_install(packages, missing, timeout: float = 900) -> str | None:
    """Install ``packages`` with apt-get if ``missing()`` (a list of what is absent) is not empty."""
    absent = missing()
    if not absent:
        return None
    need = f"{', '.join(absent)} missing"
    if not sys.platform.startswith("linux"):
        return f"{need}, and apt-get needs Linux"
    if os.geteuid() != 0:
        return f"{need} and not root, so cannot apt-get install {' '.join(packages)}"
    if shutil.which("apt-get") is None:
        return f"{need} and no apt-get to install {' '.join(packages)}"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        if not missing():  # installed by the process that held the lock before
            return None
        for cmd in (["apt-get", "update", "-q"],
                    ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]):
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
            except subprocess.TimeoutExpired:
                return f"{' '.join(cmd)} did not finish in {timeout:.0f} s"
            if proc.returncode != 0:
                return f"{' '.join(cmd)} failed (exit {proc.returncode}): {(proc.stdout + proc.stderr).strip()[-600:]}"
        absent = missing()
    return f"after apt-get install {' '.join(packages)} still missing: {absent}" if absent else None
