"""hpcckpt.names: the one spelling of the names inside a root and a version."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcckpt import names


@given(st.integers(0, names.MAX_VERSION_STEP), st.integers(0, 999_999))
def test_version_names_round_trip_and_sort_like_their_order(step, revision):
    name = names.version_name(step, revision)
    assert names.parse_version_name(name) == (step, revision)
    assert names.parse_version_name(names.version_name(step)) == (step, 0)


@pytest.mark.parametrize("name", ["step-1", "step-0000000000001", "step-000000000001.r", "step-000000000001.r1234567",
                                  "step-00000000000a", "metadata.json", ".hpcckpt-lock", "failure_history.json",
                                  "step-000000000001.tmp", " step-000000000001"])
def test_other_names_are_not_versions(name):
    assert names.parse_version_name(name) is None


def test_data_file_names():
    assert names.rank_file(3) == "data/part-000003.bin"
    assert names.aggregator_file(12) == "data/agg-000012.bin"
    assert names.compacted_file(0) == "data/compact-000000.bin"
    assert names.parity_file(7) == "parity/xor-000007.bin"
    assert names.SHARED_FILE == "data/shared.bin"


@given(st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,20}", fullmatch=True), st.text(min_size=1, max_size=20))
def test_references_round_trip(version, path):
    assert names.is_reference_version(version)
    assert names.split_reference(names.reference(version, path)) == (version, path)
    assert names.split_reference(path.lstrip("@")) is None
