"""hpcckpt.slurm: detection of the SLURM environment from a mapping (pure, no SLURM needed)."""

from __future__ import annotations

import json
import warnings

import pytest
from hypothesis import given, strategies as st

from hpcckpt import slurm
from hpcckpt.slurm import HostlistError, SlurmEnv, detect, expand_hostlist, parse_tasks_per_node

# The variables of a real batch step (slurm-wlm 22.05 on localhost, 4 tasks), plus the 23.02 end time.
BATCH = {
    "SLURM_JOB_ID": "4", "SLURM_JOBID": "4", "SLURM_JOB_NAME": "hpcckpt", "SLURM_CLUSTER_NAME": "hpcckpt",
    "SLURM_JOB_PARTITION": "debug", "SLURM_SUBMIT_DIR": "/tmp/run1", "SLURM_RESTART_COUNT": "1",
    "SLURM_JOB_NODELIST": "localhost", "SLURM_NODELIST": "localhost", "SLURM_JOB_NUM_NODES": "1",
    "SLURM_NNODES": "1", "SLURM_TASKS_PER_NODE": "4", "SLURM_NTASKS": "4", "SLURM_NPROCS": "4",
    "SLURM_JOB_CPUS_PER_NODE": "4", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
    "SLURMD_NODENAME": "localhost", "SLURM_JOB_START_TIME": "1795984000", "SLURM_JOB_END_TIME": "1795987600",
}


def test_outside_slurm_every_field_is_none():
    info = detect({"PATH": "/usr/bin", "HOME": "/root"})
    assert not info.in_slurm and not info.in_step
    for name, value in info.as_dict().items():
        if name not in ("in_slurm", "in_step"):
            assert value is None, name
    assert info.time_left() is None and info.ranks_per_node() is None and info.restarted is None
    assert info.node_of_task(0) is None
    assert info.summary() == "not in a SLURM job"


def test_stray_slurm_variables_without_a_job_id_are_not_a_job():
    info = detect({"SLURM_CONF": "/etc/slurm/slurm.conf", "SLURM_NTASKS": "4"})
    assert not info.in_slurm and info.ntasks is None
    assert info.raw == {"SLURM_CONF": "/etc/slurm/slurm.conf", "SLURM_NTASKS": "4"}


def test_batch_step():
    info = detect(BATCH)
    assert info.in_slurm and info.in_step
    assert info.job_id == 4 and info.restart_count == 1 and info.restarted
    assert info.job_name == "hpcckpt" and info.cluster == "hpcckpt" and info.partition == "debug"
    assert info.nodelist == ("localhost",) and info.num_nodes == 1
    assert info.tasks_per_node == (4,) and info.ntasks == 4 and info.cpus_per_node == (4,)
    assert (info.procid, info.localid, info.nodeid, info.nodename) == (0, 0, 0, "localhost")
    assert info.start_time == 1795984000 and info.end_time == 1795987600
    assert info.time_left(now=1795987000) == 600
    assert info.time_left(now=1795988000) == -400
    assert info.summary().startswith("job=4 restart=1 nodes=1(localhost) tasks=4 per_node=4 end_in=")
    assert json.loads(json.dumps(info.as_dict()))["job_id"] == 4


def test_restart_count_is_zero_before_the_first_requeue():
    env = dict(BATCH)
    del env["SLURM_RESTART_COUNT"]
    info = detect(env)
    assert info.restart_count == 0 and info.restarted is False


def test_older_variable_names():
    info = detect({"SLURM_JOBID": "77", "SLURM_NODELIST": "n[1-2]", "SLURM_NNODES": "2", "SLURM_NPROCS": "6"})
    assert info.job_id == 77 and info.nodelist == ("n1", "n2") and info.num_nodes == 2 and info.ntasks == 6
    assert info.end_time is None and info.time_left() is None


def test_multi_node_step_and_block_placement():
    env = {"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "cn[001-004]", "SLURM_JOB_NUM_NODES": "4",
           "SLURM_TASKS_PER_NODE": "2(x3),1", "SLURM_NTASKS": "7",
           "SLURM_STEP_NODELIST": "cn[001-003]", "SLURM_STEP_NUM_NODES": "3", "SLURM_STEP_NUM_TASKS": "5",
           "SLURM_STEP_TASKS_PER_NODE": "2(x2),1", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3",
           "SLURM_ARRAY_JOB_ID": "8", "SLURM_ARRAY_TASK_ID": "1"}
    info = detect(env)
    assert info.tasks_per_node == (2, 2, 2, 1)
    assert info.ranks_per_node() == (2, 2, 1)  # the step's, inside a step
    assert info.step_nodelist == ("cn001", "cn002", "cn003") and info.step_ntasks == 5 and info.step_id == "0"
    assert [info.node_of_task(t) for t in range(6)] == ["cn001", "cn001", "cn002", "cn002", "cn003", None]
    assert (info.array_job_id, info.array_task_id) == (8, 1)
    no_step = detect({k: v for k, v in env.items() if not k.startswith("SLURM_STEP")})
    assert no_step.ranks_per_node() == (2, 2, 2, 1)
    assert no_step.node_of_task(6) == "cn004" and no_step.node_of_task(-1) is None


@pytest.mark.parametrize("name,value,field", [
    ("SLURM_RESTART_COUNT", "x", "restart_count"),
    ("SLURM_RESTART_COUNT", "-1", "restart_count"),
    ("SLURM_JOB_END_TIME", "soon", "end_time"),
    ("SLURM_TASKS_PER_NODE", "2(x)", "tasks_per_node"),
    ("SLURM_JOB_NODELIST", "n[1-", "nodelist"),
    ("SLURM_PROCID", "1.5", "procid"),
])
def test_a_malformed_value_becomes_none_with_a_warning(name, value, field):
    with pytest.warns(RuntimeWarning, match=name):
        info = detect({**BATCH, name: value})
    assert getattr(info, field) is None
    assert info.job_id == 4  # the rest still detected


def test_unlimited_end_time_is_none():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert detect({**BATCH, "SLURM_JOB_END_TIME": "0"}).end_time is None
        assert detect({**BATCH, "SLURM_JOB_END_TIME": ""}).end_time is None


def test_default_mapping_is_os_environ(monkeypatch):
    for k in list(__import__("os").environ):
        if k.startswith("SLURM"):
            monkeypatch.delenv(k)
    assert detect() == SlurmEnv()
    monkeypatch.setenv("SLURM_JOB_ID", "123")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "3")
    info = detect()
    assert info.job_id == 123 and info.tasks_per_node == (3,) and info.restart_count == 0


def test_main_prints_one_line(monkeypatch, capsys):
    monkeypatch.setattr(slurm.os, "environ", dict(BATCH))
    assert slurm.main([]) == 0
    assert capsys.readouterr().out.startswith("hpcckpt.slurm: job=4 restart=1 nodes=1(localhost) tasks=4")
    assert slurm.main(["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tasks_per_node"] == [4]
    assert slurm.main(["--bogus"]) == 2


# -- host lists ------------------------------------------------------------------------------
@pytest.mark.parametrize("text,hosts", [
    ("localhost", ["localhost"]),
    ("", []),
    ("n1,n2", ["n1", "n2"]),
    ("node[01-03,07],gpu1", ["node01", "node02", "node03", "node07", "gpu1"]),
    ("nid[0008-0010]", ["nid0008", "nid0009", "nid0010"]),
    ("c[8-11]", ["c8", "c9", "c10", "c11"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("a[1-2]-ib,b[0]", ["a1-ib", "a2-ib", "b0"]),
    ("x[0]", ["x0"]),
])
def test_expand_hostlist(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("bad", ["n[1-", "n1-2]", "n[3-1]", "n[a-b]", "n[[1]]", "n1,,n2", "n[]", None])
def test_expand_hostlist_rejects(bad):
    with pytest.raises(HostlistError):
        expand_hostlist(bad)


@pytest.mark.parametrize("text,counts", [
    ("4", [4]), ("2(x3),1", [2, 2, 2, 1]), ("1,2(x2)", [1, 2, 2]), ("0(x2)", [0, 0]),
])
def test_parse_tasks_per_node(text, counts):
    assert parse_tasks_per_node(text) == counts


@pytest.mark.parametrize("bad", ["", "x", "2(x0)", "2(3)", "2(x3", "-1", "1,,2", None])
def test_parse_tasks_per_node_rejects(bad):
    with pytest.raises(HostlistError):
        parse_tasks_per_node(bad)


def _compress(counts):
    """The SLURM notation of a list of counts (runs of equal values as N(xK))."""
    out, i = [], 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[j] == counts[i]:
            j += 1
        out.append(str(counts[i]) if j - i == 1 else f"{counts[i]}(x{j - i})")
        i = j
    return ",".join(out)


@given(st.lists(st.integers(0, 64), min_size=1, max_size=40))
def test_tasks_per_node_round_trip(counts):
    assert parse_tasks_per_node(_compress(counts)) == counts


@given(st.text("abz-", min_size=1, max_size=4), st.integers(0, 500), st.integers(0, 30), st.integers(1, 4))
def test_hostlist_range_matches_formatting(prefix, lo, span, width):
    text = f"{prefix}[{lo:0{width}d}-{lo + span:0{width}d}]"
    pad = width if width > 1 and len(f"{lo:0{width}d}") == width and f"{lo:0{width}d}".startswith("0") else 0
    assert expand_hostlist(text) == [f"{prefix}{i:0{pad}d}" for i in range(lo, lo + span + 1)]
