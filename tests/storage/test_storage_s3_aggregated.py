"""Aggregation on a bucket of the real Ceph gateway (tests/storage/conftest.py): one data object per simulated
node, restored on another rank count; the strategies an object store cannot hold are refused."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

import hpcckpt
from hpcckpt.core.names import aggregator_file
from hpcckpt.errors import CheckpointError
from hpcckpt.root.catalog import current, list_versions
from hpcckpt.storage import POSIX


@pytest.mark.parametrize("strategy", ["auto", "aggregated"])
def test_four_ranks_on_two_nodes_write_one_object_per_node_and_restore_on_three(gateway, strategy):
    """4 ranks on 2 simulated nodes save 3 steps into the bucket: each committed version holds 2 data objects
    (one per node's aggregator, ``auto`` choosing aggregated there); 3 ranks restore the newest exactly."""
    from mpitools import run_mpi

    from hpcckpt.storage.s3 import storage_for

    root = f"s3://hpcckpt/aggregated-{strategy}-{uuid.uuid4().hex[:8]}"
    proc = run_mpi(4, "tests/scripts/s3_ranks.py", "save", root, f"strategy={strategy}", "ranks_per_node=2",
                   timeout=300)
    assert [line for line in proc.stdout.splitlines() if line.startswith("step ")] == \
        [f"step {s}: aggregated" for s in (1, 2, 3)], proc.stdout
    st = storage_for(root, POSIX)
    live = current(list_versions(root, st))
    assert [e.step for e in live] == [2, 3]
    for e in live:
        assert sorted(f"data/{n}" for n in st.listdir(f"{e.path}/data")) == [aggregator_file(0), aggregator_file(2)], \
            e.path
    proc = run_mpi(3, "tests/scripts/s3_ranks.py", "restore", root, timeout=300)
    assert "restored step 3 on 3 ranks, versions [2, 3]" in proc.stdout, proc.stdout


def test_shared_file_is_refused_on_a_bucket(gateway):
    """An object has one writer: the shared-file strategy is one CheckpointError naming what runs there, and no
    version is left in the bucket."""
    from hpcckpt.storage.s3 import storage_for

    root = f"s3://hpcckpt/shared-{uuid.uuid4().hex[:8]}"
    with pytest.raises(CheckpointError, match="shared between ranks, which S3Storage does not hold: "
                                              "use file-per-rank or aggregated"):
        with hpcckpt.Checkpointer(root, strategy="shared-file", track_failures=False) as ck:
            ck.save({"u": hpcckpt.Block(np.arange(10.0))}, step=1)
    assert list_versions(root, storage_for(root, POSIX)) == []
