"""hpcckpt.testing.CheckpointerTests run for every kind of save: blocking, incremental,
asynchronous, asynchronous + incremental, multi-level, and multi-level + asynchronous + incremental."""

from __future__ import annotations

import pytest

from hpcckpt.testing import CheckpointerTests

pytestmark = pytest.mark.filterwarnings("ignore:hpcckpt. a single node")


class TestBlocking(CheckpointerTests):
    options = {}


class TestIncremental(CheckpointerTests):
    options = {"incremental": True, "block_bytes": 4096}


class TestAsynchronous(CheckpointerTests):
    options = {"asynchronous": True, "staging_bytes": 1 << 20}


class TestAsynchronousIncremental(CheckpointerTests):
    options = {"asynchronous": True, "incremental": True, "block_bytes": 4096}


class TestMultiLevel(CheckpointerTests):
    options = {"local_dir": True}


class TestMultiLevelAsynchronousIncremental(CheckpointerTests):
    options = {"local_dir": True, "asynchronous": True, "incremental": True, "block_bytes": 4096}
