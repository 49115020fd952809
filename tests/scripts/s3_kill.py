"""Save step 1, then step 2, of a 96 MiB field to a Checkpointer root in a bucket; the test kills this process
while step 2's data object is still a multipart upload (tests/storage/test_storage_s3.py)."""

import sys

import numpy as np

import hpcckpt

root = sys.argv[1]
u = np.random.default_rng(0).random(12 << 20)
with hpcckpt.Checkpointer(root) as ck:
    ck.save({"u": hpcckpt.Block(u), "t": 1}, step=1, codec="none")
    print("saved 1", flush=True)
    ck.save({"u": hpcckpt.Block(u + 1), "t": 2}, step=2, codec="none")
    print("saved 2", flush=True)
