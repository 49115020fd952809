"""Which ranks share a node: real nodes from MPI, or simulated nodes on one machine.

Aggregation (one aggregator per node), partner copies on another node and the
automatic strategy choice all need the node of each rank.  On a cluster MPI
tells (``comm.Split_type(COMM_TYPE_SHARED)``); to test multi-node behaviour on
one machine, ``ranks_per_node=k`` (or the environment variable
``HPCCKPT_RANKS_PER_NODE``) declares ranks ``[0, k)`` node 0, ``[k, 2k)`` node 1,
and so on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hpcckpt.errors import CheckpointError

ENV_RANKS_PER_NODE = "HPCCKPT_RANKS_PER_NODE"


@dataclass(frozen=True)
class NodeLayout:
    """``node_of[r]`` is the node index (0..nnodes-1, in order of first rank) of rank r."""

    node_of: tuple[int, ...]

    @property
    def nnodes(self) -> int:
        return max(self.node_of) + 1 if self.node_of else 0

    def ranks_on(self, node: int) -> list[int]:
        return [r for r, n in enumerate(self.node_of) if n == node]

    @property
    def max_ranks_per_node(self) -> int:
        return max(len(self.ranks_on(n)) for n in range(self.nnodes)) if self.node_of else 0


def layout_from_ids(ids) -> NodeLayout:
    """Number nodes by order of first appearance of their (opaque) ids."""
    index: dict = {}
    return NodeLayout(tuple(index.setdefault(i, len(index)) for i in ids))


def simulated_layout(nranks: int, ranks_per_node: int) -> NodeLayout:
    return NodeLayout(tuple(r // ranks_per_node for r in range(nranks)))


def ranks_per_node_setting(option: int | None) -> int | None:
    """The simulated ranks per node from the option, else the environment, else None (ask MPI)."""
    value = option if option is not None else os.environ.get(ENV_RANKS_PER_NODE) or None
    if value is None:
        return None
    try:
        k = int(value)
    except ValueError:
        raise CheckpointError(f"{ENV_RANKS_PER_NODE}={value!r} is not an integer") from None
    if k < 1:
        raise CheckpointError(f"ranks per node must be at least 1, got {k}")
    return k


#: Layouts already asked of MPI: ``{COMM_WORLD ranks of the communicator's processes: NodeLayout}``.
_ASKED: dict = {}


def node_layout(comm, ranks_per_node: int | None = None) -> NodeLayout:
    """The node layout of ``comm``: collective the first time MPI must be asked for these processes.

    Processes do not change nodes, so the answer is kept per set of
    processes (their COMM_WORLD ranks, found without communication): a second
    save over the same processes, through any communicator, asks nothing.
    """
    k = ranks_per_node_setting(ranks_per_node)
    if k is not None or comm.Get_size() == 1:
        return simulated_layout(comm.Get_size(), k or 1)
    members = _world_ranks(comm)
    if members is not None and members in _ASKED:
        return _ASKED[members]
    layout = _ask_mpi(comm)
    if members is not None:
        _ASKED[members] = layout
    return layout


def _world_ranks(comm) -> tuple | None:
    """The COMM_WORLD ranks of ``comm``'s processes, in rank order (local); None when that cannot be told."""
    try:
        from mpi4py import MPI

        world, group = MPI.COMM_WORLD.Get_group(), comm.Get_group()
        try:
            return tuple(group.Translate_ranks(list(range(comm.Get_size())), world))
        finally:
            group.Free()
            world.Free()
    except Exception:  # noqa: BLE001 - a wrapper without groups (a test's counting communicator): never cached
        return None


def _ask_mpi(comm) -> NodeLayout:
    """Collective: the layout from ``Split_type(COMM_TYPE_SHARED)``: each rank's node leader, allgathered."""
    from mpi4py import MPI

    node_comm = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        leader = node_comm.bcast(comm.Get_rank(), root=0)
    finally:
        node_comm.Free()
    return layout_from_ids(comm.allgather(leader))
