"""A private single-node SLURM cluster on localhost, for tests (no systemd, nothing in /etc touched).

``LocalSlurm(workdir).start()`` writes a munge key and a slurm.conf under
``workdir`` (private ports and socket paths), starts ``munged``,
``slurmctld`` and ``slurmd -N localhost`` by hand and waits until ``sinfo``
shows the node idle.  ``stop()`` ends exactly the daemons it started, by PID
(SIGTERM, then SIGKILL after a grace period), and is safe to call twice.
``env()`` is the environment for the SLURM client commands (``SLURM_CONF``).

``ensure_installed()`` installs Debian's ``slurm-wlm`` and ``munge`` with
apt-get when the daemons are missing: the test skips where that is impossible
(not root, no apt-get) and fails where apt-get fails (tests/support/aptget.py).

Run by hand: ``python tests/slurm/localslurm.py [workdir]`` brings a cluster up,
prints the ``export SLURM_CONF=...`` line, and tears it down on Ctrl-C.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))  # aptget.py
from aptget import apt_install  # noqa: E402

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "sinfo", "squeue", "scontrol", "scancel")
APT_PACKAGES = ("slurm-wlm", "munge")
#: Slots declared for the node: more than the 2 cores of the CI machines, so a 4-task job fits.
MIN_CPUS = 8


def missing_programs() -> list[str]:
    return [p for p in DAEMONS + CLIENTS + ("munge",) if shutil.which(p) is None]


def ensure_installed(timeout: float = 900) -> None:
    """Install slurm-wlm and munge when missing (skips or fails the test where they cannot be had)."""
    apt_install(APT_PACKAGES, missing_programs, "a SLURM cluster for the tests", timeout)


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 just now (the kernel picks them)."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


class LocalSlurm:
    def __init__(self, workdir: str | None = None, cpus: int | None = None):
        self.dir = workdir or tempfile.mkdtemp(prefix="hpcckpt-slurm-")
        os.makedirs(self.dir, exist_ok=True)
        os.chmod(self.dir, 0o755)  # munged wants its socket's directories traversable
        self.cpus = cpus or max(MIN_CPUS, os.cpu_count() or 1)
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.socket = os.path.join(self.dir, "munge.socket")
        self.procs: dict[str, int] = {}  # daemon name -> pid, only those this object started
        self.hostname = socket.gethostname().split(".")[0]

    def path(self, *parts: str) -> str:
        return os.path.join(self.dir, *parts)

    # -- configuration -------------------------------------------------------------------------
    def write_config(self) -> None:
        for d in ("state", "spool", "log"):
            os.makedirs(self.path(d), exist_ok=True)
        key = self.path("munge.key")
        if not os.path.exists(key):
            with open(key, "wb") as f:
                f.write(os.urandom(1024))
            os.chmod(key, 0o400)
        lines = [f"{k}={v}" for k, v in self.settings(*free_ports(2)).items()] + self.node_lines()
        with open(self.conf, "w") as f:
            f.write(f"# written by {type(self).__name__} (tests/)\n" + "\n".join(lines) + "\n")
        # cgroup.conf is read by some plugins even when unused; an empty one silences the lookup.
        open(self.path("cgroup.conf"), "a").close()

    def settings(self, ctld_port: int, slurmd_port: int) -> dict:
        """slurm.conf's settings but the node and partition lines."""
        return {
            "ClusterName": "hpcckpt",
            # Job ids unlike those of other private clusters on this machine (a precaution: with
            # srun --mpi=pmi2 the PMI job name is "<jobid>.<step>"; once, a job 3 failed in MPI_Init
            # ("Out of memory" in the shared-memory bootstrap) after an earlier cluster's job 3 had
            # been SIGKILLed and left its segments in /dev/shm -- a suspected, unproven collision).
            "FirstJobId": 1000 + int.from_bytes(os.urandom(3), "little") % 1_000_000,
            # slurmctld insists on running on the host named here; the address keeps it on loopback.
            "SlurmctldHost": f"{self.hostname}(127.0.0.1)",
            "SlurmctldPort": ctld_port,
            "SlurmdPort": slurmd_port,
            "SlurmUser": "root",
            "SlurmdUser": "root",
            "AuthType": "auth/munge",
            "CredType": "cred/munge",
            "AuthInfo": f"socket={self.socket}",
            "StateSaveLocation": self.path("state"),
            "SlurmdSpoolDir": self.path("spool"),
            "SlurmctldPidFile": self.path("slurmctld.pid"),
            "SlurmdPidFile": self.path("slurmd.pid"),
            "SlurmctldLogFile": self.path("log", "slurmctld.log"),
            "SlurmdLogFile": self.path("log", "slurmd.log"),
            "SlurmctldDebug": "info",
            "SlurmdDebug": "info",
            "ProctrackType": "proctrack/linuxproc",
            "TaskPlugin": "task/none",
            "SelectType": "select/cons_tres",
            "SelectTypeParameters": "CR_CPU",
            # The node claims more CPUs than the machine has, so that 4 ranks fit on 2 cores.
            "SlurmdParameters": "config_overrides",
            "SchedulerType": "sched/builtin",
            "AccountingStorageType": "accounting_storage/none",
            "JobAcctGatherType": "jobacct_gather/none",
            "JobCompType": "jobcomp/none",
            "MpiDefault": "none",
            "ReturnToService": 2,
            "JobRequeue": 1,
            "MinJobAge": 3600,  # keep finished jobs in slurmctld so that they can be requeued
            "KillWait": 5,
            "InactiveLimit": 0,
            "SlurmdTimeout": 300,
            "MessageTimeout": 30,
            "PropagateResourceLimitsExcept": "MEMLOCK",
        }

    def node_lines(self) -> list[str]:
        """slurm.conf's NodeName and PartitionName lines: the one node ``localhost``."""
        return [f"NodeName=localhost NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN",
                "PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"]

    def slurmds(self) -> list[tuple[str, list[str], str]]:
        """(name, command, pid file) of each slurmd to start."""
        return [("slurmd", ["slurmd", "-f", self.conf, "-N", "localhost"], self.path("slurmd.pid"))]

    def where(self, name: str) -> list[str]:
        """The command prefix that runs daemon ``name`` (or ``"client"``, the client commands): none here."""
        return []

    def env(self) -> dict:
        """os.environ without the variables of any enclosing SLURM job, pointed at this cluster."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SLURM_", "SLURMD_", "SBATCH_", "SRUN_", "SALLOC_", "SQUEUE_", "PMI_"))}
        env["SLURM_CONF"] = self.conf
        return env

    # -- daemons ------------------------------------------------------------------------------
    def _daemon(self, name: str, cmd: list[str], pidfile: str, timeout: float = 30) -> None:
        """Run a self-daemonising command and record the daemon's PID from its pid file."""
        out = self.path("log", f"{name}.out")
        with open(out, "ab") as f:
            proc = subprocess.run(self.where(name) + cmd, stdout=f, stderr=subprocess.STDOUT, env=self.env(),
                                  timeout=timeout, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}; {self.tail(out)}")
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                with open(pidfile) as f:
                    pid = int(f.read().split()[0])
                os.kill(pid, 0)
                self.procs[name] = pid
                return
            except (OSError, ValueError, IndexError):
                time.sleep(0.2)
        raise RuntimeError(f"{name} wrote no pid file {pidfile} in {timeout} s; {self.tail(out)}")

    def start(self, timeout: float = 90) -> "LocalSlurm":
        self.write_config()
        try:
            self._daemon("munged", ["munged", "--force", f"--socket={self.socket}",
                                    f"--key-file={self.path('munge.key')}",
                                    f"--pid-file={self.path('munged.pid')}",
                                    f"--log-file={self.path('log', 'munged.log')}",
                                    f"--seed-file={self.path('munged.seed')}"], self.path("munged.pid"))
            self._daemon("slurmctld", ["slurmctld", "-f", self.conf], self.path("slurmctld.pid"))
            for name, cmd, pidfile in self.slurmds():
                self._daemon(name, cmd, pidfile)
            self.wait_idle(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def run(self, *cmd: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        proc = subprocess.run(self.where("client") + list(cmd), capture_output=True, text=True, env=self.env(),
                              timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stdout}{proc.stderr}")
        return proc

    def wait_idle(self, timeout: float = 90) -> None:
        deadline = time.time() + timeout
        state = ""
        while time.time() < deadline:
            for name, pid in self.procs.items():
                if not _alive(pid):
                    raise RuntimeError(f"{name} (pid {pid}) died during start-up; {self.logs()}")
            proc = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False, timeout=20)
            state = (proc.stdout + proc.stderr).strip()
            states = [line.split()[-1] for line in state.splitlines() if line.split()]
            if proc.returncode == 0 and len(states) == len(self.slurmds()) and set(states) == {"idle"}:
                return
            time.sleep(0.5)
        raise RuntimeError(f"nodes not idle after {timeout} s (sinfo: {state!r}); {self.logs()}")

    def cancel_all(self, timeout: float = 60) -> None:
        """Cancel every job of this cluster and wait until none is left running or completing."""
        if "slurmctld" not in self.alive():
            return
        self.run("scancel", "--full", "-u", str(os.getuid()), check=False, timeout=30)
        deadline = time.time() + timeout
        while time.time() < deadline:
            out = self.run("squeue", "-h", "-o", "%i %T", check=False, timeout=20).stdout.strip()
            if not out:
                return
            time.sleep(0.5)

    def stepds(self) -> list[int]:
        """PIDs of slurmstepd processes of this cluster (they hold our slurmd log open)."""
        found = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if not f.read().startswith(b"slurmstepd"):
                        continue
                fds = os.listdir(f"/proc/{pid}/fd")
                if any(os.readlink(f"/proc/{pid}/fd/{fd}").startswith(self.dir + os.sep) for fd in fds):
                    found.append(int(pid))
            except OSError:
                continue
        return found

    def stop(self, grace: float = 10) -> None:
        """Cancel the jobs, then SIGTERM the daemons this object started, SIGKILL after ``grace``.

        slurmstepd processes of this cluster that outlive slurmd are killed as well
        (found by their open files under our directory, never by name alone).
        """
        try:
            self.cancel_all()
        except (OSError, subprocess.SubprocessError):
            pass
        for name in reversed(list(self.procs)):  # the slurmds, slurmctld, munged
            pid = self.procs.get(name)
            if pid is None:
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                self.procs.pop(name)
                continue
            deadline = time.time() + grace
            while time.time() < deadline and _alive(pid):
                time.sleep(0.1)
            if _alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.procs.pop(name)
        for pid in self.stepds():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def alive(self) -> dict[str, int]:
        return {n: p for n, p in self.procs.items() if _alive(p)}

    # -- diagnostics --------------------------------------------------------------------------
    @staticmethod
    def tail(path: str, n: int = 3000) -> str:
        try:
            with open(path, errors="replace") as f:
                return f"{path}:\n{f.read()[-n:]}"
        except OSError:
            return f"{path}: (absent)"

    def logs(self) -> str:
        logs = ["munged.log", "slurmctld.log"] + [f"{name}.log" for name, _, _ in self.slurmds()]
        return "\n".join(self.tail(self.path("log", f)) for f in logs)


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (daemons are not our children, so no reaping here)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


if __name__ == "__main__":
    ensure_installed()
    def _stop_on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop_on_term)
    cluster = LocalSlurm(sys.argv[1] if len(sys.argv) > 1 else None)
    t0 = time.time()
    cluster.start()
    print(f"up in {time.time() - t0:.1f} s: export SLURM_CONF={cluster.conf}  (daemons {cluster.procs})", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
        print("stopped", cluster.alive())
