"""SLURM on the namespace nodes: one slurmctld on a head node, one slurmd per compute node, one munged.

``ClusterSlurm(nodes)`` is tests/slurm/localslurm.py's LocalSlurm (the same
settings, daemon start-up by pid file, stop by PID) with these differences:

* slurmctld runs in a head node of its own (a namespace node like the
  others, so losing a compute node never takes the controller with it);
  the client commands (sbatch, scontrol, sinfo...) run there too, because
  the nodes' addresses are reachable only from the bridge;
* one slurmd per compute node, each in its node's namespaces (``slurmd -N
  <hostname>``), with its own spool directory, pid and log file (``%n`` in
  slurm.conf);
* munged runs on the host: its socket is a path in the cluster directory,
  which every node's mount namespace sees (a UNIX socket by path crosses
  network namespaces);
* ``SlurmdTimeout`` is short, so that a lost node is marked not responding
  (and left out by slurm/restart-loop.sh) within seconds.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "slurm"))
from localslurm import LocalSlurm, ensure_installed  # noqa: E402,F401  (ensure_installed: for the fixture)

#: Index of the head node (address 10.77.0.201): out of the way of compute nodes and spares.
HEAD_INDEX = 200
#: CPUs declared per compute node (the machine has fewer: config_overrides, as in localslurm).
NODE_CPUS = 2


class ClusterSlurm(LocalSlurm):
    def __init__(self, nodes, workdir: str):
        self.nodes = nodes
        self.head = nodes.add_node(HEAD_INDEX, f"{nodes.prefix}h")
        nodes.service.add(self.head)
        super().__init__(workdir, cpus=NODE_CPUS)
        self.hostname = self.head

    def settings(self, ctld_port: int, slurmd_port: int) -> dict:
        out = super().settings(ctld_port, slurmd_port)
        out.update({
            "SlurmctldHost": f"{self.head}({self.nodes.address(self.head)})",
            "SlurmdSpoolDir": self.path("spool", "%n"),
            "SlurmdPidFile": self.path("slurmd-%n.pid"),
            "SlurmdLogFile": self.path("log", "slurmd-%n.log"),
            "SlurmdTimeout": 10,
            "MessageTimeout": 10,
            "TreeWidth": 16,
        })
        return out

    def node_lines(self) -> list[str]:
        names = self.nodes.names
        lines = [f"NodeName={n} NodeAddr={self.nodes.address(n)} CPUs={self.cpus} State=UNKNOWN" for n in names]
        lines.append(f"PartitionName=debug Nodes={','.join(names)} Default=YES MaxTime=INFINITE State=UP "
                     "OverSubscribe=NO")
        return lines

    def slurmds(self) -> list[tuple[str, list[str], str]]:
        for n in self.nodes.names:
            os.makedirs(self.path("spool", n), exist_ok=True)
        return [(f"slurmd-{n}", ["slurmd", "-f", self.conf, "-N", n], self.path(f"slurmd-{n}.pid"))
                for n in self.nodes.names]

    def where(self, name: str) -> list[str]:
        if name == "munged":
            return []
        if name.startswith("slurmd-"):
            return self.nodes.enter(name[len("slurmd-"):])
        return self.nodes.enter(self.head)  # slurmctld and the client commands

    def revive(self) -> list[str]:
        """Start slurmd again on every compute node that has none (a node replaced after a loss)."""
        revived = []
        for name, cmd, pidfile in self.slurmds():
            if name not in self.alive():
                self.procs.pop(name, None)
                try:
                    os.unlink(pidfile)
                except FileNotFoundError:
                    pass
                self._daemon(name, cmd, pidfile)
                node = name[len("slurmd-"):]
                self.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
                revived.append(node)
        if revived:
            self.wait_idle()
        return revived
