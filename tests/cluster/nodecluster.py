"""A cluster of K real nodes on one Linux machine, made of namespaces, for tests (root needed).

Each node is a long-lived *holder* process (``sleep``) that owns three namespaces
made with ``unshare``:

* a network namespace with ``lo`` and an ``eth0`` (one end of a veth pair whose
  other end is a port of a private bridge), address ``10.77.0.<i+1>/24``;
  optionally limited in bandwidth (``link_rate``: a ``tc`` token bucket;
  this kernel has no ``netem`` for latency);
* a UTS namespace: its own hostname (``<prefix>n<i>``), so MPI's processor
  name and ``COMM_TYPE_SHARED`` see distinct nodes without ``ranks_per_node``;
* a mount namespace (propagation private) with a private tmpfs on
  ``<workdir>/local`` (the node-local L1 directory: the same path on every
  node, a different file system each), a private ``/dev/shm`` and an
  ``/etc/hosts`` that names every node.  ``<workdir>/shared`` is the host's
  directory, the same for all: the parallel file system (L4).

Commands run in a node through ``nsenter -t HOLDER -u -m -n``.  MPI jobs run
``mpiexec`` (hydra, from the venv) inside the first listed node with a hosts
file and ``-launcher rsh -launcher-exec <workdir>/nsrsh``: hydra's remote
proxies are started by that script in their node's namespaces, and the ranks
talk over TCP across the bridge (shared memory only within a node).

``lose(node)`` is a node failure: every process of the node's namespaces is
SIGKILLed (found by the namespace inode, the holder included), so the mount
namespace, its tmpfs and the node's network interface vanish with them.
``stop()`` does that for every node and deletes the bridge by name; what it
made is named ``hk<pid>...`` (the creating process's pid), so ``sweep()``
also removes the interfaces of a cluster whose creator died.

By hand: ``python tests/cluster/nodecluster.py [K] [--slurm]`` brings a cluster
up (with SLURM on it), prints how to enter a node and run an MPI job, and tears
it down on Ctrl-C (docs/testing.md).
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

PR_SET_PDEATHSIG = 1
SUBNET = "10.77.0"
REQUIRED = ("unshare", "nsenter", "mount", "ip", "tc")
#: Debian packages of those programs: installed with apt-get when missing (root, as the SLURM tests do).
APT_PACKAGES = ("util-linux", "mount", "iproute2")


def unavailable() -> str | None:
    """Why this machine cannot make namespace nodes (None when it can): checked by trying once.

    Missing programs are installed first (apt-get, as root), as tests/slurm does for SLURM: a failed apt-get fails
    the test (tests/support/aptget.py)."""
    if not sys.platform.startswith("linux"):
        return "namespace nodes need Linux"
    if os.geteuid() != 0:
        return "namespace nodes need root (network namespaces, veth pairs, a bridge, tmpfs mounts)"
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))  # aptget.py
    from aptget import apt_install

    apt_install(APT_PACKAGES, lambda: [p for p in REQUIRED if shutil.which(p) is None], "namespace nodes")
    probe = subprocess.run(["unshare", "--uts", "--mount", "--net", "--propagation", "private", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"unshare --uts --mount --net is not permitted here: {probe.stderr.strip()}"
    name = f"hk{os.getpid()}probe"[:15]
    probe = subprocess.run(["ip", "link", "add", name, "type", "bridge"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot create a bridge: {probe.stderr.strip()}"
    subprocess.run(["ip", "link", "del", name], capture_output=True)
    return None


def _die_with_parent() -> None:
    """preexec_fn: the holder is SIGKILLed if the test process dies (so a crashed run leaves no node)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _ns_id(pid: int, kind: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _sh(*cmd: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


LAUNCHER = """#!/bin/sh
# hydra's rsh launcher: nsrsh HOST COMMAND... -> run COMMAND in HOST's namespaces (written by nodecluster.py)
host=$1; shift
pid=$(cat "{nodes}/$host.pid") || exit 255
exec nsenter -t "$pid" -u -m -n --wd="$PWD" -- sh -c "$*"
"""


class NodeCluster:
    """K namespace nodes on a private bridge; see the module docstring."""

    def __init__(self, k: int = 4, workdir: str | None = None, link_rate: str | None = None):
        self.k = k
        self.link_rate = link_rate  # e.g. "1gbit": a tbf bandwidth limit on every node's eth0 (egress)
        self.dir = workdir or tempfile.mkdtemp(prefix="hpcckpt-cluster-", dir="/tmp")
        self.prefix = f"hk{os.getpid()}"
        self.bridge = f"{self.prefix}b"
        self.local = os.path.join(self.dir, "local")
        self.shared = os.path.join(self.dir, "shared")
        self.nodes_dir = os.path.join(self.dir, "nodes")
        self.launcher = os.path.join(self.dir, "nsrsh")
        self.holders: dict[str, subprocess.Popen] = {}  # node name -> holder process (this object's children)
        self.index: dict[str, int] = {}  # node name -> i (its address 10.77.0.<i+1>, its veth)
        self.service: set[str] = set()  # nodes that are not compute nodes (a SLURM head node)
        self.up_seconds = None

    def name(self, i: int) -> str:
        return f"{self.prefix}n{i}"

    @property
    def names(self) -> list[str]:
        return [self.name(i) for i in range(self.k)]

    # -- bring-up --------------------------------------------------------------------------------
    def start(self) -> "NodeCluster":
        t0 = time.monotonic()
        try:
            for d in (self.local, self.shared, self.nodes_dir):
                os.makedirs(d, exist_ok=True)
            os.chmod(self.dir, 0o755)
            with open(self.launcher, "w") as f:
                f.write(LAUNCHER.format(nodes=self.nodes_dir))
            os.chmod(self.launcher, 0o755)
            self.write_hosts()
            _sh("ip", "link", "add", self.bridge, "type", "bridge")
            _sh("ip", "link", "set", self.bridge, "up")
            for i in range(self.k):
                self.add_node(i)
        except BaseException:
            self.stop()
            raise
        self.up_seconds = time.monotonic() - t0
        return self

    def write_hosts(self) -> None:
        """The nodes' /etc/hosts: every node ever started (rewritten in place: the nodes bind-mount it)."""
        with open(os.path.join(self.dir, "hosts"), "w") as f:
            f.write("127.0.0.1 localhost\n" + "".join(f"{SUBNET}.{i + 1} {n}\n" for n, i in self.index.items()))

    def address(self, node: str) -> str:
        return f"{SUBNET}.{self.index[node] + 1}"

    def add_node(self, i: int, name: str | None = None) -> str:
        """Start node i (also a spare or a replacement: a fresh node with an empty tmpfs); address .i+1."""
        name = name or self.name(i)
        holder = subprocess.Popen(["unshare", "--uts", "--mount", "--net", "--propagation", "private",
                                   "sleep", "infinity"], stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        self.holders[name], self.index[name] = holder, i
        self.write_hosts()
        deadline = time.monotonic() + 10
        while _ns_id(holder.pid, "uts") == _ns_id(os.getpid(), "uts"):  # until unshare has exec'd sleep
            if holder.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"namespace holder of {name} did not start (exit {holder.poll()})")
            time.sleep(0.01)
        veth = f"{self.prefix}v{i}"
        _sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", str(holder.pid))
        _sh("ip", "link", "set", veth, "master", self.bridge, "up")
        setup = (f"hostname {name} && ip link set lo up && ip addr add {SUBNET}.{i + 1}/24 dev eth0 && "
                 f"ip link set eth0 up && mount -t tmpfs -o size=512m,mode=0755 tmpfs {self.local} && "
                 f"mount -t tmpfs -o mode=1777 tmpfs /dev/shm && mount --bind {self.dir}/hosts /etc/hosts")
        if self.link_rate:
            setup += f" && tc qdisc add dev eth0 root tbf rate {self.link_rate} burst 64kb latency 50ms"
        _sh("nsenter", "-t", str(holder.pid), "-u", "-m", "-n", "--", "sh", "-c", setup)
        with open(os.path.join(self.nodes_dir, f"{name}.pid"), "w") as f:
            f.write(f"{holder.pid}\n")
        return name

    # -- running things --------------------------------------------------------------------------
    def enter(self, node: str) -> list[str]:
        """The command prefix that runs a program in ``node``'s namespaces (cwd: the shared directory)."""
        return ["nsenter", "-t", str(self.holders[node].pid), "-u", "-m", "-n", f"--wd={self.shared}", "--"]

    def run(self, node: str, *cmd: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(self.enter(node) + list(cmd), capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"on {node}: {' '.join(cmd)} exited {proc.returncode}: {proc.stdout}{proc.stderr}")
        return proc

    def mpiexec_cmd(self, hosts: list[tuple[str, int]], mpiexec: str, argv: list[str]) -> list[str]:
        """mpiexec over ``hosts`` ([(node, ranks)], in rank order), launched from the first of them."""
        hostfile = os.path.join(self.dir, "hostfile-" + "-".join(f"{n}x{c}" for n, c in hosts))
        with open(hostfile, "w") as f:
            f.write("".join(f"{n}:{c}\n" for n, c in hosts))
        nranks = sum(c for _, c in hosts)
        return self.enter(hosts[0][0]) + [mpiexec, "-launcher", "rsh", "-launcher-exec", self.launcher,
                                          "-f", hostfile, "-n", str(nranks), *argv]

    def processes(self, node: str) -> list[int]:
        """Every process in ``node``'s namespaces (UTS or mount namespace of its holder), the holder too."""
        holder = self.holders[node].pid
        ids = {_ns_id(holder, "uts"), _ns_id(holder, "mnt")} - {None}
        if not ids:
            return []
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (_ns_id(int(entry), "uts") in ids or _ns_id(int(entry), "mnt") in ids):
                found.append(int(entry))
        return found

    def lose(self, node: str, timeout: float = 10) -> None:
        """A node failure: SIGKILL every process of the node; its tmpfs and interface go with them."""
        holder = self.holders[node]
        deadline = time.monotonic() + timeout
        while True:
            left = [p for p in self.processes(node) if _alive(p)]
            if not left:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes of {node} survive SIGKILL: {left}")
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        holder.wait(timeout=timeout)
        # The kernel removes the veth pair once the network namespace is freed.  Deleting it here
        # instead could drop the last packets of the killed processes (their FINs) still queued on
        # it, and then mpiexec would never learn that its proxy on this node is gone.
        veth = f"{self.prefix}v{self.index[node]}"
        while veth in link_names():
            if time.monotonic() > deadline:
                subprocess.run(["ip", "link", "del", veth], capture_output=True)
                break
            time.sleep(0.05)
        try:
            os.unlink(os.path.join(self.nodes_dir, f"{node}.pid"))
        except FileNotFoundError:
            pass
        del self.holders[node]

    def alive(self) -> list[str]:
        return [n for n, h in self.holders.items() if h.poll() is None]

    # -- tear-down -------------------------------------------------------------------------------
    def stop(self) -> None:
        """Lose every node, delete the bridge: safe to call twice, and after a failed start."""
        for node in list(self.holders):
            try:
                self.lose(node)
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
        for name in link_names():  # by name: the bridge and any veth left behind
            if name == self.bridge or name.startswith(f"{self.prefix}v"):
                subprocess.run(["ip", "link", "del", name], capture_output=True)

    def leftovers(self) -> list[str]:
        """What of this cluster still exists (holders, interfaces): empty after a clean stop()."""
        out = [f"holder of {n} (pid {h.pid})" for n, h in self.holders.items() if h.poll() is None]
        out += [f"interface {name}" for name in link_names() if name.startswith(self.prefix)]
        return out


def link_names() -> list[str]:
    """The names of the network interfaces of this (the host's) network namespace."""
    lines = _sh("ip", "-o", "link", "show", check=False).stdout.splitlines()
    return [line.split()[1].rstrip(":").split("@")[0] for line in lines if len(line.split()) > 1]


def sweep() -> list[str]:
    """Delete the interfaces named ``hk<pid>...`` whose creating process no longer exists (a crashed run)."""
    removed = []
    for name in link_names():
        made = re.fullmatch(r"hk(\d+)(b|v\d+)", name)
        if made and not os.path.exists(f"/proc/{made.group(1)}"):
            subprocess.run(["ip", "link", "del", name], capture_output=True)
            removed.append(name)
    return removed


def main(argv: list[str]) -> None:
    """Bring a cluster up by hand (``[K] [--slurm]``), print how to use it, tear it down on Ctrl-C."""
    why = unavailable()
    if why:
        sys.exit(why)
    signal.signal(signal.SIGTERM, lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    k = int(next((a for a in argv if a.isdigit()), 4))
    cluster = NodeCluster(k, link_rate=os.environ.get("HPCCKPT_CLUSTER_LINK_RATE") or None).start()
    slurm = None
    try:
        first = cluster.names[0]
        hosts = [(n, 1) for n in cluster.names]
        print(f"{k} nodes up in {cluster.up_seconds:.2f} s under {cluster.dir}: {' '.join(cluster.names)}\n"
              f"  node-local (L1) on every node: {cluster.local}; shared (L4): {cluster.shared}\n"
              f"  enter a node:  {' '.join(cluster.enter(first))} bash\n"
              f"  an MPI job:    {' '.join(cluster.mpiexec_cmd(hosts, 'mpiexec', ['hostname']))}\n"
              f"  lose a node:   kill -9 every process whose /proc/PID/ns/uts is that of the pid in "
              f"{cluster.nodes_dir}/NODE.pid", flush=True)
        if "--slurm" in argv:
            import slurmcluster

            slurmcluster.ensure_installed()
            slurm = slurmcluster.ClusterSlurm(cluster, os.path.join(cluster.dir, "slurm")).start()
            print(f"  SLURM: export SLURM_CONF={slurm.conf}; run sbatch/srun/sinfo on the head node: "
                  f"{' '.join(cluster.enter(slurm.head))} sinfo", flush=True)
        print("Ctrl-C stops it.", flush=True)
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        if slurm is not None:
            slurm.stop()
        cluster.stop()
        print("stopped; left:", cluster.leftovers(), flush=True)
        shutil.rmtree(cluster.dir, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
