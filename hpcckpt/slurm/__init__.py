"""The SLURM environment of this process, read from environment variables (pure: no commands run).

Why: the interval policy wants the job's end time (to take a last checkpoint
before the wall-time limit) and its restart count (failure history); the
aggregation stage wants ranks per node; the scripts in ``slurm/`` want the node
list.  ``detect()`` reads them from a mapping (``os.environ`` by default) and
returns a frozen :class:`SlurmEnv`; outside SLURM every field is None (and
``in_slurm`` is False), so callers can use the fields without checking first.

Variables read (see ``man sbatch`` / ``man srun``, OUTPUT ENVIRONMENT VARIABLES):
``SLURM_JOB_ID`` (or the older ``SLURM_JOBID``), ``SLURM_ARRAY_JOB_ID``,
``SLURM_ARRAY_TASK_ID``, ``SLURM_STEP_ID``, ``SLURM_JOB_NAME``,
``SLURM_CLUSTER_NAME``, ``SLURM_JOB_PARTITION``, ``SLURM_SUBMIT_DIR``,
``SLURM_RESTART_COUNT`` (absent until the first requeue, so 0 inside a job),
``SLURM_JOB_START_TIME`` and ``SLURM_JOB_END_TIME`` (epoch seconds),
``SLURM_JOB_NODELIST`` (or ``SLURM_NODELIST``), ``SLURM_JOB_NUM_NODES`` (or
``SLURM_NNODES``), ``SLURM_TASKS_PER_NODE`` (``"2(x3),1"``), ``SLURM_NTASKS``
(or ``SLURM_NPROCS``), ``SLURM_CPUS_PER_TASK``, ``SLURM_JOB_CPUS_PER_NODE``,
the step's ``SLURM_STEP_NODELIST``, ``SLURM_STEP_NUM_NODES``,
``SLURM_STEP_NUM_TASKS`` and ``SLURM_STEP_TASKS_PER_NODE``, and the task's own
``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NODEID`` and ``SLURMD_NODENAME``.

A value that does not parse becomes None with a RuntimeWarning naming the
variable: a malformed environment must not stop an application from running.

``python -m hpcckpt.slurm`` prints one line with the main fields (the sbatch
template in ``slurm/`` logs it at every start), ``python -m hpcckpt.slurm
--json`` all of them.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Mapping, Optional

from hpcckpt.core.warn import warn

__all__ = ["SlurmEnv", "detect", "expand_hostlist", "parse_tasks_per_node", "HostlistError"]


class HostlistError(ValueError):
    """A SLURM host list or tasks-per-node string that does not parse."""


@dataclass(frozen=True)
class SlurmEnv:
    """What SLURM told this process.  Every field is None outside SLURM."""

    job_id: Optional[int] = None
    array_job_id: Optional[int] = None
    array_task_id: Optional[int] = None
    step_id: Optional[str] = None          # "0", "1", ... or "batch" / "extern" style names
    job_name: Optional[str] = None
    cluster: Optional[str] = None
    partition: Optional[str] = None
    submit_dir: Optional[str] = None
    restart_count: Optional[int] = None    # 0 in a job that was never requeued
    start_time: Optional[int] = None       # epoch seconds
    end_time: Optional[int] = None         # epoch seconds: the wall-time limit
    nodelist: Optional[tuple] = None       # the job's nodes, expanded, in SLURM's order
    num_nodes: Optional[int] = None
    tasks_per_node: Optional[tuple] = None  # one count per node of the job, expanded from "2(x3),1"
    ntasks: Optional[int] = None
    cpus_per_task: Optional[int] = None
    cpus_per_node: Optional[tuple] = None
    step_nodelist: Optional[tuple] = None
    step_num_nodes: Optional[int] = None
    step_ntasks: Optional[int] = None
    step_tasks_per_node: Optional[tuple] = None
    procid: Optional[int] = None           # global task rank of this process in its step
    localid: Optional[int] = None          # task rank on this node
    nodeid: Optional[int] = None           # index of this node in the step
    nodename: Optional[str] = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)  # the SLURM_* variables read

    @property
    def in_slurm(self) -> bool:
        """True inside a SLURM job (allocation, batch script or job step)."""
        return self.job_id is not None

    @property
    def in_step(self) -> bool:
        """True inside a job step launched by srun (SLURM_PROCID is set)."""
        return self.procid is not None

    @property
    def restarted(self) -> Optional[bool]:
        return None if self.restart_count is None else self.restart_count > 0

    def time_left(self, now: Optional[float] = None) -> Optional[float]:
        """Seconds until the wall-time limit (negative once past it), or None when unknown."""
        if self.end_time is None:
            return None
        return self.end_time - (time.time() if now is None else now)

    def ranks_per_node(self) -> Optional[tuple]:
        """Tasks per node of the current step when inside one, else of the job (None outside SLURM)."""
        return self.step_tasks_per_node if self.step_tasks_per_node is not None else self.tasks_per_node

    def node_of_task(self, task: int) -> Optional[str]:
        """The node running ``task`` under SLURM's default block distribution, or None when unknown.

        Only valid for ``--distribution=block`` (the default); cyclic and
        arbitrary layouts place tasks differently.
        """
        nodes = self.step_nodelist or self.nodelist
        counts = self.ranks_per_node()
        if nodes is None or counts is None or len(nodes) != len(counts) or task < 0:
            return None
        for node, n in zip(nodes, counts):
            if task < n:
                return node
            task -= n
        return None

    def summary(self) -> str:
        """One line for logs: ``job=12 restart=1 nodes=1(localhost) tasks=4 per_node=4 end_in=3597s``."""
        if not self.in_slurm:
            return "not in a SLURM job"
        left = self.time_left()
        nodes = ",".join(self.nodelist) if self.nodelist else "?"
        if len(nodes) > 80:
            nodes = nodes[:77] + "..."
        per = self.ranks_per_node()
        parts = [f"job={self.job_id}", f"restart={self.restart_count}",
                 f"nodes={self.num_nodes}({nodes})", f"tasks={self.ntasks}",
                 f"per_node={','.join(map(str, per)) if per else None}",
                 f"end_in={'unlimited' if left is None else f'{left:.0f}s'}"]
        if self.procid is not None:
            parts.append(f"procid={self.procid}")
        return " ".join(parts)

    def as_dict(self) -> dict:
        out = asdict(self)
        out.pop("raw")
        out.update(in_slurm=self.in_slurm, in_step=self.in_step)
        return out


# -- parsing helpers (pure) -------------------------------------------------------------------
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _expand_brackets(body: str) -> list[str]:
    """``"01-03,7"`` -> ``["01", "02", "03", "7"]``, keeping the zero padding of each range's start."""
    out = []
    for part in body.split(","):
        m = _RANGE.match(part.strip())
        if not m:
            raise HostlistError(f"bad range {part!r} in [{body}]")
        lo, hi = m.group(1), m.group(2)
        if hi is None:
            out.append(lo)
            continue
        a, b = int(lo), int(hi)
        if b < a:
            raise HostlistError(f"descending range {part!r} in [{body}]")
        if b - a > 1_000_000:
            raise HostlistError(f"range {part!r} too large")
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        out.extend(f"{i:0{width}d}" for i in range(a, b + 1))
    return out


def _split_top(s: str) -> list[str]:
    """Split at commas that are not inside brackets."""
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"nested brackets in {s!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in {s!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise HostlistError(f"unbalanced '[' in {s!r}")
    parts.append("".join(cur))
    return parts


def expand_hostlist(hostlist: str) -> list[str]:
    """Expand a SLURM host list like ``scontrol show hostnames`` does.

    ``"node[01-03,07],gpu1"`` -> ``["node01", "node02", "node03", "node07", "gpu1"]``;
    several bracket groups in one name give their product in order
    (``"r[1-2]n[1-2]"`` -> ``r1n1 r1n2 r2n1 r2n2``).  Duplicates are kept.
    """
    if not isinstance(hostlist, str):
        raise HostlistError(f"host list must be a string, got {type(hostlist).__name__}")
    hosts: list[str] = []
    for item in _split_top(hostlist.strip()):
        item = item.strip()
        if not item:
            if hostlist.strip():
                raise HostlistError(f"empty name in {hostlist!r}")
            continue
        names = [""]
        pos = 0
        for m in re.finditer(r"\[([^\]]*)\]", item):
            prefix = item[pos:m.start()]
            if "[" in prefix or "]" in prefix:
                raise HostlistError(f"bad brackets in {item!r}")
            names = [n + prefix + v for n in names for v in _expand_brackets(m.group(1))]
            pos = m.end()
        rest = item[pos:]
        if "[" in rest or "]" in rest:
            raise HostlistError(f"bad brackets in {item!r}")
        hosts.extend(n + rest for n in names)
        if len(hosts) > 10_000_000:
            raise HostlistError("host list too large")
    return hosts


_TPN = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def parse_tasks_per_node(spec: str) -> list[int]:
    """``"2(x3),1"`` -> ``[2, 2, 2, 1]`` (the format of SLURM_TASKS_PER_NODE and SLURM_JOB_CPUS_PER_NODE)."""
    if not isinstance(spec, str) or not spec.strip():
        raise HostlistError(f"empty tasks-per-node spec {spec!r}")
    out: list[int] = []
    for part in spec.split(","):
        m = _TPN.match(part.strip())
        if not m:
            raise HostlistError(f"bad tasks-per-node item {part!r} in {spec!r}")
        count, repeat = int(m.group(1)), int(m.group(2) or 1)
        if repeat < 1 or repeat > 10_000_000 or len(out) + repeat > 10_000_000:
            raise HostlistError(f"bad repeat count in {part!r}")
        out.extend([count] * repeat)
    return out


# -- detection --------------------------------------------------------------------------------
def _first(env: Mapping[str, str], *names: str) -> tuple[Optional[str], Optional[str]]:
    for n in names:
        v = env.get(n)
        if v is not None and str(v).strip() != "":
            return n, str(v).strip()
    return None, None


def _get(env, parse, *names):
    name, value = _first(env, *names)
    if value is None:
        return None
    try:
        return parse(value)
    except (ValueError, HostlistError) as exc:
        warn(f"hpcckpt: ignoring unparsable {name}={value!r} ({exc})", RuntimeWarning)
        return None


def _nonneg_int(v: str) -> int:
    i = int(v, 10)
    if i < 0:
        raise ValueError("negative")
    return i


def _epoch(v: str) -> Optional[int]:
    i = int(float(v))
    if i <= 0:  # SLURM reports 0 (or nothing) for an unlimited job
        return None
    return i


def _hosts(v: str) -> tuple:
    return tuple(expand_hostlist(v))


def _counts(v: str) -> tuple:
    return tuple(parse_tasks_per_node(v))


def detect(env: Optional[Mapping[str, str]] = None) -> SlurmEnv:
    """Read the SLURM environment from ``env`` (default: ``os.environ``); all None outside SLURM."""
    env = os.environ if env is None else env
    job_id = _get(env, _nonneg_int, "SLURM_JOB_ID", "SLURM_JOBID")
    raw = {k: str(v) for k, v in env.items() if k.startswith("SLURM")}
    if job_id is None:
        return SlurmEnv(raw=raw)
    restart = _get(env, _nonneg_int, "SLURM_RESTART_COUNT")
    return SlurmEnv(
        job_id=job_id,
        array_job_id=_get(env, _nonneg_int, "SLURM_ARRAY_JOB_ID"),
        array_task_id=_get(env, _nonneg_int, "SLURM_ARRAY_TASK_ID"),
        step_id=_get(env, str, "SLURM_STEP_ID", "SLURM_STEPID"),
        job_name=_get(env, str, "SLURM_JOB_NAME"),
        cluster=_get(env, str, "SLURM_CLUSTER_NAME"),
        partition=_get(env, str, "SLURM_JOB_PARTITION"),
        submit_dir=_get(env, str, "SLURM_SUBMIT_DIR"),
        restart_count=0 if restart is None and "SLURM_RESTART_COUNT" not in env else restart,
        start_time=_get(env, _epoch, "SLURM_JOB_START_TIME"),
        end_time=_get(env, _epoch, "SLURM_JOB_END_TIME"),
        nodelist=_get(env, _hosts, "SLURM_JOB_NODELIST", "SLURM_NODELIST"),
        num_nodes=_get(env, _nonneg_int, "SLURM_JOB_NUM_NODES", "SLURM_NNODES"),
        tasks_per_node=_get(env, _counts, "SLURM_TASKS_PER_NODE"),
        ntasks=_get(env, _nonneg_int, "SLURM_NTASKS", "SLURM_NPROCS"),
        cpus_per_task=_get(env, _nonneg_int, "SLURM_CPUS_PER_TASK"),
        cpus_per_node=_get(env, _counts, "SLURM_JOB_CPUS_PER_NODE"),
        step_nodelist=_get(env, _hosts, "SLURM_STEP_NODELIST"),
        step_num_nodes=_get(env, _nonneg_int, "SLURM_STEP_NUM_NODES"),
        step_ntasks=_get(env, _nonneg_int, "SLURM_STEP_NUM_TASKS"),
        step_tasks_per_node=_get(env, _counts, "SLURM_STEP_TASKS_PER_NODE"),
        procid=_get(env, _nonneg_int, "SLURM_PROCID"),
        localid=_get(env, _nonneg_int, "SLURM_LOCALID"),
        nodeid=_get(env, _nonneg_int, "SLURM_NODEID"),
        nodename=_get(env, str, "SLURMD_NODENAME"),
        raw=raw,
    )


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    info = detect()
    if argv == ["--json"]:
        print(json.dumps(info.as_dict(), indent=1, sort_keys=True))
    elif argv:
        print("usage: python -m hpcckpt.slurm [--json]", file=sys.stderr)
        return 2
    else:
        print("hpcckpt.slurm: " + info.summary(), flush=True)
    return 0

