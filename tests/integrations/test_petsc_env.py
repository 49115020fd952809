"""tests/support/petsc_env.py's choice of Debian's petsc4py directory (no Debian, no MPI needed)."""

from __future__ import annotations

import os

import petsc_env


def make(root, version: str, arch: str = "x86_64-linux-gnu-real", module: bool = True) -> str:
    """A python3-petsc4py-real<version>-like tree under ``root``; its dist-packages directory."""
    where = os.path.join(root, "usr", "lib", "petscdir", f"petsc{version}", arch, "lib", "python3", "dist-packages")
    os.makedirs(os.path.join(where, "petsc4py"))
    if module:
        open(os.path.join(where, "petsc4py", "__init__.py"), "w").close()
    return where


def test_the_newest_petsc_version_holding_a_real_petsc4py_is_picked(tmp_path, monkeypatch):
    monkeypatch.setattr(petsc_env, "PETSC4PY_DIRS",
                        str(tmp_path / "usr/lib/petscdir/petsc*/*-real/lib/python3/dist-packages"))
    assert petsc_env.petsc4py_dir() is None
    make(tmp_path, "3.9")
    newest = make(tmp_path, "3.18")  # 3.18 > 3.9: versions compare as numbers, not as text
    make(tmp_path, "3.20", module=False)  # an empty directory left behind is no petsc4py
    make(tmp_path, "3.19", arch="x86_64-linux-gnu-complex")  # the complex build is not the one the tests use
    assert petsc_env.petsc4py_dir() == newest
