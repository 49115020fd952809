"""The Ceph object gateway of the tests/storage/test_storage_s3*.py files (tests/support/ceph_gateway.py).

The session starts one single-node cluster (installing Debian's ceph packages,
and boto3, when missing: about 150 s the first time on a bare machine, then
about 20 s to start) and stops it at the end; under pytest-xdist those files
run on one worker (tests/conftest.py), so the cluster starts once.  Where the
packages cannot be had (not root, no apt-get) the tests skip with the reason.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import subprocess
import sys

import pytest

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
