"""tests/support/expected_skips.py: a run with ``--only-expected-skips`` fails on a skip whose reason is not on the
list, with and without pytest-xdist, and passes when every skip is expected."""

from __future__ import annotations

import os
import subprocess
import sys

import aptget
import expected_skips
import pytest
from optional_libs import HEAT_UNTESTED
from testpaths import TESTS

TESTS_WITH_SKIPS = '''
import pytest

def test_runs():
    assert True

def test_without_a_gpu():
    pytest.skip("CuPy is not installed: GPU tests skipped")

@pytest.mark.xfail(reason="a known limitation", strict=True)
def test_expected_to_fail():
    assert False
'''
UNEXPECTED = '''
import pytest

def test_guarded_by_a_wrong_check():
    pytest.skip("the feature does not exist yet")
'''
UNEXPECTED_MODULE = '''
import pytest

pytest.importorskip("a_module_nobody_installed")

def test_never_collected():
    pass
'''


def run_pytest(directory, *args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.path.join(TESTS, "support"))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "expected_skips", "-p", "no:cacheprovider", "-q",
                           "-rs", "--rootdir", str(directory), *args, str(directory)],
                          capture_output=True, text=True, env=env, cwd=str(directory), timeout=120)


@pytest.fixture
def suite(tmp_path):
    (tmp_path / "test_fine.py").write_text(TESTS_WITH_SKIPS)
    return tmp_path


def test_only_expected_skips_pass(suite):
    proc = run_pytest(suite, "--only-expected-skips")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed, 1 skipped, 1 xfailed" in proc.stdout and "UNEXPECTED SKIP" not in proc.stdout


def test_an_unexpected_skip_fails_the_run_under_xdist(suite):
    """Under pytest-xdist (one worker is enough: the reports still cross from worker to controller)."""
    (suite / "test_wrong.py").write_text(UNEXPECTED)
    (suite / "test_module.py").write_text(UNEXPECTED_MODULE)
    proc = run_pytest(suite, "--only-expected-skips", "-n", "1")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 passed, 3 skipped, 1 xfailed" in proc.stdout, proc.stdout
    unexpected = sorted(line for line in proc.stdout.splitlines() if line.startswith("UNEXPECTED SKIP"))
    assert unexpected == ["UNEXPECTED SKIP test_module.py: could not import 'a_module_nobody_installed': "
                          "No module named 'a_module_nobody_installed'",
                          "UNEXPECTED SKIP test_wrong.py::test_guarded_by_a_wrong_check: the feature does not exist yet"]


def test_without_the_option_skips_decide_nothing(suite):
    (suite / "test_wrong.py").write_text(UNEXPECTED)
    proc = run_pytest(suite)
    assert proc.returncode == 0 and "UNEXPECTED SKIP" not in proc.stdout, proc.stdout + proc.stderr


def test_the_skip_of_a_machine_that_cannot_run_apt_get_is_expected(monkeypatch):
    monkeypatch.setattr(aptget.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(aptget.sys, "platform", "linux")
    with pytest.raises(pytest.skip.Exception) as skipped:
        aptget.apt_install(["slurm-wlm"], lambda: ["slurmctld"], "a SLURM cluster for the tests")
    assert expected_skips.is_expected(skipped.value.msg)


def test_an_unlisted_reason_is_not_expected():
    assert not expected_skips.is_expected("h5dump not installed (apt package hdf5-tools)")
    assert not expected_skips.is_expected("no mpiexec next to this Python; run the suite through dev.py")
    assert expected_skips.is_expected("no usable GPU (CUDARuntimeError: no device): GPU tests skipped")
    assert expected_skips.is_expected(HEAT_UNTESTED)


def test_a_test_of_the_mpi_layer_without_the_mpi_marker_runs_in_the_serial_part():
    """pytest-mpi takes a directory named mpi for the marker (tests/conftest.py's run_nowhere refuses such a tree):
    the MPI layer's tests that launch their own mpiexec jobs run in the serial part."""
    test = "tests/mpi_layer/test_watchdog.py::test_debug_mode_is_off_by_default_and_for_one_process"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "not mpi", "-p", "no:cacheprovider", test],
                          capture_output=True, text=True, cwd=os.path.dirname(TESTS), timeout=120)
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout + proc.stderr
