"""Every capability composed with every other (the all-pairs matrix of tests/support/composition.py), under mpiexec.

Run with ``mpiexec -n N python tests/mpi_pytest.py --with-mpi -m mpi tests/saving/test_composition_mpi.py``
(N = 2, 3, 4).  Each configuration saves four versions of a Block and a Ragged
table through ``maybe_save`` (a save every ``EVERY`` steps), overwriting the
arrays right after each save call (with the background writer slowed down, an
asynchronous save that did not copy them would store the overwritten values),
writing the tracked files between saves and, with ``resize``, shrinking the
job by its last rank after the first save and growing it back after the
second (in memory, hpcckpt.redistribute), and ending after the last interval,
or at a final checkpoint that a signal to one rank or the halt file asks for.
Then, after ``close()``, the newest
version is restored exactly (data, replicated step, tracked files rolled back
byte for byte) on the same ranks with the saved and with an even split, on one
rank fewer, and from the root alone with the node-local directories removed.

The data are integers held as float64, which every codec of the matrix,
the lossy quantizer included (``Lossy(abs=1.0)`` quantizes to a step of 1:
docs/compression.md), stores exactly: every restore is compared bit for bit.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
import warnings

import numpy as np
import pytest

import hpcckpt
from composition import CONFIGS, label
from hpcckpt import Block, Checkpointer, CheckpointError, Ragged
from hpcckpt.codecs import Lossy
from hpcckpt.core.regions import even_rows
from hpcckpt.mpi.collective import agree
from hpcckpt.policy import FixedSteps
from hpcckpt.root import halt
from hpcckpt.transport import file_per_rank

EVERY, SAVES = 3, 4  # saves at steps 3, 6, 9, 12
FINAL_AT = EVERY * SAVES - 1  # where a signal or the halt file asks for a final checkpoint (and the run stops)
SHRINK_AT, GROW_AT = EVERY + 1, 2 * EVERY + 1  # resize steps: right after the first and the second save
ROWS, COLS, TABLE = 48, 32, 40  # Block of ROWS x COLS float64 (256 B a row), Ragged table of TABLE rows
CHANGE = 4  # each row changes every CHANGE steps (a quarter of the rows at each step)
BLOCK_BYTES = 512  # incremental grid: two rows of the Block
CODECS = {"none": "none", "lz4": "lz4", "shuffle+zstd": "shuffle+zstd", "blosc2": "blosc2",
          "lossy": Lossy(abs=1.0)}


# ------------------------------------------------------------------ the application's state
def block_values(step: int, lo: int, hi: int) -> np.ndarray:
    """Rows [lo, hi) of the Block at ``step``: integers, a row changing every CHANGE steps."""
    i = np.arange(lo, hi)[:, None]
    return (i * COLS + np.arange(COLS)[None, :] + 1000 * ((step + i % CHANGE) // CHANGE)).astype(np.float64)


def table_values(step: int, lo: int, hi: int) -> np.ndarray:
    """Rows [lo, hi) of the Ragged table at ``step``: (global row, value, row % 7)."""
    g = np.arange(lo, hi)
    return np.stack([g, 3 * g + 100 * ((step + g % CHANGE) // CHANGE), g % 7], axis=1).astype(np.float64)


def uneven_rows(total: int, nparts: int, part: int) -> tuple[int, int]:
    """Rows of ``part`` when part r holds a share proportional to r + 1 (what the run saves)."""
    weight = nparts * (nparts + 1) // 2
    return total * part * (part + 1) // 2 // weight, total * (part + 1) * (part + 2) // 2 // weight


class Simulation:
    """This rank's part of the state on ``comm``: rows [lo, lo + len(u)) of the Block and rows [a, a + len(p))
    of the table, the shares :func:`uneven_rows` gives it.  Each step changes the rows due in place, so every
    value of the newest version went through every resize before it."""

    def __init__(self, comm, u: np.ndarray, p: np.ndarray):
        self.comm, self.u, self.p = comm, u, p
        n, r = comm.Get_size(), comm.Get_rank()
        self.lo, self.a = uneven_rows(ROWS, n, r)[0], uneven_rows(TABLE, n, r)[0]
        self.kept = None  # the values the arrays held before an overwrite

    @classmethod
    def start(cls, comm):
        n, r = comm.Get_size(), comm.Get_rank()
        (lo, hi), (a, b) = uneven_rows(ROWS, n, r), uneven_rows(TABLE, n, r)
        return cls(comm, block_values(0, lo, hi), table_values(0, a, b))

    def state(self, step: int) -> dict:
        return {"u": Block(self.u, (self.lo, 0), (ROWS, COLS)), "p": Ragged(self.p), "step": step}

    def advance(self, step: int) -> None:
        """From the values of ``step - 1`` to those of ``step``."""
        if self.kept is not None:
            self.u[...], self.p[...] = self.kept
            self.kept = None
        self.u[(step + np.arange(self.lo, self.lo + len(self.u)) % CHANGE) % CHANGE == 0] += 1000
        self.p[(step + self.p[:, 0].astype(np.int64) % CHANGE) % CHANGE == 0, 1] += 100

    def overwrite(self) -> None:
        """What the application does right after a save call: the saved arrays get other values (until the
        next step)."""
        self.kept = (self.u.copy(), self.p.copy())
        self.u[...] = -1.0
        self.p[...] = -1.0


def _decomposition(comm, split) -> dict:
    """A template on ``comm``: the Block and the table split as the run saves them (``uneven_rows``, the table
    asked for by row count) or evenly (``even_rows``, the table as ``Ragged()`` splits it)."""
    n, r = comm.Get_size(), comm.Get_rank()
    (lo, hi), (a, b) = split(ROWS, n, r), split(TABLE, n, r)
    return {"u": Block(np.full((hi - lo, COLS), np.nan), (lo, 0), (ROWS, COLS)),
            "p": Ragged(rows=b - a) if split is uneven_rows else Ragged(), "step": None}


# ------------------------------------------------------------------ tracked output files
def tracked(work: str, files: str) -> dict:
    """The registration: shared files (recorded by rank 0), plus one log and one binary file per rank."""
    shared = {os.path.join(work, "shared.log"): "append", os.path.join(work, "shared.bin"): "inplace"}
    return shared if files == "shared" else {**shared, os.path.join(work, "log.{rank}"): "append",
                                             os.path.join(work, "field.{rank}.bin"): "inplace"}


def _rewrite(path: str, size: int, at: int, data: bytes) -> None:
    if not os.path.exists(path):
        with open(path, "wb") as f:
            f.write(bytes(size))
    with open(path, "r+b") as f:
        f.seek(at % size)
        f.write(data)


def write_outputs(work: str, files: str, rank: int, step: int) -> None:
    """A step's output: rank 0 appends to the shared log and rewrites part of the shared binary file; with
    per-rank files every rank does the same to its own."""
    owners = [("shared", 0)] if rank == 0 else []
    if files == "per-rank":
        owners.append((str(rank), rank))
    for name, r in owners:
        log, binary = ("shared.log", "shared.bin") if name == "shared" else (f"log.{r}", f"field.{r}.bin")
        with open(os.path.join(work, log), "a") as f:
            f.write(f"{name} step {step}\n" * (1 + (r + step) % 3))
        _rewrite(os.path.join(work, binary), 3000 + 500 * r, step * 997 + r * 211, bytes([step, r]) * 100)


def outputs(work: str) -> dict:
    """Every file under ``work`` with its bytes."""
    out = {}
    for name in sorted(os.listdir(work)):
        with open(os.path.join(work, name), "rb") as f:
            out[name] = f.read()
    return out


def _spoil_outputs(world, work: str) -> None:
    """What the run wrote after its last checkpoint before it stopped: a restore must undo it."""
    world.Barrier()  # every rank has read the files as the last restore left them
    if world.Get_rank() == 0:
        for name in os.listdir(work):
            with open(os.path.join(work, name), "r+b") as f:
                if name.endswith(".bin"):
                    f.write(b"lost")
                f.seek(0, os.SEEK_END)
                f.write(b"written after the checkpoint\n")
    world.Barrier()


# ------------------------------------------------------------------ the run
LEVEL_OPTIONS = {"L1": lambda path, n: {}, "L2": lambda path, n: {"partner_every": 1},
                 "L3": lambda path, n: {"parity_every": 1},
                 "RS": lambda path, n: {"rs_every": 1, "rs_group": (n - n // 2, n // 2)},
                 "PM": lambda path, n: {"pmem_dir": os.path.join(path, "pmem"), "pmem_block": 256}}


def options(config: dict, path: str, saved_ranks: int) -> dict:
    """The Checkpointer's keywords for ``config`` (a run of ``saved_ranks`` ranks; flushes every second version
    to the root, so that the last one reaches it only if a clean end puts it there)."""
    opts = {"keep": 2, "policy": FixedSteps(EVERY), "track_failures": False,
            "handle_signals": config["end"] == "signal", "chunk_bytes": 2048, "codec": CODECS[config["codec"]]}
    if config["mode"] == "asynchronous":
        opts["asynchronous"] = True
    if config["kind"] == "incremental":
        opts.update(incremental=True, block_bytes=BLOCK_BYTES)
    if config["precopy"]:
        opts["precopy"] = {"min_block": BLOCK_BYTES}
    if config["level"] != "none":
        opts.update(local_dir=os.path.join(path, "local"), ranks_per_node=1, flush_every=2,
                    **LEVEL_OPTIONS[config["level"]](path, saved_ranks))
    if config["files"] != "off":
        opts["files"] = tracked(os.path.join(path, "work"), config["files"])
    return opts


def _moved(world, sim, step: int, comm) -> Simulation | None:
    """hpcckpt.redistribute over ``world`` from the ranks holding ``sim`` to those of ``comm`` (COMM_NULL: a
    rank that leaves), in the uneven split; the Simulation of this rank on ``comm``, or None."""
    from mpi4py import MPI

    member = comm != MPI.COMM_NULL
    template = _decomposition(comm, uneven_rows) if member else None
    out = hpcckpt.redistribute(world, sim.state(step) if sim is not None else None, template)
    if not member:
        return None
    assert out["step"] == step
    return Simulation(comm, template["u"].local, out["p"].local)


def _shrink(world, sim, ck, step):
    """The last rank leaves: its rows move to the others, which continue on a communicator without it."""
    from mpi4py import MPI

    def shrink():
        leaving = world.Get_rank() == world.Get_size() - 1
        comm = world.Split(MPI.UNDEFINED if leaving else 0, world.Get_rank())
        moved = _moved(world, sim, step, comm)
        ck.resize(None if leaving else comm)
        return (None, None) if leaving else (comm, moved)

    return agree(world, f"shrinking at step {step}", shrink)  # the leaving rank learns the others' errors


def _grow(world, sim, ck, step):
    """The rank that left joins again: the others' rows move back to every rank of ``world``."""
    def grow():
        moved = _moved(world, sim, step, world)
        if ck is None:
            return Checkpointer.join(world), moved
        ck.resize(world)
        return ck, moved

    return agree(world, f"growing at step {step}", grow)


def _ask_to_stop(comm, config: dict, root: str) -> None:
    """At FINAL_AT: SIGUSR1 to the last rank, or the halt file under the root (``hpcckpt halt ROOT``)."""
    if config["end"] == "signal" and comm.Get_rank() == comm.Get_size() - 1:
        os.kill(os.getpid(), signal.SIGUSR1)
    elif config["end"] == "halt" and comm.Get_rank() == 0:
        halt.request(root, "the composition test")


def save_run(world, path: str, config: dict) -> tuple[int, dict]:
    """The time loop, until the last interval or a request to stop; returns the newest saved step and the
    tracked files as they were at its save."""
    work, root = os.path.join(path, "work"), os.path.join(path, "root")
    comm, sim = world, Simulation.start(world)
    ck = Checkpointer(root, comm=world, **options(config, path, world.Get_size()))
    newest, snapshot = None, None
    for step in range(1, EVERY * SAVES + 1):
        if sim is not None:
            sim.advance(step)
        if config["resize"] and step == SHRINK_AT:
            comm, sim = _shrink(world, sim, ck, step)
            ck = ck if comm is not None else None
        elif config["resize"] and step == GROW_AT:
            ck, sim = _grow(world, sim, ck, step)
            comm = world
        if comm is None:  # not a rank of the job now
            continue
        if config["files"] != "off":
            write_outputs(work, config["files"], comm.Get_rank(), step)
        if step == FINAL_AT and config["end"] != "close":
            _ask_to_stop(comm, config, root)
        if ck.maybe_save(sim.state(step), step) is not None:
            sim.overwrite()
            newest = step
            comm.Barrier()  # every rank wrote its outputs of this step
            snapshot = outputs(work)
            comm.Barrier()  # and every rank read them before the next step writes
        if ck.should_exit():
            break
    reason = ck.stop_reason
    ck.close()
    world.Barrier()
    assert (reason, newest) == {"close": (None, EVERY * SAVES), "signal": ("SIGUSR1", FINAL_AT),
                                "halt": (f"halt file {halt.halt_path(root)} (the composition test)", FINAL_AT)}[
        config["end"]]
    assert not os.path.exists(halt.halt_path(root))  # close() withdrew the halt file it honoured
    return newest, snapshot


# ------------------------------------------------------------------ the restores
def every_rank_problems(comm, problems: list[str]) -> list[str]:
    """The problems of every rank of ``comm`` (each once), the same list on every rank: a test that fails on
    some ranks only would leave the others waiting in their next collective."""
    return list(dict.fromkeys(p for mine in comm.allgather(problems) for p in mine))


def restore_problems(comm, root: str, split, newest: int, **opts) -> list[str]:
    """Restore the newest version on ``comm`` into the ``split`` decomposition; what differs from ``newest``
    (an older step restored whole says so: ``restored step 9 whole, not the newest 12``)."""
    template = _decomposition(comm, split)
    with Checkpointer(root, comm=comm, **opts) as ck:
        out = ck.restore(template)
    lo, a = template["u"].offset[0], split(TABLE, comm.Get_size(), comm.Get_rank())[0]
    u, p = template["u"].local, out["p"].local

    def exact(step):
        return np.array_equal(u, block_values(step, lo, lo + len(u))) and \
            np.array_equal(p, table_values(step, a, a + len(p)))

    step = out["step"]
    if step == newest and exact(newest):
        return []
    if step != newest and isinstance(step, int) and exact(step):
        return [f"restored step {step} whole, not the newest {newest}"]
    return [f"rank {comm.Get_rank()}: restored step {step!r}; Block rows {lo}:{lo + len(u)} or table rows "
            f"{a}:{a + len(p)} differ from it"]


def _on_fewer_ranks(world, fn) -> list[str]:
    """``fn(sub)`` on a communicator of every rank but the last; its problems, known to every rank of world."""
    from mpi4py import MPI

    sub = world.Split(0 if world.Get_rank() < world.Get_size() - 1 else MPI.UNDEFINED, world.Get_rank())

    def run():
        if sub == MPI.COMM_NULL:
            return []
        try:
            return fn(sub)
        finally:
            sub.Free()

    return agree(world, "restoring on one rank fewer", run)


def _slow_writes(monkeypatch, seconds: float = 0.01) -> None:
    """Every file write of a save waits first: a save that did not copy the state would write overwritten data."""
    original = file_per_rank.SequentialFile.append

    def slow(self, *args, **kwargs):
        time.sleep(seconds)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(file_per_rank.SequentialFile, "append", slow)


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("config", CONFIGS, ids=[label(c) for c in CONFIGS])
def test_the_newest_version_restores_exactly_everywhere(config, mpi_tmp, monkeypatch):
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    n = world.Get_size()
    if config["level"] == "RS":
        from hpcckpt.levels import rs_coder

        if rs_coder.missing() is not None:
            pytest.skip(rs_coder.missing())
    if config["mode"] == "asynchronous":
        _slow_writes(monkeypatch)
    root, work = os.path.join(mpi_tmp, "root"), os.path.join(mpi_tmp, "work")
    if world.Get_rank() == 0:
        os.makedirs(work)
    world.Barrier()
    opts = options(config, mpi_tmp, n)
    root_alone = {"track_failures": False, "handle_signals": False, **({"files": opts["files"]} if "files" in opts
                                                                       else {})}

    def drop_node_local_levels():
        if world.Get_rank() == 0:
            for level_dir in ("local", "pmem"):
                shutil.rmtree(os.path.join(mpi_tmp, level_dir), ignore_errors=True)
        world.Barrier()

    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        newest, snapshot = save_run(world, mpi_tmp, config)
    problems = [f"the run warned: {w.message}" for w in warned if "failed" in str(w.message)]
    restores = [
        (f"{n - 1} ranks", lambda: _on_fewer_ranks(
            world, lambda sub: restore_problems(sub, root, even_rows, newest, **opts))),
        ("same ranks, same split", lambda: restore_problems(world, root, uneven_rows, newest, **opts)),
        ("same ranks, even split", lambda: restore_problems(world, root, even_rows, newest, **opts)),
        ("root alone", lambda: drop_node_local_levels() or restore_problems(world, root, uneven_rows, newest,
                                                                            **root_alone)),
    ]
    for where, restore in restores:
        _spoil_outputs(world, work)
        try:
            found = restore()
        except CheckpointError as exc:  # agreed: every rank records it and goes on to the next restore
            found = [f"{type(exc).__name__}: {exc}"]
        world.Barrier()
        now = outputs(work)
        if now != snapshot:
            differ = sorted(k for k in set(now) | set(snapshot) if now.get(k) != snapshot.get(k))
            found.append(f"tracked files {differ} not rolled back to step {newest}")
        problems += [f"{where}: {p}" for p in found]
    problems = every_rank_problems(world, problems)
    assert not problems, problems

