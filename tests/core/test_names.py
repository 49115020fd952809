"""hpcckpt.core.names: the one spelling of the names inside a root and a version."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcckpt.core import names


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


def test_variable_and_value_names_up_to_the_format_limit_save_and_load(tmp_path):
    """docs/format.md 3.1: a name is at most 1024 characters; a save of one that long works."""
    import numpy as np

    import hpcckpt
    from hpcckpt.mpi.collective import SerialComm

    assert names.MAX_NAME_CHARS == 1024
    var, val = "v" * 1024, "w" * 1024
    nested = {"g" * 1000: {"u" * 23: hpcckpt.Block(np.arange(3.0))}}  # path "ggg.../uuu...": 1024 characters
    hpcckpt.save({var: hpcckpt.Block(np.arange(4.0)), val: 7, **nested}, str(tmp_path / "ck"), SerialComm())
    out = np.zeros(4)
    got = hpcckpt.load({var: hpcckpt.Block(out), val: None, "g" * 1000: {"u" * 23: hpcckpt.Block(np.zeros(3))}},
                       str(tmp_path / "ck"), SerialComm())
    assert np.array_equal(out, np.arange(4.0)) and got[val] == 7


@pytest.mark.parametrize("state", [
    lambda np, hk: {"v" * 1025: hk.Block(np.zeros(2))},                   # a variable
    lambda np, hk: {"w" * 1025: 3},                                        # a value
    lambda np, hk: {"g" * 1000: {"u" * 24: hk.Block(np.zeros(2))}},       # a nested path of 1025 characters
], ids=["variable", "value", "nested-path"])
def test_a_longer_name_is_refused_saying_the_limit_and_its_length(tmp_path, state):
    """Was "state keys must be non-empty strings" (the name is one), with the whole name in the message."""
    import numpy as np

    import hpcckpt
    from hpcckpt.mpi.collective import SerialComm

    with pytest.raises(hpcckpt.CheckpointError) as info:
        hpcckpt.save(state(np, hpcckpt), str(tmp_path / "ck"), SerialComm())
    msg = str(info.value)
    assert "1025 characters long" in msg and "at most 1024 characters" in msg, msg
    assert "non-empty" not in msg and len(msg) < 600, msg  # the name is cut, not printed whole
    assert not (tmp_path / "ck" / "metadata.json").exists()
    hpcckpt.save({"v": hpcckpt.Block(np.zeros(2))}, str(tmp_path / "ck"), SerialComm())
    with pytest.raises(hpcckpt.TemplateMismatchError, match="1025 characters long"):  # a load template too
        hpcckpt.load(state(np, hpcckpt), str(tmp_path / "ck"), SerialComm(), strict=False)


@pytest.mark.parametrize("name", ["", 3, None])
def test_an_empty_or_non_string_name_keeps_its_message(name):
    assert names.state_name_problem(name) == f"state keys must be non-empty strings, got {name!r}"
    assert names.state_name_problem("x") is None and names.state_name_problem("a/b" * 400) is not None
