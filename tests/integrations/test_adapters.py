"""hpcckpt.adapters: the dispatch of block(obj), and each library's own distributed arrays saved on N ranks
and loaded on M ranks (real mpiexec runs, N and M in 1..4) into new objects of that library, exactly.

The libraries are optional (setup.cfg's ``adapters`` extra); when one is
missing the fixture installs it (tests/support/optional_libs.py), or, for petsc4py,
runs the programs with Debian's (tests/support/petsc_env.py).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

import hpcckpt
import hpcckpt.adapters
from hpcckpt.adapters import block, register_adapter
from hpcckpt.adapters.petsc import DM_KEY
from mpitools import ROOT, run_mpi
from optional_libs import LIBRARIES, ensure_library

SCRIPT = os.path.join(ROOT, "tests", "scripts", "adapters_run.py")
COUNTS = (1, 2, 3, 4)

pytestmark = pytest.mark.timeout(900)  # a first run builds mpi4py-fft (tests/support/optional_libs.py)

# ---- the dispatch (no library needed) ----

@pytest.fixture(autouse=True)
def own_registrations(monkeypatch):
    """Each test starts from the built-in adapters only; what it registers is gone after it."""
    monkeypatch.setattr(hpcckpt.adapters, "_ADAPTERS", dict(hpcckpt.adapters._ADAPTERS))


class Grid:
    """A stand-in decomposition object: this rank's array and its global start."""

    def __init__(self, local, start, shape):
        self.local, self.start, self.shape = local, start, shape


class Subgrid(Grid):
    pass


class SelfDescribing:
    def __init__(self, local):
        self.local = local

    def __hpcckpt_block__(self):
        return hpcckpt.Block(self.local, (2,), (2 + self.local.size,))


def test_a_registered_class_and_its_subclasses_dispatch_to_the_adapter():
    register_adapter(Grid, lambda g: hpcckpt.Block(g.local, g.start, g.shape))
    a = np.arange(6.0).reshape(2, 3)
    for obj in (Grid(a, (4, 0), (9, 3)), Subgrid(a, (4, 0), (9, 3))):
        b = block(obj, codec="zstd")
        assert b.local is a and b.offset == (4, 0) and b.global_shape == (9, 3) and b.codec == "zstd"


def test_a_class_name_registers_without_importing_the_class():
    register_adapter(Grid, lambda g: hpcckpt.Block(g.local, g.start, g.shape))
    register_adapter(f"{__name__}.Subgrid", lambda g: hpcckpt.Block(g.local, (0, 0), g.local.shape))
    a = np.ones((2, 2))
    assert block(Subgrid(a, (4, 0), (9, 3))).offset == (0, 0)  # the more specific registration wins
    assert block(Grid(a, (4, 0), (9, 3))).offset == (4, 0)


def test_an_object_may_describe_itself_with_hpcckpt_block():
    b = block(SelfDescribing(np.arange(3)))
    assert b.offset == (2,) and b.global_shape == (5,)


def test_an_unknown_object_or_a_bad_adapter_is_a_template_mismatch():
    with pytest.raises(hpcckpt.TemplateMismatchError, match="no hpcckpt adapter for builtins.list"):
        block([1, 2, 3])
    with pytest.raises(hpcckpt.TemplateMismatchError, match=f"no hpcckpt adapter for {__name__}.Grid"):
        block(Grid(np.ones(2), (0,), (2,)))  # registered by other tests, not by this one

    class Bad:
        pass

    register_adapter(Bad, lambda obj: (np.zeros(2), (0,), (2,)))
    with pytest.raises(hpcckpt.TemplateMismatchError, match="returned tuple, not a hpcckpt.Block"):
        block(Bad())
    with pytest.raises(TypeError):
        register_adapter(42, lambda obj: None)
    with pytest.raises(TypeError):
        register_adapter(Bad, "not callable")


def test_an_adapted_block_is_filled_in_place_by_a_load(tmp_path):
    register_adapter(Grid, lambda g: hpcckpt.Block(g.local, g.start, g.shape))
    saved = Grid(np.arange(12.0).reshape(4, 3), (0, 0), (4, 3))
    hpcckpt.save({"u": block(saved)}, str(tmp_path / "c"))
    target = Grid(np.zeros((4, 3)), (0, 0), (4, 3))
    hpcckpt.load({"u": block(target)}, str(tmp_path / "c"))
    assert np.array_equal(target.local, saved.local)


def test_importing_hpcckpt_imports_no_adapted_library():
    code = ("import sys, hpcckpt, hpcckpt.adapters; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mpi4py_fft', 'petsc4py', 'petsc', 'heat', "
            "'torch')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                         env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout


def test_a_one_dimensional_distarray_is_refused_as_not_distributed():
    ensure_library("mpi4py_fft")
    from mpi4py_fft import DistArray

    with pytest.raises(hpcckpt.TemplateMismatchError, match="1-D mpi4py-fft DistArray is not distributed"):
        block(DistArray((8,)))
    a = DistArray((8, 6), alignment=1)  # one process: the whole array
    b = block(a)
    assert b.offset == (0, 0) and b.global_shape == (8, 6) and np.shares_memory(b.local, a)


class FakeDMDA:
    """What the petsc adapter asks of a DMDA (petsc4py's names), for a box of a grid."""

    def __init__(self, sizes, box, dof):
        self.sizes, self.box, self.dof = sizes, box, dof

    def getType(self):
        return "da"

    def getSizes(self):
        return self.sizes

    def getRanges(self):
        return self.box

    def getDof(self):
        return self.dof


class FakeVec:
    """A Vec whose local memory is laid out as PETSc lays out a DMDA's global vector: dof innermost, then x,
    y, z (petsc4py's getVecArray: strides (dof, dof*xm, dof*xm*ym) elements, then 1 for the component)."""

    def __init__(self, memory, dm=None, lo=0, size=None):
        self.memory, self.dm, self.lo, self.size = memory, dm, lo, size

    def query(self, name):
        return self.dm if name == DM_KEY else None  # PETSc composes nothing else under DM_KEY

    def getArray(self):
        return self.memory

    def getLocalSize(self):
        return self.memory.size

    def getOwnershipRange(self):
        return self.lo, self.lo + self.memory.size

    def getSize(self):
        return self.size


@pytest.mark.parametrize("sizes, box, dof", [
    ((9, 7), ((3, 9), (2, 5)), 1),
    ((9, 7), ((0, 4), (5, 7)), 3),
    ((5, 4, 6), ((1, 3), (0, 4), (2, 6)), 2),
    ((5, 4, 6), ((0, 5), (1, 2), (0, 1)), 1),
])
def test_the_petsc_adapter_places_a_dmda_vector_as_petsc_indexes_it(sizes, box, dof):
    from hpcckpt.adapters.petsc import vec_block

    grid = np.arange(np.prod(sizes) * dof, dtype=np.float64).reshape(*sizes, dof)
    mine = grid[tuple(slice(s, e) for s, e in box)]
    # PETSc's memory order: x fastest (after the components), so C order over (z, y, x, dof).
    memory = np.ascontiguousarray(mine.transpose(*reversed(range(len(sizes))), len(sizes))).ravel()
    b = vec_block(FakeVec(memory, FakeDMDA(sizes, box, dof)))
    local = b.local()
    expected = mine if dof > 1 else mine[..., 0]
    assert b.offset == tuple(s for s, _ in box) + ((0,) if dof > 1 else ())
    assert b.global_shape == tuple(sizes) + ((dof,) if dof > 1 else ())
    assert np.array_equal(local, expected)
    local[...] = -1  # a load writes into the vector's own memory
    assert (memory == -1).all()


def test_the_petsc_adapter_refuses_a_ghosted_vector_and_places_a_plain_one():
    from hpcckpt.adapters.petsc import vec_block

    with pytest.raises(hpcckpt.TemplateMismatchError, match="not the DMDA's global vector"):
        vec_block(FakeVec(np.zeros(5 * 4), FakeDMDA((9, 7), ((3, 6), (2, 5)), 1)))
    b = vec_block(FakeVec(np.arange(4.0), lo=6, size=20))
    assert b.offset == (6,) and b.global_shape == (20,) and np.array_equal(b.local(), np.arange(4.0))


class FakeDevice:
    def __init__(self, type):
        self.type = type

    def __str__(self):
        return f"{self.type}:0"


class FakeTensor:
    """What the heat adapter asks of a DNDarray's torch tensor (``larray``), over a numpy array."""

    def __init__(self, array, device="cpu", numpy_dtype=True):
        self.array, self.device, self.numpy_dtype = array, FakeDevice(device), numpy_dtype
        self.dtype = array.dtype if numpy_dtype else "torch.bfloat16"

    def numpy(self):
        if not self.numpy_dtype:
            raise TypeError("Got unsupported ScalarType BFloat16")
        return self.array

    def new_empty(self, n):
        return FakeTensor(np.empty(n, self.array.dtype), self.device.type, self.numpy_dtype)


class FakeHeatComm:
    def __init__(self, rank, chunk_start):
        self.rank, self.chunk_start = rank, chunk_start

    def chunk(self, shape, split):
        return self.chunk_start, None, None


class FakeDNDarray:
    """heat's names: ``split``, ``gshape``, ``larray``, ``balanced`` (True, False or None: unknown),
    ``comm.chunk`` (heat's own balanced slabs) and ``counts_displs()`` (collective in heat)."""

    def __init__(self, larray, split, gshape, balanced, chunk_start=None, displs=None, rank=0):
        self.larray, self.split, self.gshape, self.balanced = larray, split, gshape, balanced
        self.ndim, self.comm, self.displs = len(gshape), FakeHeatComm(rank, chunk_start), displs
        self.counts_displs_calls = 0

    def counts_displs(self):
        self.counts_displs_calls += 1
        return None, self.displs


@pytest.mark.parametrize("balanced", [True, False, None])
def test_the_heat_adapter_places_the_slab_heat_gives_this_rank(balanced):
    from hpcckpt.adapters.heat import dndarray_block

    local = np.arange(24.0).reshape(2, 3, 4)
    a = FakeDNDarray(FakeTensor(local), 1, (2, 11, 4), balanced, chunk_start=5, displs=(0, 5, 8), rank=1)
    b = dndarray_block(a)
    assert b.offset == (0, 5, 0) and b.global_shape == (2, 11, 4)
    assert a.counts_displs_calls == (0 if balanced is True else 1)  # a balanced array needs no communication
    assert b.local() is local
    a.larray = FakeTensor(local.copy())  # heat rebinds larray: the getter follows it
    assert b.local() is a.larray.array


def test_the_heat_adapter_refuses_what_it_cannot_view_or_place():
    from hpcckpt.adapters.heat import dndarray_block

    with pytest.raises(hpcckpt.TemplateMismatchError, match="split=None is not distributed"):
        dndarray_block(FakeDNDarray(FakeTensor(np.zeros(3)), None, (3,), True))
    with pytest.raises(hpcckpt.TemplateMismatchError, match="is on cuda:0"):
        dndarray_block(FakeDNDarray(FakeTensor(np.zeros(3), device="cuda"), 0, (3,), True, chunk_start=0))
    with pytest.raises(hpcckpt.TemplateMismatchError, match="torch dtype torch.bfloat16 has no numpy view"):
        dndarray_block(FakeDNDarray(FakeTensor(np.zeros(3), numpy_dtype=False), 0, (3,), True, chunk_start=0))


def test_a_heat_dndarray_dispatches_and_shares_its_memory():
    ensure_library("heat")
    import heat as ht

    with pytest.raises(hpcckpt.TemplateMismatchError, match="split=None is not distributed"):
        block(ht.zeros((4, 3)))
    a = ht.zeros((5, 3), split=1, dtype=ht.float32)  # one process: the whole array
    b = block(a)
    assert b.offset == (0, 0) and b.global_shape == (5, 3)
    b.local()[...] = 7  # a load writes into the DNDarray's own memory
    assert float(a.sum()) == 7 * 15


# ---- the libraries, N ranks -> M ranks ----

def run_script():
    """tests/scripts/adapters_run.py as a module (its expected values need no library)."""
    spec = importlib.util.spec_from_file_location("adapters_run", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


@pytest.fixture(scope="module", params=sorted(LIBRARIES))
def saved(request, tmp_path_factory):
    lib = request.param
    runtime = ensure_library(lib)
    root = str(tmp_path_factory.mktemp(f"adapters-{lib}"))
    for n in COUNTS:
        proc = run_mpi(n, SCRIPT, "save", root, lib, timeout=240, runtime=runtime)
        assert proc.stdout.count("OK rank") == n, proc.stdout
    return lib, root, runtime


def test_the_checkpoints_hold_the_global_arrays(saved):
    """Read from one process without the library: the adapters placed every rank's part where it belongs."""
    lib, root, _ = saved
    expected = run_script().expected_values(lib)
    for n in COUNTS:
        with hpcckpt.open(os.path.join(root, f"{lib}-n{n}")) as view:
            assert sorted(view) == sorted(expected)
            for name, values in expected.items():
                got = view.read(name)
                assert got.dtype == values.dtype and np.array_equal(got, values), (n, name)


@pytest.mark.parametrize("m", COUNTS)
def test_load_on_m_ranks_from_every_n_into_the_librarys_objects(saved, m):
    lib, root, runtime = saved
    proc = run_mpi(m, SCRIPT, "load", root, lib, ",".join(map(str, COUNTS)), timeout=240, runtime=runtime)
    assert proc.stdout.count("OK rank") == m, proc.stdout
    assert f"OK rank 0 load {len(run_script().EXPECTED[lib]) * len(COUNTS)}" in proc.stdout, proc.stdout
