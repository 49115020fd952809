"""``hpcckpt ls/inspect/verify/gc/export`` on a root in a bucket of the real Ceph gateway (tests/storage/conftest.py),
run as a user runs them: ``python -m hpcckpt`` in a subprocess, pointed at the gateway by boto3's environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import numpy as np

import hpcckpt
from testpaths import REPO


def _cli(*argv) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "hpcckpt", *map(str, argv)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=REPO)


def _u(step: int) -> np.ndarray:
    u = np.arange(64 * 40, dtype=np.float64).reshape(64, 40)
    u[step] += step
    return u


def test_the_cli_on_a_bucket_root(gateway, tmp_path):
    """An incremental chain of three versions and a partial one: ls lists them, inspect and export read the
    newest (its referenced objects included), verify passes and then names a flipped byte, gc removes the partial
    version but keeps the base the kept version references."""
    import boto3
    import h5py

    from hpcckpt.core.names import rank_file
    from hpcckpt.storage.s3 import split_path

    root = f"s3://hpcckpt/cli-{uuid.uuid4().hex[:8]}"
    with hpcckpt.Checkpointer(root, incremental=True, block_bytes=1024, track_failures=False) as ck:
        for step in (1, 2, 3):
            ck.save({"u": hpcckpt.Block(_u(step)), "t": step}, step=step)
        partial = f"{root}/step-000000000004"
        ck.storage.make_version(partial)

    proc = _cli("ls", root, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [(v["name"], v["state"]) for v in doc["versions"]] == [
        ("step-000000000001", "committed"), ("step-000000000002", "committed"), ("step-000000000003", "committed"),
        ("step-000000000004", "partial")]
    assert all(v["size"] > 0 for v in doc["versions"][:3])

    proc = _cli("inspect", root)
    assert proc.returncode == 0, proc.stderr
    assert "step-000000000003" in proc.stdout and "MISSING" not in proc.stdout
    assert "of other versions, referenced" in proc.stdout

    out = tmp_path / "out.h5"
    proc = _cli("export", root, out, "--no-progress")
    assert proc.returncode == 0, proc.stderr
    with h5py.File(out, "r") as f:
        assert np.array_equal(f["u"][...], _u(3))

    proc = _cli("verify", root)
    assert proc.returncode == 0 and proc.stdout.startswith(f"OK: {root}: 3 versions"), proc.stdout + proc.stderr

    proc = _cli("gc", root, "--keep", "1", "--grace", "0")
    assert proc.returncode == 0, proc.stderr
    assert "step-000000000004" in proc.stdout and "partial (never committed)" in proc.stdout
    assert "a kept version references its data" in proc.stdout  # step 1 holds blocks step 3 still reads
    doc = json.loads(_cli("ls", root, "--json").stdout)
    names = [v["name"] for v in doc["versions"]]
    assert "step-000000000004" not in names and "step-000000000003" in names
    assert "step-000000000001" in names  # the base

    bucket, key = split_path(f"{root}/step-000000000001/{rank_file(0)}")
    s3 = boto3.client("s3")
    body = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[-1] ^= 0xFF
    s3.put_object(Bucket=bucket, Key=key, Body=bytes(body))
    proc = _cli("verify", root)
    assert proc.returncode == 1 and "CORRUPT:" in proc.stdout and "FAILED" in proc.stdout, proc.stdout + proc.stderr
