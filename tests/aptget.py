"""Install Debian packages a test needs when they are missing (the tests set up their own machine in CI).

``apt_install(packages, missing)`` runs ``apt-get update`` and ``apt-get
install`` when ``missing()`` names something, and returns None when nothing
is missing afterwards, else the reason it could not be had (not Linux, not
root, no apt-get, apt failed): the caller skips with that message.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys


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
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]):
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
        except subprocess.TimeoutExpired:
            return f"{' '.join(cmd)} did not finish in {timeout:.0f} s"
        if proc.returncode != 0:
            return f"{' '.join(cmd)} failed (exit {proc.returncode}): {(proc.stdout + proc.stderr).strip()[-600:]}"
    absent = missing()
    return f"after apt-get install {' '.join(packages)} still missing: {absent}" if absent else None
