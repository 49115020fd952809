"""A real Ceph object gateway on localhost, started and stopped by the tests themselves.

``CephGateway(directory).start()`` makes a single-node cluster by hand, as
Ceph's vstart.sh does: a monitor, a manager, one OSD on ``memstore`` (the
objects live in the OSD's memory: nothing on disk but the monitor's small
store and the logs), and radosgw (beast) on a free port of 127.0.0.1, with an
S3 user whose keys it returns.  cephx is on: each daemon has a key in one
keyring (radosgw 16 does not start with ``auth ... = none``: its monitor
client's auth request fails with EACCES).  ``stop()`` ends the daemons it
started, by the pids they wrote, and removes the directory.

Debian 12's ceph 16.2 packages are installed with apt-get when missing
(tests/support/aptget.py) by ``ensure_packages()``: the tests skip where that is
impossible (not root, no apt-get) and fail where apt-get fails.

Measured on the 2-core CI machine (docs/storage.md, "Testing"): apt-get install
of the 95 packages (64 MB) 148 s; the cluster to a working S3 endpoint 17 s
(monitor 1 s, OSD up 7 s, radosgw answering 16 s, the user 16.4 s); the first
bucket a few seconds more (radosgw creates its pools); stopping 5 s.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
import uuid

#: the Debian packages, and the programs the cluster is made with
PACKAGES = ("ceph-mon", "ceph-mgr", "ceph-osd", "radosgw", "ceph-common")
PROGRAMS = ("ceph-mon", "ceph-mgr", "ceph-osd", "radosgw", "radosgw-admin", "ceph-authtool", "monmaptool", "ceph")
#: every daemon's key has every capability (a throwaway cluster on 127.0.0.1)
NAMES = ("client.admin", "mgr.x", "osd.0", "client.rgw.a")
ACCESS_KEY, SECRET_KEY = "HPCCKPTTESTACCESS", "hpcckpt-test-secret"


def missing_programs() -> list[str]:
    return [p for p in PROGRAMS if shutil.which(p) is None]


def ensure_packages() -> None:
    """Install Debian's ceph packages when a program is missing (tests/support/aptget.py decides skip or failure)."""
    from aptget import apt_install

    apt_install(list(PACKAGES), missing_programs, "a Ceph object gateway", timeout=900)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CONF = """[global]
fsid = {fsid}
mon host = [v2:127.0.0.1:{mon_port}]
keyring = {d}/keyring
auth allow insecure global id reclaim = false
mon warn on insecure global id reclaim allowed = false
mon data avail warn = 1
mon data avail crit = 0
client mount timeout = 30
rados mon op timeout = 30
run dir = {d}/run
admin socket = {d}/run/$name.asok
log file = {d}/log/$name.log
pid file = {d}/run/$name.pid
mon data = {d}/mon.$id
osd data = {d}/osd.$id
mgr data = {d}/mgr.$id
osd objectstore = memstore
memstore device bytes = {osd_bytes}
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon allow pool size one = true
mon allow pool delete = true
mon max pg per osd = 1000
osd crush chooseleaf type = 0
mon warn on pool no redundancy = false
ms bind ipv6 = false
public network = 127.0.0.0/8
[client.rgw.a]
rgw frontends = beast endpoint=127.0.0.1:{rgw_port}
rgw data = {d}/rgw
"""


class CephGateway:
    """One single-node Ceph cluster with radosgw; ``endpoint``, ``access_key``, ``secret_key`` once started."""

    def __init__(self, directory: str | None = None, osd_bytes: int = 2 << 30):
        self.directory = directory or tempfile.mkdtemp(prefix="hpcckpt-ceph-")
        self.osd_bytes = osd_bytes
        self.timings: dict[str, float] = {}
        self.endpoint = None
        self.access_key, self.secret_key = ACCESS_KEY, SECRET_KEY

    def _run(self, *args, timeout: float = 60) -> str:
        proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed (exit {proc.returncode}): "
                               f"{(proc.stdout + proc.stderr).strip()[-800:]}\n{self.logs()}")
        return proc.stdout

    def logs(self, lines: int = 15) -> str:
        """The last lines of every daemon's log, for a failure message."""
        out = []
        logdir = os.path.join(self.directory, "log")
        for name in sorted(os.listdir(logdir)) if os.path.isdir(logdir) else ():
            with open(os.path.join(logdir, name), errors="replace") as f:
                out.append(f"--- {name}\n" + "".join(f.readlines()[-lines:]))
        return "\n".join(out)

    def start(self, timeout: float = 120) -> "CephGateway":
        d = self.directory
        t0 = time.monotonic()
        for sub in ("mon.a", "osd.0", "mgr.x", "run", "log", "rgw"):
            os.makedirs(os.path.join(d, sub), exist_ok=True)
        fsid, mon_port, rgw_port = uuid.uuid4(), _free_port(), _free_port()
        self.conf = os.path.join(d, "ceph.conf")
        with open(self.conf, "w") as f:
            f.write(CONF.format(fsid=fsid, mon_port=mon_port, rgw_port=rgw_port, d=d, osd_bytes=self.osd_bytes))
        c = ("-c", self.conf)
        keyring = os.path.join(d, "keyring")
        self._run("ceph-authtool", "--create-keyring", keyring, "--gen-key", "-n", "mon.", "--cap", "mon", "allow *")
        for name in NAMES:
            self._run("ceph-authtool", keyring, "--gen-key", "-n", name, *(x for svc in ("mon", "osd", "mgr", "mds")
                                                                         for x in ("--cap", svc, "allow *")))
        monmap = os.path.join(d, "monmap")
        self._run("monmaptool", "--create", "--clobber", "--addv", "a", f"[v2:127.0.0.1:{mon_port}]",
                  "--fsid", str(fsid), monmap)
        self._run("ceph-mon", *c, "--mkfs", "-i", "a", "--monmap", monmap, "--keyring", keyring)
        self._run("ceph-mon", *c, "-i", "a")  # daemonises once it listens
        self.timings["mon"] = time.monotonic() - t0
        self._run("ceph-mgr", *c, "-i", "x")
        osd_uuid = str(uuid.uuid4())
        osd_id = self._run("ceph", *c, "--connect-timeout", "30", "osd", "new", osd_uuid).strip()
        self._run("ceph-osd", *c, "-i", osd_id, "--mkfs", "--osd-uuid", osd_uuid)
        self._run("ceph-osd", *c, "-i", osd_id)
        deadline = t0 + timeout
        while "1 up" not in self._run("ceph", *c, "--connect-timeout", "30", "osd", "stat"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the OSD did not come up in {timeout:.0f} s\n{self.logs()}")
            time.sleep(0.3)
        self.timings["osd up"] = time.monotonic() - t0
        self._run("radosgw", *c, "-n", "client.rgw.a", timeout=90)
        self.endpoint = f"http://127.0.0.1:{rgw_port}"
        while True:
            try:
                urllib.request.urlopen(self.endpoint + "/", timeout=5).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"radosgw did not answer in {timeout:.0f} s\n{self.logs()}") from None
                time.sleep(0.3)
        self.timings["radosgw"] = time.monotonic() - t0
        self._run("radosgw-admin", *c, "user", "create", "--uid=hpcckpt", "--display-name=hpcckpt",
                  f"--access-key={self.access_key}", f"--secret={self.secret_key}")
        self.timings["user"] = time.monotonic() - t0
        return self

    def environment(self) -> dict[str, str]:
        """boto3's environment variables that point a client at this gateway."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_DEFAULT_REGION": "us-east-1"}

    def stop(self, timeout: float = 20) -> None:
        """End the daemons this gateway started (by the pids they wrote), then remove its directory."""
        run = os.path.join(self.directory, "run")
        pids = []
        for name in os.listdir(run) if os.path.isdir(run) else ():
            if name.endswith(".pid"):
                try:
                    with open(os.path.join(run, name)) as f:
                        pids.append(int(f.read().strip()))
                except (OSError, ValueError):
                    pass
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        for pid in pids:
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.directory, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


if __name__ == "__main__":  # python tests/support/ceph_gateway.py: start one, time it, try boto3, stop it
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    t = time.monotonic()
    ensure_packages()
    print(f"packages present ({time.monotonic() - t:.1f} s)")
    gw = CephGateway().start()
    print("started:", {k: round(v, 1) for k, v in gw.timings.items()}, gw.endpoint)
    try:
        import boto3

        t = time.monotonic()
        s3 = boto3.client("s3", endpoint_url=gw.endpoint, aws_access_key_id=gw.access_key,
                          aws_secret_access_key=gw.secret_key, region_name="us-east-1")
        s3.create_bucket(Bucket="smoke")
        s3.put_object(Bucket="smoke", Key="k", Body=b"hello")
        assert s3.get_object(Bucket="smoke", Key="k")["Body"].read() == b"hello"
        print(f"bucket, put, get: {time.monotonic() - t:.1f} s")
    finally:
        t = time.monotonic()
        gw.stop()
        print(f"stopped: {time.monotonic() - t:.1f} s")
