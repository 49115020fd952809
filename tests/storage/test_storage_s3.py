"""hpcckpt.storage.s3 against a real Ceph object gateway on localhost (tests/support/ceph_gateway.py), never a mock.

The session starts one single-node cluster (installing Debian's ceph packages,
and boto3, when missing: about 150 s the first time on a bare machine, then
about 20 s to start) and stops it at the end.  Where the packages cannot be
had (not root, no apt-get) the tests skip with the reason.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import subprocess
import sys
import uuid

import numpy as np
import pytest

from hpcckpt.testing import StorageTests
from testpaths import SCRIPTS

BOTO3 = "boto3>=1.35"  # put_object(IfNoneMatch=...) is in botocore from 1.35 (setup.cfg's s3 extra)


def _ensure_boto3() -> None:
    if importlib.util.find_spec("boto3") is not None:
        return
    with open(os.path.join(sys.prefix, ".hpcckpt-pip-install.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", BOTO3], capture_output=True, text=True)
        assert proc.returncode == 0, f"pip install {BOTO3} failed: {(proc.stdout + proc.stderr)[-800:]}"


@pytest.fixture(scope="session")
def gateway():
    from ceph_gateway import CephGateway, ensure_packages

    ensure_packages()  # skips where apt-get cannot run here, fails where it fails
    _ensure_boto3()
    gw = CephGateway()
    try:
        gw.start()
    except BaseException:
        gw.stop()  # the daemons started before the failure
        raise
    saved = {k: os.environ.get(k) for k in gw.environment()}
    os.environ.update(gw.environment())
    import boto3

    boto3.client("s3").create_bucket(Bucket="hpcckpt")
    try:
        yield gw
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        gw.stop()


@pytest.fixture(scope="session")
def s3storage(gateway):
    from hpcckpt.storage.s3 import S3Storage

    return S3Storage()


class TestS3(StorageTests):
    @pytest.fixture(autouse=True)
    def _storage(self, s3storage):
        self.storage = s3storage

    def make(self, tmp_path):
        base = f"s3://hpcckpt/conformance/{tmp_path.name}-{uuid.uuid4().hex[:8]}"
        self.storage.make_directories(base)  # as tmp_path is a directory for POSIX (an object store has none)
        return self.storage, base


def test_version_objects_and_a_bounded_parallel_read(s3storage):
    """A file larger than two parts goes out as a multipart upload and comes back in ranged GETs."""
    from hpcckpt.core.checksum import hexdigest, new_hasher

    st = s3storage
    base = f"s3://hpcckpt/multipart-{uuid.uuid4().hex[:8]}"
    st.make_version(base)
    data = np.random.default_rng(0).integers(0, 255, 3 * st.part_bytes + 12345, dtype=np.uint8)
    before = dict(st.requests)
    handle = st.create(base + "/data/r0.bin")
    h = new_hasher()
    for lo in range(0, data.size, 1 << 20):
        st.append(handle, data[lo:lo + (1 << 20)], h)
    st.close(handle, fsync=True)
    assert st.requests["upload_part"] - before.get("upload_part", 0) == 3
    assert st.requests["complete_multipart_upload"] - before.get("complete_multipart_upload", 0) == 1
    reader, size = st.open_read(base + "/data/r0.bin")
    assert size == data.size
    out = np.empty_like(data)
    check = new_hasher()
    gets = st.requests["get_object"]
    st.read_segments(reader, 0, out, "r0", [(data.size, check)])
    assert np.array_equal(out, data) and hexdigest(check) == hexdigest(h)
    assert st.requests["get_object"] - gets == 4


def test_save_and_load_by_an_s3_path(gateway):
    """hpcckpt.save/load/open("s3://...") with the default storage go to the bucket."""
    import hpcckpt
    from hpcckpt.storage.s3 import storage_for
    from hpcckpt.storage import POSIX

    path = f"s3://hpcckpt/api-{uuid.uuid4().hex[:8]}/ck"
    u = np.arange(20000, dtype=np.float64).reshape(200, 100)
    hpcckpt.save({"u": hpcckpt.Block(u), "t": 3}, path)
    st = storage_for(path, POSIX)
    assert st is not POSIX and st.is_file(path + "/metadata.json")
    got = hpcckpt.load({"u": hpcckpt.Block(np.zeros_like(u)), "t": None}, path)
    assert np.array_equal(got["u"].local, u) and got["t"] == 3
    with hpcckpt.open(path) as view:
        assert view.verify() == [] and np.array_equal(view.read("u", (slice(5, 9), slice(0, 3))), u[5:9, :3])


def test_a_checkpointer_root_in_a_bucket(gateway):
    """Saves, retention, a restore, a damaged newest version refused for the one before, asynchronous saves."""
    import boto3

    import hpcckpt
    from hpcckpt.core.names import rank_file
    from hpcckpt.storage import POSIX
    from hpcckpt.storage.s3 import split_path, storage_for

    root = f"s3://hpcckpt/root-{uuid.uuid4().hex[:8]}"
    u = np.arange(1000.0)
    with hpcckpt.Checkpointer(root, keep=2) as ck:
        st = ck.storage
        assert st is storage_for(root, POSIX) and st is not POSIX
        for step in (1, 2, 3):
            before = sum(st.requests.values())
            ck.save({"u": hpcckpt.Block(u + step), "t": step}, step=step)
            print(f"requests of save {step}: {sum(st.requests.values()) - before}")
        assert ck.latest() == 3
        assert sorted(n for n in st.listdir(root) if n.startswith("step-")) == ["step-000000000002",
                                                                               "step-000000000003"]
        half = f"{root}/step-000000000004"  # what a save killed before its commit leaves: data, no metadata
        st.make_version(half)
        handle = st.create(f"{half}/{rank_file(0)}")
        st.append(handle, b"x" * 100)
        st.close(handle, fsync=True)
        assert ck.steps() == [2, 3]
        got = ck.restore({"u": hpcckpt.Block(np.zeros(1000)), "t": None})
        assert got["t"] == 3 and np.array_equal(got["u"].local, u + 3)
        from hpcckpt.root.catalog import gc

        assert gc(root, keep=2, storage=st) == ["step-000000000004"] and not st.exists(half)
        bucket, key = split_path(f"{root}/step-000000000003/{rank_file(0)}")
        s3 = boto3.client("s3")
        body = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        body[-1] ^= 0xFF  # one bit flipped at rest: the checksum refuses it
        s3.put_object(Bucket=bucket, Key=key, Body=bytes(body))
        with pytest.warns(UserWarning, match="skipping unusable version"):
            got = ck.restore({"u": hpcckpt.Block(np.zeros(1000)), "t": None})
        assert got["t"] == 2 and np.array_equal(got["u"].local, u + 2)
    with hpcckpt.Checkpointer(root + "-async", keep=2, asynchronous=True) as ck:
        for step in (1, 2, 3):
            ck.save({"u": hpcckpt.Block(u * step), "t": step}, step=step)
    with hpcckpt.Checkpointer(root + "-async", keep=2) as ck:
        got = ck.restore({"u": hpcckpt.Block(np.zeros(1000)), "t": None})
        assert got["t"] == 3 and np.array_equal(got["u"].local, u * 3)
        assert [s for s in ck.steps()] == [2, 3]


def test_save_on_four_ranks_restore_on_three(gateway):
    """A Checkpointer root in the bucket, written by 4 MPI ranks (one object per rank and version), read by 3."""
    from mpitools import run_mpi

    root = f"s3://hpcckpt/ranks-{uuid.uuid4().hex[:8]}"
    run_mpi(4, "tests/scripts/s3_ranks.py", "save", root, timeout=300)
    proc = run_mpi(3, "tests/scripts/s3_ranks.py", "restore", root, timeout=300)
    assert "restored step 3 on 3 ranks, versions [2, 3]" in proc.stdout


def test_a_save_killed_mid_upload_leaves_the_old_version(gateway):
    """SIGKILL while step 2's object is a multipart upload: step 1 restores, gc removes step 2 and aborts the
    upload whose parts no object listing shows."""
    import time

    import boto3

    import hpcckpt
    from hpcckpt.root.catalog import gc
    from hpcckpt.storage import POSIX
    from hpcckpt.storage.s3 import split_path, storage_for

    root = f"s3://hpcckpt/kill-{uuid.uuid4().hex[:8]}"
    bucket, key = split_path(root)
    s3 = boto3.client("s3")
    script = os.path.join(SCRIPTS, "s3_kill.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, script, root], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "saved 1"
        deadline = time.monotonic() + 120
        while not s3.list_multipart_uploads(Bucket=bucket, Prefix=f"{key}/step-000000000002/").get("Uploads"):
            assert proc.poll() is None and time.monotonic() < deadline, "step 2 was never a multipart upload"
            time.sleep(0.02)
        proc.kill()
    finally:
        proc.kill()
        proc.wait()
    st = storage_for(root, POSIX)
    assert not st.exists(f"{root}/step-000000000002/metadata.json")
    with hpcckpt.Checkpointer(root) as ck:
        assert ck.steps() == [1]
        got = ck.restore({"u": hpcckpt.Block(np.zeros(12 << 20)), "t": None})
        assert got["t"] == 1
    assert gc(root, storage=st) == ["step-000000000002"]
    assert not s3.list_multipart_uploads(Bucket=bucket, Prefix=f"{key}/").get("Uploads")
