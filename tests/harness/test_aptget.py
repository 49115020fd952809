"""tests/support/aptget.py decides what a missing Debian package means: a skip only where installing is impossible
here, a failure wherever apt-get runs and does not deliver.  A fake ``apt-get`` first on PATH stands in for Debian's."""

from __future__ import annotations

import os
import stat
import sys

import aptget
import pytest
from testpaths import TESTS

sys.path.insert(0, os.path.join(TESTS, "slurm"))
import localslurm  # noqa: E402


@pytest.fixture
def fake_apt_get(tmp_path, monkeypatch):
    """Write ``apt-get`` (a shell script whose body is the argument) first on PATH, as root on Linux; each call is
    appended to ``calls.log``.  Returns the log's path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(aptget, "LOCK", str(tmp_path / "apt.lock"))
    monkeypatch.setattr(aptget.os, "geteuid", lambda: 0)
    monkeypatch.setattr(aptget.sys, "platform", "linux")

    def write(body: str):
        script = bin_dir / "apt-get"
        script.write_text(f'#!/bin/sh\necho "$@" >> {log}\n{body}\n')
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
        return log

    return write


def calls(log) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_a_failing_apt_get_fails_the_test_with_its_output(fake_apt_get):
    log = fake_apt_get('echo "E: Unable to locate package hdf5-toolz" >&2; exit 100')
    with pytest.raises(pytest.fail.Exception) as failed:
        aptget.apt_install(["hdf5-toolz"], lambda: ["h5dump"], "the h5dump check")
    assert "the h5dump check: apt-get update -q failed (exit 100)" in str(failed.value)
    assert "Unable to locate package hdf5-toolz" in str(failed.value)
    assert calls(log) == ["update -q"]


def test_an_install_that_fails_after_the_update_fails_the_test(fake_apt_get):
    log = fake_apt_get('[ "$1" = install ] && { echo "E: dpkg was interrupted" >&2; exit 100; }; exit 0')
    with pytest.raises(pytest.fail.Exception, match="apt-get install -y -q --no-install-recommends pkg failed "
                                                    r"\(exit 100\): E: dpkg was interrupted"):
        aptget.apt_install(["pkg"], lambda: ["prog"], "prog")
    assert calls(log) == ["update -q", "install -y -q --no-install-recommends pkg"]


def test_an_apt_get_that_does_not_finish_fails_the_test(fake_apt_get):
    fake_apt_get("echo fetching; exec sleep 600")  # exec: the process killed at the timeout is the one holding the pipe
    with pytest.raises(pytest.fail.Exception, match=r"apt-get update -q did not finish in 0 s: fetching"):
        aptget.apt_install(["pkg"], lambda: ["prog"], "prog", timeout=0.3)


def test_packages_still_missing_after_a_clean_install_fail_the_test(fake_apt_get):
    fake_apt_get("exit 0")
    with pytest.raises(pytest.fail.Exception, match=r"after apt-get install pkg still missing: \['prog'\]"):
        aptget.apt_install(["pkg"], lambda: ["prog"], "prog")


def test_a_successful_install_returns(fake_apt_get, tmp_path):
    marker = tmp_path / "installed"
    log = fake_apt_get(f'[ "$1" = install ] && touch {marker}; exit 0')
    aptget.apt_install(["pkg"], lambda: [] if marker.exists() else ["prog"], "prog")
    assert calls(log) == ["update -q", "install -y -q --no-install-recommends pkg"]


def test_nothing_missing_runs_no_apt_get(fake_apt_get):
    log = fake_apt_get("exit 100")
    aptget.apt_install(["pkg"], lambda: [], "prog")
    assert calls(log) == []


def test_not_root_skips_without_running_apt_get(fake_apt_get, monkeypatch):
    log = fake_apt_get("exit 100")
    monkeypatch.setattr(aptget.os, "geteuid", lambda: 1000)
    with pytest.raises(pytest.skip.Exception, match=r"prog: prog missing, and apt-get cannot run here \(not root\) "
                                                    "to install pkg"):
        aptget.apt_install(["pkg"], lambda: ["prog"], "prog")
    assert calls(log) == []


def test_no_apt_get_skips(fake_apt_get, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(pytest.skip.Exception, match=r"apt-get cannot run here \(no apt-get on PATH\)"):
        aptget.apt_install(["pkg"], lambda: ["prog"], "prog")


def test_not_linux_skips(fake_apt_get, monkeypatch):
    monkeypatch.setattr(aptget.sys, "platform", "darwin")
    with pytest.raises(pytest.skip.Exception, match=r"apt-get cannot run here \(not Linux\)"):
        aptget.apt_install(["pkg"], lambda: ["prog"], "prog")


def test_a_caller_passes_the_decision_on(fake_apt_get, monkeypatch):
    """The SLURM fixture's installer neither catches the failure nor turns it into a skip."""
    monkeypatch.setattr(localslurm, "missing_programs", lambda: ["slurmctld"])
    fake_apt_get("exit 1")
    with pytest.raises(pytest.fail.Exception, match="a SLURM cluster for the tests: apt-get update -q failed"):
        localslurm.ensure_installed()
    monkeypatch.setattr(aptget.os, "geteuid", lambda: 1000)
    with pytest.raises(pytest.skip.Exception, match=r"slurmctld.*apt-get cannot run here \(not root\)"):
        localslurm.ensure_installed()
