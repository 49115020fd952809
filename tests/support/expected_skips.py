"""The skips a serial run may show, and a pytest plugin that fails the run on any other.

``dev.py test`` runs the serial part with ``--only-expected-skips``: every
skip's reason is matched against ``EXPECTED`` and a skip that matches no
entry makes the run fail (exit status 1), listed in its own section of the
summary.  A skip nobody expects is how a broken installation, a missing
library of the ``test`` extra or a test that guards itself wrongly would
otherwise pass unnoticed.  The MPI-only tests (marker ``mpi``) are not part
of that run (``-m "not mpi"``): the mpiexec runs run them.

The check runs where the reports arrive, so it works under pytest-xdist: the
workers' reports reach the controlling process, which decides the exit status.
"""

from __future__ import annotations

import re

import pytest

#: (a regular expression searched in the skip's reason, why that skip is expected); each names a condition of the
#: machine that no test can change, or a choice the person running the tests made
EXPECTED = (
    (r"apt-get cannot run here",
     "a Debian package a test needs is missing and this machine cannot install it (not Linux, not root, or no "
     "apt-get); CI runs as root with apt-get, where a failed install fails instead (tests/support/aptget.py)"),
    (r"^CuPy is not installed: GPU tests skipped|^no usable GPU|^nvidia-nvcomp is not installed",
     "the GPU tests (tests/gpu) need CuPy and a CUDA device; the test extra installs neither"),
    (r"^heat is tested only against stand-ins",
     "the real heat needs a torchvision built for the CPU torch 2.13.0, which PyPI does not have; its adapter is "
     "tested against stand-ins of heat's objects (tests/support/optional_libs.py)"),
    (r"^no namespace cluster for the tests: (namespace nodes need|unshare .* is not permitted|cannot create a bridge)",
     "tests/cluster needs root and a kernel that lets it make namespaces and a bridge (a container may forbid it)"),
    (r"^(MemoryStorage|S3Storage) has no (link|fifo)s$",
     "the storage conformance tests of symbolic links and FIFOs planted behind hpcckpt's back (hpcckpt.testing."
     "storage) apply to file systems; an object store and the in-memory store have no such objects"),
    (r"^not an incremental configuration$",
     "hpcckpt.testing's conformance test of incremental writes runs in every configuration class and applies to "
     "the incremental ones only"),
    (r"^cannot mount a tmpfs here",
     "mounting a tmpfs needs root and CAP_SYS_ADMIN; a monkeypatched test covers the same code"),
    (r"^Devito compiles its operators with gcc, and there is no gcc on PATH",
     "Devito compiles C at run time: without a C compiler it cannot run at all"),
    (r"^HPCCKPT_SKIP_(SLURM|CLUSTER) is set",
     "the person running the tests asked to leave out the SLURM or namespace-cluster tests"),
)


def is_expected(reason: str) -> bool:
    """Whether a skip with ``reason`` (pytest's message, without its ``Skipped: `` prefix) is on the list."""
    return any(re.search(pattern, reason) for pattern, _ in EXPECTED)


def skip_reason(report) -> str:
    """The reason of a skipped test or collector report, as pytest's short summary prints it."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def pytest_addoption(parser):
    parser.addoption("--only-expected-skips", action="store_true",
                     help="fail the run when a test skips for a reason not in tests/support/expected_skips.py")


def pytest_configure(config):
    if config.getoption("only_expected_skips") and not hasattr(config, "workerinput"):  # xdist: the controller only
        config.pluginmanager.register(SkipCheck(), "expected-skips")


class SkipCheck:
    """Collects the skips whose reason is not expected, and fails the session when there are any."""

    def __init__(self):
        self.unexpected: list[tuple[str, str]] = []

    def _record(self, report) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):  # an xfail is reported as skipped, with wasxfail
            reason = skip_reason(report)
            if not is_expected(reason):
                self.unexpected.append((report.nodeid, reason))

    def pytest_runtest_logreport(self, report):
        self._record(report)

    def pytest_collectreport(self, report):
        self._record(report)

    def pytest_sessionfinish(self, session):
        if self.unexpected and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        if self.unexpected:
            terminalreporter.section("skips not in tests/support/expected_skips.py: the run fails", red=True)
            for nodeid, reason in self.unexpected:
                terminalreporter.line(f"UNEXPECTED SKIP {nodeid}: {reason}")
