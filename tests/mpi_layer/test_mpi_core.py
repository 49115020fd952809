"""Collective save/load inside one mpiexec run (pytest-mpi): every test runs at 2, 3 and 4 ranks.

Run with ``mpiexec -n N python tests/mpi_pytest.py --with-mpi -m mpi tests/mpi_layer/test_mpi_core.py``.
Every failure test checks that EVERY rank raises (pytest.raises runs on all
ranks) and that no rank hangs (the agree() protocol; pytest-timeout as the
backstop).
"""

from __future__ import annotations

import errno
import os
import resource
import signal

import numpy as np
import pytest

import hpcckpt
from hpcckpt import Block, CheckpointError, Ragged, TemplateMismatchError
from decompositions import global_array, grid_blocks

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]


@pytest.fixture
def comm():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def even(n, parts, i):
    return i * n // parts, (i + 1) * n // parts


def cart_block(comm, shape, dims):
    """This rank's block of ``shape`` on a Cartesian grid ``dims`` (row-major rank order)."""
    cart = comm.Create_cart(dims, reorder=False)
    coords = cart.Get_coords(comm.rank)
    cart.Free()
    ranges = [even(n, d, c) for n, d, c in zip(shape, dims, coords)]
    return tuple(a for a, _ in ranges), tuple(b for _, b in ranges)


def local_of(g, box):
    start, stop = box
    return np.ascontiguousarray(g[tuple(slice(a, b) for a, b in zip(start, stop))])


def test_cartesian_2d_round_trip_and_reshard(comm, mpi_tmp):
    from mpi4py import MPI

    shape = (13, 11)
    g = global_array(shape, np.float64, seed=1)
    gi = global_array(shape, ">i4", seed=2)
    dims = MPI.Compute_dims(comm.size, 2)
    box = cart_block(comm, shape, dims)
    state = {"u": Block(local_of(g, box), box[0], shape), "v": Block(np.asfortranarray(local_of(gi, box)), box[0], shape),
             "step": 3, "time": 0.5}
    path = os.path.join(mpi_tmp, "ck")
    res = hpcckpt.save(state, path, comm=comm, chunk_bytes=40)
    assert res.bytes_written == g.nbytes + gi.nbytes
    # same decomposition
    out = {"u": Block(np.zeros_like(state["u"].local), box[0], shape),
           "v": Block(np.zeros(state["v"].local.shape, ">i4"), box[0], shape), "step": None, "time": None}
    got = hpcckpt.load(out, path, comm=comm)
    assert np.array_equal(out["u"].local, local_of(g, box)) and np.array_equal(out["v"].local, local_of(gi, box))
    assert got["step"] == 3 and got["time"] == 0.5
    # another decomposition: the transposed grid, and columns only
    for dims2 in (dims[::-1], [1, comm.size]):
        box2 = cart_block(comm, shape, dims2)
        out = {"u": Block(np.zeros(np.subtract(box2[1], box2[0])), box2[0], shape),
               "v": Block(np.zeros(np.subtract(box2[1], box2[0]), ">i4"), box2[0], shape), "step": None, "time": None}
        hpcckpt.load(out, path, comm=comm)
        assert np.array_equal(out["u"].local, local_of(g, box2))
        assert np.array_equal(out["v"].local, local_of(gi, box2))
    if comm.rank == 0:
        with hpcckpt.open(path) as view:
            assert np.array_equal(view.read("u"), g) and np.array_equal(view.read("v"), gi)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_uneven_3d_with_empty_blocks(comm, mpi_tmp, seed):
    rng = np.random.default_rng(seed)
    shape = tuple(int(x) for x in rng.integers(1, 7, size=3))
    g = global_array(shape, np.complex64, seed=seed)
    boxes = grid_blocks(rng, shape, comm.size)  # same on every rank (same seed)
    boxes2 = grid_blocks(rng, shape, comm.size)
    me, me2 = boxes[comm.rank], boxes2[comm.rank]
    path = os.path.join(mpi_tmp, "ck")
    hpcckpt.save({"g": Block(local_of(g, me), me[0], shape)}, path, comm=comm, chunk_bytes=int(rng.integers(8, 64)))
    out = np.full(np.subtract(me2[1], me2[0]), np.nan, np.complex64)
    hpcckpt.load({"g": Block(out, me2[0], shape)}, path, comm=comm)
    assert np.array_equal(out, local_of(g, me2))


def test_ragged_counts_change(comm, mpi_tmp):
    n, r = comm.size, comm.rank
    dt = np.dtype([("id", "<i8"), ("x", "<f4", (2,))])
    counts = [(3 * k + 1) % 5 for k in range(n)]  # includes ranks with 0 rows for some sizes
    total = sum(counts)
    table = np.zeros(total, dt)
    table["id"] = np.arange(total) * 11
    table["x"] = np.arange(2 * total, dtype=np.float32).reshape(total, 2)
    lo = sum(counts[:r])
    mine = table[lo:lo + counts[r]]
    path = os.path.join(mpi_tmp, "ck")
    # a rank without rows passes None on even ranks and an empty array on odd ones
    hpcckpt.save({"p": Ragged(mine if len(mine) or r % 2 else None),
                  "q": Ragged(np.arange(4 * r, 4 * r + 4).reshape(2, 2))}, path, comm=comm, chunk_bytes=30)
    got = hpcckpt.load({"p": Ragged(), "q": Ragged()}, path, comm=comm)
    a, b = even(total, n, r)
    assert got["p"].local.dtype == dt and np.array_equal(got["p"].local, table[a:b])
    qa, qb = even(2 * n, n, r)
    assert np.array_equal(got["q"].local, np.arange(4 * n).reshape(2 * n, 2)[qa:qb])
    new_counts = counts[::-1]  # different per-rank counts with the same total
    got = hpcckpt.load({"p": Ragged(rows=new_counts[r]), "q": Ragged(rows=2 * n if r == 0 else 0)}, path, comm=comm)
    lo2 = sum(new_counts[:r])
    assert np.array_equal(got["p"].local, table[lo2:lo2 + new_counts[r]])
    assert np.array_equal(got["q"].local, np.arange(4 * n).reshape(2 * n, 2) if r == 0 else np.zeros((0, 2), int))


def test_ragged_bad_row_sum_fails_on_every_rank(comm, mpi_tmp):
    path = os.path.join(mpi_tmp, "ck")
    hpcckpt.save({"p": Ragged(np.arange(3.0) + comm.rank)}, path, comm=comm)
    with pytest.raises(TemplateMismatchError, match="'p'"):
        hpcckpt.load({"p": Ragged(rows=4)}, path, comm=comm)  # 4 * n != 3 * n
    with pytest.raises(TemplateMismatchError, match="'p'"):
        hpcckpt.load({"p": Ragged(rows=3) if comm.rank else Ragged()}, path, comm=comm)  # mixed requests


@pytest.mark.parametrize("problem", ["overlap", "gap", "dtype", "shape", "names", "outside"])
def test_bad_blocks_at_save_fail_on_every_rank(comm, mpi_tmp, problem):
    n, r = comm.size, comm.rank
    shape = (2 * n, 3)
    lo = 2 * r
    local = np.full((2, 3), float(r))
    state = {"ok": Block(local.copy(), (lo, 0), shape), "bad": Block(local, (lo, 0), shape)}
    victim = n - 1
    if r == victim:
        if problem == "overlap":
            state["bad"] = Block(np.zeros((3, 3)), (lo - 1, 0), shape)
        elif problem == "gap":
            state["bad"] = Block(np.zeros((1, 3)), (lo, 0), shape)
        elif problem == "dtype":
            state["bad"] = Block(local.astype(np.float32), (lo, 0), shape)
        elif problem == "shape":
            state["bad"] = Block(local, (lo, 0), (2 * n + 1, 3))
        elif problem == "names":
            state["bad2"] = state.pop("bad")
        elif problem == "outside":
            state["bad"] = Block(local, (lo + 1, 0), shape)
    path = os.path.join(mpi_tmp, "ck")
    with pytest.raises(TemplateMismatchError, match="'bad2?'") as info:
        hpcckpt.save(state, path, comm=comm)
    if problem == "outside":  # found locally on the victim: the message names that rank
        assert f"rank {victim}" in str(info.value)
    comm.Barrier()
    assert not os.path.exists(os.path.join(path, "metadata.json"))


class InjectedFailure(Exception):
    pass


def _failing_write(message_or_errno):
    def write(fd, data):
        if isinstance(message_or_errno, int):
            raise OSError(message_or_errno, os.strerror(message_or_errno))
        raise InjectedFailure(message_or_errno)
    return write


def _ck_state(comm, step):
    shape = (4 * comm.size + 1, 5)
    lo, hi = even(shape[0], comm.size, comm.rank)
    g = global_array(shape, np.float64, seed=step)
    return {"u": Block(g[lo:hi].copy(), (lo, 0), shape), "step": step}, g, (lo, hi)


def _check_restore(comm, ck, step):
    state, g, (lo, hi) = _ck_state(comm, step)
    out = np.zeros_like(state["u"].local)
    got = ck.restore({"u": Block(out, (lo, 0), g.shape), "step": None})
    assert got["step"] == step
    assert np.array_equal(out, g[lo:hi])


@pytest.mark.parametrize("victim", ["first", "last"])
@pytest.mark.parametrize("failure", ["exception", "enospc"])
def test_rank_failing_mid_save(comm, mpi_tmp, monkeypatch, victim, failure):
    bad = 0 if victim == "first" else comm.size - 1
    root = os.path.join(mpi_tmp, "root")
    ck = hpcckpt.Checkpointer(root, comm=comm, keep=3, strategy="file-per-rank")
    ck.save(_ck_state(comm, 1)[0], step=1)
    if comm.rank == bad:
        monkeypatch.setattr(os, "write", _failing_write("disk on fire" if failure == "exception" else errno.ENOSPC))
    with pytest.raises(CheckpointError) as info:
        ck.save(_ck_state(comm, 2)[0], step=2)
    monkeypatch.undo()
    text = str(info.value)
    assert f"rank {bad}" in text
    assert ("InjectedFailure: disk on fire" if failure == "exception" else "No space left on device") in text
    assert ck.latest() == 1 and ck.steps() == [1]
    _check_restore(comm, ck, 1)
    # and the library still works afterwards: the next save commits and cleans what the failed one left
    ck.save(_ck_state(comm, 3)[0], step=3)
    assert ck.steps() == [1, 3]
    _check_restore(comm, ck, 3)
    if comm.rank == 0:
        assert sorted(n for n in os.listdir(root) if n.startswith("step-")) == ["step-000000000001", "step-000000000003"]


def test_real_file_size_limit_on_one_rank(comm, mpi_tmp):
    """A real OS write error (EFBIG from RLIMIT_FSIZE, SIGXFSZ ignored) on one rank, like a full disk."""
    bad = comm.size - 1
    root = os.path.join(mpi_tmp, "root")
    ck = hpcckpt.Checkpointer(root, comm=comm, strategy="file-per-rank")
    big = {"u": Block(np.arange(20000.0) + comm.rank, (20000 * comm.rank,), (20000 * comm.size,))}
    ck.save(big, step=1)
    failure = None
    if comm.rank == bad:
        old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
        old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (8192, old_limit[1]))
    try:
        ck.save({"u": Block(np.arange(20000.0) - comm.rank, (20000 * comm.rank,), (20000 * comm.size,))}, step=2)
    except CheckpointError as exc:
        failure = str(exc)
    finally:
        if comm.rank == bad:
            resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
            signal.signal(signal.SIGXFSZ, old_handler)
    assert failure is not None and f"rank {bad}" in failure and "File too large" in failure, failure
    assert ck.latest() == 1
    out = np.zeros(20000)
    ck.restore({"u": Block(out, (20000 * comm.rank,), (20000 * comm.size,))})
    assert np.array_equal(out, np.arange(20000.0) + comm.rank)


@pytest.mark.parametrize("case", ["dtype", "shape", "missing", "unknown", "readonly", "tiling"])
def test_restore_mismatch_on_one_rank_fails_everywhere(comm, mpi_tmp, case):
    root = os.path.join(mpi_tmp, "root")
    ck = hpcckpt.Checkpointer(root, comm=comm)
    state, g, (lo, hi) = _ck_state(comm, 5)
    ck.save(state, step=5)
    tpl = {"u": Block(np.zeros((hi - lo, 5)), (lo, 0), g.shape), "step": None}
    name = "u"
    if comm.rank == 1:  # one rank only: the others must still raise, naming the variable
        if case == "dtype":
            tpl["u"] = Block(np.zeros((hi - lo, 5), np.float32), (lo, 0), g.shape)
        elif case == "shape":
            tpl["u"] = Block(np.zeros((hi - lo, 5)), (lo, 0), (g.shape[0], 6))
        elif case == "missing":
            tpl["w"], name = Block(np.zeros(1)), "w"
        elif case == "unknown":
            del tpl["step"]
            name = "step"
        elif case == "readonly":
            tpl["u"].local.flags.writeable = False
        elif case == "tiling":
            tpl["u"] = Block(np.zeros((hi - lo - 1, 5)), (lo, 0), g.shape)
    if case in ("missing", "unknown"):
        name = comm.bcast(name if comm.rank == 1 else None, root=1)
    with pytest.raises(TemplateMismatchError, match=repr(name)):
        ck.restore(tpl)


def test_restore_agrees_on_fallback_when_one_ranks_data_is_damaged(comm, mpi_tmp):
    root = os.path.join(mpi_tmp, "root")
    ck = hpcckpt.Checkpointer(root, comm=comm, keep=3, strategy="file-per-rank")
    ck.save(_ck_state(comm, 1)[0], step=1)
    ck.save(_ck_state(comm, 2)[0], step=2)
    if comm.rank == 0:  # flip a byte in the last rank's file: only that rank reads it
        victim = os.path.join(root, "step-000000000002", "data", f"part-{comm.size - 1:06d}.bin")
        with open(victim, "r+b") as f:
            b = f.read(1)
            f.seek(0)
            f.write(bytes([b[0] ^ 1]))
    comm.Barrier()
    import warnings
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        _check_restore(comm, ck, 1)
    assert ck.last_restored.endswith("step-000000000001")


# ---------------------------------------------------------------- the collective helpers (hpcckpt.mpi.collective)

def _exchanges(comm, failure):
    """Each helper that carries a failure beside its payload, called with this rank's ``failure`` (or None):
    ``{name: () -> what every rank gets}``."""
    from hpcckpt.mpi import collective

    rank, size = comm.rank, comm.size

    def on_root(payloads):
        return sum(payloads), [p * 10 for p in payloads]

    return {
        "allgather_payloads": lambda: collective.allgather_payloads(comm, "the exchange", failure, rank),
        "alltoall_payloads": lambda: collective.alltoall_payloads(comm, "the exchange", failure,
                                                                  [(rank, d) for d in range(size)]),
        "allreduce_checked": lambda: collective.allreduce_checked(comm, lambda total: f"the exchange of {total}",
                                                                  failure, rank, lambda a, b: a + b),
        "root_phase_scattered": lambda: collective.root_phase_scattered(comm, "the exchange", failure, rank,
                                                                        on_root),
    }


@pytest.mark.parametrize("helper", ["allgather_payloads", "alltoall_payloads", "allreduce_checked",
                                    "root_phase_scattered"])
def test_a_collective_helper_hands_every_rank_its_result(comm, helper):
    got = _exchanges(comm, None)[helper]()
    expected = {"allgather_payloads": list(range(comm.size)),
                "alltoall_payloads": [(s, comm.rank) for s in range(comm.size)],
                "allreduce_checked": sum(range(comm.size)),
                "root_phase_scattered": (sum(range(comm.size)), comm.rank * 10)}[helper]
    assert got == expected


@pytest.mark.parametrize("helper", ["allgather_payloads", "alltoall_payloads", "allreduce_checked",
                                    "root_phase_scattered"])
@pytest.mark.parametrize("victim", ["first", "last"])
def test_a_failure_on_one_rank_is_the_same_error_on_every_rank(comm, helper, victim):
    """The failed rank's TemplateMismatchError keeps its class and is raised, word for word, on every rank; no
    rank is left in a collective (the allgather after it pairs)."""
    from hpcckpt.mpi.collective import describe_failure

    bad = 0 if victim == "first" else comm.size - 1
    failure = describe_failure(TemplateMismatchError("no such variable 'w'")) if comm.rank == bad else None
    with pytest.raises(TemplateMismatchError) as info:
        _exchanges(comm, failure)[helper]()
    texts = comm.allgather(str(info.value))
    assert len(set(texts)) == 1 and f"rank {bad}: no such variable 'w'" in texts[0], texts
    assert info.value.failures == {bad: "no such variable 'w'"}


def test_a_failing_root_fn_is_the_same_error_on_every_rank_before_the_scatter(comm):
    """root_phase_scattered: rank 0's own failure to plan reaches every rank in the broadcast; the name is the one
    rank 0 gives."""
    from hpcckpt.mpi.collective import root_phase_scattered

    def on_root(payloads):
        raise OSError("the plan broke")

    with pytest.raises(CheckpointError) as info:
        root_phase_scattered(comm, lambda: f"the plan of rank {comm.rank}", None, comm.rank, on_root)
    texts = comm.allgather(str(info.value))
    assert len(set(texts)) == 1 and texts[0].startswith("the plan of rank 0 failed"), texts
    assert "rank 0: OSError: the plan broke" in texts[0]
