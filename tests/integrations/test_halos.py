"""Halos and edge ghosts (docs/halos.md): the two ways to save a padded local array, restored exactly.

Under mpiexec (marker mpi), a 2-D process grid with a one-cell halo:

* interior-only Blocks: ``Block(padded[1:-1, 1:-1], offset, interior shape)``,
  a strided view; the restore fills the interior of the new padded arrays and
  leaves their halos alone (the application re-exchanges them);
* edge ghosts that hold real data (Veros' cyclic copies): the global array is
  the padded global array, and each rank's Block is its interior plus the
  ghost cells on the domain's outer edges.

Saved on every rank, restored on one rank fewer (another process grid).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import hpcckpt
from hpcckpt import Block
from hpcckpt.core.regions import even_rows

NX, NY, H = 7, 10, 1


def process_grid(n: int, r: int):
    """``(px, py, ix, iy)``: a px x py grid of n ranks and this rank's place in it."""
    px = 2 if n % 2 == 0 else 1
    py = n // px
    return px, py, r // py, r % py


def interior_box(n: int, r: int):
    px, py, ix, iy = process_grid(n, r)
    (x0, x1), (y0, y1) = even_rows(NX, px, ix), even_rows(NY, py, iy)
    return (x0, x1), (y0, y1), (ix == 0, ix == px - 1, iy == 0, iy == py - 1)


def field() -> np.ndarray:
    """The padded global field: interior values, and cyclic copies in the edge ghosts (real data)."""
    g = np.zeros((NX + 2 * H, NY + 2 * H))
    g[H:-H, H:-H] = np.arange(NX * NY, dtype=np.float64).reshape(NX, NY) + 0.5
    g[:, 0], g[:, -1] = g[:, -2], g[:, 1]  # cyclic in y
    g[0, :], g[-1, :] = -g[1, :], -g[-2, :]  # a wall in x: another rule, still real data
    return g


def padded_local(n: int, r: int, fill: float | None = None) -> np.ndarray:
    """This rank's padded array (interior plus a one-cell halo all round), from the global field or ``fill``."""
    (x0, x1), (y0, y1), _ = interior_box(n, r)
    if fill is not None:
        return np.full((x1 - x0 + 2 * H, y1 - y0 + 2 * H), fill)
    return field()[x0:x1 + 2 * H, y0:y1 + 2 * H].copy()


def interior_block(pad: np.ndarray, n: int, r: int) -> Block:
    (x0, _), (y0, _), _ = interior_box(n, r)
    return Block(pad[H:-H, H:-H], (x0, y0), (NX, NY))  # a strided view of the padded array


def edge_ghost_block(pad: np.ndarray, n: int, r: int) -> Block:
    """The interior plus the ghost cells on the outer edges of the domain: they tile the padded global array."""
    (x0, x1), (y0, y1), (west, east, south, north) = interior_box(n, r)
    a, b = (0 if west else H), pad.shape[0] - (0 if east else H)
    c, d = (0 if south else H), pad.shape[1] - (0 if north else H)
    return Block(pad[a:b, c:d], (x0 + a, y0 + c), (NX + 2 * H, NY + 2 * H))


def restore_on_fewer_ranks(comm, path, make_block, check) -> None:
    from mpi4py import MPI

    n, r = comm.size, comm.rank
    fewer = comm.Split(0 if r < n - 1 else MPI.UNDEFINED, r)
    if fewer != MPI.COMM_NULL:
        m, q = fewer.size, fewer.rank
        pad = padded_local(m, q, fill=-99.0)
        hpcckpt.load({"u": make_block(pad, m, q)}, path, comm=fewer)
        check(pad, m, q)
        fewer.Free()
    comm.Barrier()


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_interior_only_views_of_padded_arrays(mpi_tmp):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    n, r = comm.size, comm.rank
    path = os.path.join(mpi_tmp, "interior")
    pad = padded_local(n, r)
    hpcckpt.save({"u": interior_block(pad, n, r)}, path, comm=comm, chunk_bytes=48)

    def check(got, m, q):
        (x0, x1), (y0, y1), _ = interior_box(m, q)
        assert np.array_equal(got[H:-H, H:-H], field()[H + x0:H + x1, H + y0:H + y1])
        halo = np.ones(got.shape, bool)
        halo[H:-H, H:-H] = False
        assert np.all(got[halo] == -99.0)  # halos untouched: the application exchanges them after a restore

    restore_on_fewer_ranks(comm, path, interior_block, check)


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_edge_ghosts_holding_real_data_are_part_of_the_global_array(mpi_tmp):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    n, r = comm.size, comm.rank
    path = os.path.join(mpi_tmp, "edges")
    pad = padded_local(n, r)
    hpcckpt.save({"u": edge_ghost_block(pad, n, r)}, path, comm=comm, chunk_bytes=48)
    if r == 0:
        with hpcckpt.open(path) as view:
            assert np.array_equal(np.asarray(view["u"]), field())  # ghosts with real data stored once

    def check(got, m, q):
        (x0, x1), (y0, y1), (west, east, south, north) = interior_box(m, q)
        want = field()[x0:x1 + 2 * H, y0:y1 + 2 * H]
        block = edge_ghost_block(got, m, q)
        a, c = block.offset[0] - x0, block.offset[1] - y0
        assert np.array_equal(block.local, want[a:a + block.local.shape[0], c:c + block.local.shape[1]])
        inner = np.zeros(got.shape, bool)  # halo cells between ranks are not stored: left for the exchange
        inner[a:a + block.local.shape[0], c:c + block.local.shape[1]] = True
        assert np.all(got[~inner] == -99.0)

    restore_on_fewer_ranks(comm, path, edge_ghost_block, check)
