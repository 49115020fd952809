"""The cluster helper itself, without starting daemons: its configuration (its installs: tests/harness/test_aptget.py)."""

from __future__ import annotations

import os

import localslurm


def test_config_is_private(tmp_path):
    c = localslurm.LocalSlurm(str(tmp_path / "c"), cpus=4)
    c.write_config()
    conf = open(c.conf).read()
    assert f"AuthInfo=socket={c.socket}" in conf
    assert f"StateSaveLocation={c.path('state')}" in conf
    assert "NodeName=localhost NodeAddr=127.0.0.1 CPUs=4" in conf
    assert "ProctrackType=proctrack/linuxproc" in conf and "TaskPlugin=task/none" in conf
    ports = [int(line.split("=")[1]) for line in conf.splitlines() if line.startswith(("SlurmctldPort=", "SlurmdPort="))]
    assert len(set(ports)) == 2 and all(p > 1024 for p in ports)
    assert oct(os.stat(c.path("munge.key")).st_mode & 0o777) == "0o400"
    env = c.env()
    assert env["SLURM_CONF"] == c.conf and not any(k.startswith("SLURM_JOB") for k in env)
    assert c.alive() == {} and c.stepds() == []
    c.stop()  # nothing started: a no-op
