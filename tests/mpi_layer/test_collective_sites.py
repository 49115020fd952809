"""Every exchange between ranks goes through hpcckpt.mpi.collective, whose helpers turn a failure on one rank into
the same CheckpointError on every rank and leave no rank waiting in a collective another skipped.

A scan of hpcckpt/ names, file:line, every raw collective call (an attribute call of one of
:data:`COLLECTIVE_NAMES`, on any object) outside the places that implement the exchanges themselves; and the
helpers that carry a failure beside a payload behave on one process (SerialComm) as they do across ranks
(test_mpi_core.py runs them under mpiexec).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

from hpcckpt.errors import CheckpointError, TemplateMismatchError
from hpcckpt.mpi import collective
from hpcckpt.mpi.collective import SerialComm, describe_failure
from testpaths import REPO

PACKAGE = pathlib.Path(REPO) / "hpcckpt"

COLLECTIVE_NAMES = frozenset({
    "gather", "allgather", "bcast", "scatter", "alltoall", "allreduce", "reduce",
    "Gather", "Allgather", "Bcast", "Scatter", "Alltoall", "Allreduce", "Reduce",
    "Allgatherv", "Gatherv", "Scatterv", "Alltoallv",
})

#: Where a raw collective belongs: the helpers, the transports, the levels' data movers, the test tools.
ALLOWED = ("mpi/", "transport/", "testing/", "levels/node.py", "levels/parity.py", "levels/partner.py",
           "levels/pmem.py", "levels/rs.py", "levels/fetch.py", "levels/flush.py")


def raw_collectives(path: pathlib.Path) -> list[tuple[int, str]]:
    """``(line, called expression)`` of each call in ``path`` of an attribute named like a collective."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return sorted((node.lineno, ast.unparse(node.func)) for node in ast.walk(tree) if isinstance(node, ast.Call)
                  and isinstance(node.func, ast.Attribute) and node.func.attr in COLLECTIVE_NAMES)


def outside_the_helpers() -> list[str]:
    """``file:line: call`` (the file relative to the repository) of every raw collective call outside
    :data:`ALLOWED`."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        inside = path.relative_to(PACKAGE).as_posix()
        if not inside.startswith(ALLOWED):
            found += [f"hpcckpt/{inside}:{line}: {call}" for line, call in raw_collectives(path)]
    return found


def test_no_raw_collective_outside_the_helpers():
    found = outside_the_helpers()
    assert not found, "raw collective calls (use hpcckpt.mpi.collective's helpers):\n" + "\n".join(found)


def test_the_scan_finds_a_call_on_any_object(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text("import functools\n"
                      "def f(self, comm, xs):\n"
                      "    comm.allgather(1)\n"
                      "    self.comm.Allreduce(xs, xs)\n"
                      "    return functools.reduce(max, xs)\n"
                      "def g(allgather):\n"
                      "    return allgather(1)\n")
    assert raw_collectives(source) == [(3, "comm.allgather"), (4, "self.comm.Allreduce"), (5, "functools.reduce")]


# ---------------------------------------------------------------- the helpers on one process

FAILED = describe_failure(TemplateMismatchError("no such variable 'w'"))


def test_the_helpers_hand_back_the_payload_on_one_process():
    comm = SerialComm()
    assert collective.allgather_payloads(comm, "x", None, "mine") == ["mine"]
    assert collective.alltoall_payloads(comm, "x", None, [("slot",)]) == [("slot",)]
    assert collective.allreduce_checked(comm, "x", None, 5, max) == 5
    assert collective.root_phase_scattered(comm, "x", None, 3, lambda ps: (sum(ps), [p + 1 for p in ps])) == (3, 4)


@pytest.mark.parametrize("call", [
    lambda comm: collective.allgather_payloads(comm, "the exchange", FAILED, None),
    lambda comm: collective.alltoall_payloads(comm, "the exchange", FAILED, [None]),
    lambda comm: collective.allreduce_checked(comm, lambda v: "the exchange", FAILED, None, max),
    lambda comm: collective.root_phase_scattered(comm, "the exchange", FAILED, None, lambda ps: (None, ps)),
], ids=["allgather_payloads", "alltoall_payloads", "allreduce_checked", "root_phase_scattered"])
def test_a_failure_keeps_its_class_and_names_the_operation(call):
    with pytest.raises(TemplateMismatchError, match=r"^the exchange failed: no such variable 'w'$"):
        call(SerialComm())


def test_a_failing_root_fn_is_a_checkpoint_error_named_on_the_root():
    def broken(payloads):
        raise OSError("the plan broke")

    with pytest.raises(CheckpointError, match=r"^the plan failed: OSError: the plan broke$"):
        collective.root_phase_scattered(SerialComm(), lambda: "the plan", None, 1, broken)


def test_an_alltoall_slot_that_looks_like_a_failure_is_a_payload():
    """A payload goes bare: a tuple shaped like a failure is still the sender's payload."""
    slots = [("CheckpointError", "text", "OSError")]
    assert collective.alltoall_payloads(SerialComm(), "x", None, slots) == slots
