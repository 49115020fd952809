"""Save and load a library's own distributed arrays through hpcckpt.adapters (driven by tests/integrations/test_adapters.py).

    mpiexec -n N python adapters_run.py save ROOT LIB            writes ROOT/LIB-n<N>
    mpiexec -n M python adapters_run.py load ROOT LIB N1,N2..     loads every ROOT/LIB-n<Ni> into new objects

LIB is ``mpi4py_fft``, ``petsc`` or ``heat``.  The objects are made with the library's
own decomposition for the run's rank count, so a load on M ranks reads boxes
that N ranks wrote.  Every element of every global array differs, so
misplaced data is seen.  Prints "OK rank R ..." on success; a mismatch raises.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from mpi4py import MPI

import hpcckpt
from hpcckpt.adapters import block

SHAPE = (7, 6, 5)  # uneven on 2, 3 and 4 ranks

#: library -> variable -> (global shape, dtype); variable k holds global_values(shape, dtype, seed=k)
EXPECTED = {
    "mpi4py_fft": {"pencil": (SHAPE, np.float64), "spectral": ((7, 6, 3), np.complex128),
                   "vector": ((3, *SHAPE), np.float32)},
    "petsc": {"plain": ((41,), np.float64), "grid2": ((9, 7), np.float64), "grid3": ((*SHAPE, 2), np.float64)},
    "heat": {"rows2": ((9, 7), np.float64), "cols2": ((9, 7), np.int64), "rows3": (SHAPE, np.float32),
             "cols3": (SHAPE, np.complex128), "uneven": ((10, 3), np.float64)},
}
UNEVEN_ROWS = 10  # heat's "uneven" variable: rank r of n holds r + 1 rows, the last rank the rest


def expected_values(lib: str) -> dict:
    """variable -> its global array, as the checkpoint must hold it (no library needed)."""
    return {name: global_values(shape, dtype, k) for k, (name, (shape, dtype)) in enumerate(EXPECTED[lib].items())}


def global_values(shape, dtype, seed):
    n = int(np.prod(shape))
    values = np.arange(n, dtype=np.int64) * 7 + seed * 1000003
    out = values.astype(dtype)
    if np.dtype(dtype).kind == "c":
        out = out + 1j * (values + 1)
    return out.reshape(shape)


def fft_objects():
    """name -> (DistArray, view); view(obj) -> (accessor, its index, the global index of what it holds)."""
    from mpi4py_fft import DistArray, PFFT, newDistArray

    fft = PFFT(MPI.COMM_WORLD, SHAPE, dtype=np.float64)
    pencil = DistArray(SHAPE, subcomm=[0, 0, 1], dtype=np.float64)  # a 2-D pencil grid of MPI's choosing
    spectral = newDistArray(fft, forward_output=True)              # complex, the FFT's own output pencil
    vector = DistArray((3, *SHAPE), rank=1, alignment=0, dtype=np.float32)  # a vector field, slabs
    objs = {"pencil": pencil, "spectral": spectral, "vector": vector}
    return {name: (a, lambda a: (np.asarray(a), ..., a.local_slice())) for name, a in objs.items()}


def petsc_objects():
    """name -> (Vec, view), views as for fft_objects (a DMDA's getVecArray takes global indices)."""
    from petsc4py import PETSc

    plain = PETSc.Vec().createMPI(41, comm=PETSc.COMM_WORLD)
    da2 = PETSc.DMDA().create([9, 7], dof=1, stencil_width=1, comm=PETSc.COMM_WORLD)
    da3 = PETSc.DMDA().create(list(SHAPE), dof=2, stencil_width=1, comm=PETSc.COMM_WORLD)

    def plain_view(v):
        lo, hi = v.getOwnershipRange()
        return v.getArray(), ..., slice(lo, hi)

    def dmda_view(da):
        def view(v):
            ranges = tuple(slice(s, e) for s, e in da.getRanges())
            return da.getVecArray(v), ranges, ranges
        return view

    return {"plain": (plain, plain_view), "grid2": (da2.createGlobalVec(), dmda_view(da2)),
            "grid3": (da3.createGlobalVec(), dmda_view(da3))}


def heat_objects():
    """name -> (DNDarray, view), views as for fft_objects: split=0 and split=1 arrays heat balances itself,
    and one whose rows heat did not choose (``ht.array(..., is_split=0)``, balanced otherwise than heat would)."""
    import heat as ht
    import torch

    comm = MPI.COMM_WORLD
    objs = {name: ht.zeros(shape, split=split, dtype=ht.types.canonical_heat_type(np.dtype(dtype).type))
            for name, split in (("rows2", 0), ("cols2", 1), ("rows3", 0), ("cols3", 1))
            for shape, dtype in [EXPECTED["heat"][name]]}
    counts = [r + 1 for r in range(comm.size - 1)] + [UNEVEN_ROWS - comm.size * (comm.size - 1) // 2]
    objs["uneven"] = ht.array(torch.zeros((counts[comm.rank], 3), dtype=torch.float64), is_split=0)

    def view(a):
        start = a.counts_displs()[1][a.comm.rank]
        where = [slice(None)] * a.ndim
        where[a.split] = slice(start, start + a.lshape[a.split])
        return a.larray.numpy(), ..., tuple(where)

    return {name: (a, view) for name, a in objs.items()}


LIBS = {"mpi4py_fft": fft_objects, "petsc": petsc_objects, "heat": heat_objects}


def fill(objs, values: dict, blank: bool = False):
    """Write each object's part of its global values (or -1 everywhere, with ``blank``)."""
    for name, (obj, view) in objs.items():
        accessor, index, where = view(obj)
        accessor[index] = -1 if blank else values[name][where]


def main() -> None:
    mode, root, lib = sys.argv[1], sys.argv[2], sys.argv[3]
    comm = MPI.COMM_WORLD
    checked = 0
    values = expected_values(lib)
    if mode == "save":
        objs = LIBS[lib]()
        fill(objs, values)
        state = {name: block(obj) for name, (obj, _) in objs.items()}
        hpcckpt.save({**state, "lib": lib}, os.path.join(root, f"{lib}-n{comm.size}"), step=comm.size)
    else:
        for n in map(int, sys.argv[4].split(",")):
            objs = LIBS[lib]()
            fill(objs, values, blank=True)  # nothing of the old contents may survive a load
            state = {name: block(obj) for name, (obj, _) in objs.items()}
            out = hpcckpt.load({**state, "lib": None}, os.path.join(root, f"{lib}-n{n}"))
            assert out["lib"] == lib, out["lib"]
            for name, (obj, view) in objs.items():
                accessor, index, where = view(obj)
                assert np.array_equal(np.asarray(accessor[index]), values[name][where]), (n, name, comm.rank)
                checked += 1
    print(f"OK rank {comm.rank} {mode} {checked}", flush=True)


if __name__ == "__main__":
    main()
