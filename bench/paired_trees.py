"""Run one benchmark of two source trees alternately and print paired new/old ratios of every figure.

    python bench/paired_trees.py OLD_TREE NEW_TREE --rounds 3 --ranks 4 -- bench/async.py --total-mib 128

Each round runs the benchmark script of each tree (its own ``bench/`` copy,
with PYTHONPATH set to that tree) under ``mpiexec -n RANKS`` with ``--json``,
old first then new, so that the two see the same machine state; then, for
every numeric figure both JSON outputs have, it prints the median over the
rounds of new / old (for times, below 1 is faster) and the spread.  The
MPICH busy-poll settings of bench/README.md are set.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile


def flatten(doc, prefix=""):
    """``{path: number}`` of every numeric leaf of a JSON document."""
    out = {}
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            label = v.get("name") or v.get("method") or v.get("case") or i if isinstance(v, dict) else i
            out.update(flatten(v, f"{prefix}{label}."))
    elif isinstance(doc, (int, float)) and not isinstance(doc, bool):
        out[prefix.rstrip(".")] = float(doc)
    return out


def run(tree: str, ranks: int, script: str, args: list[str], log: str | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="paired-") as tmp:
        out = os.path.join(tmp, "out.json")
        env = dict(os.environ, PYTHONPATH=tree, MPIR_CVAR_CH4_PROGRESS_THROTTLE="1", MPIR_CVAR_POLLS_BEFORE_YIELD="1")
        cmd = [sys.executable, os.path.join(tree, script), *args, "--json", out]
        if ranks > 0:  # the venv's mpiexec, whatever MPI is first on PATH
            cmd = [os.path.join(os.path.dirname(sys.executable), "mpiexec"), "-n", str(ranks), *cmd]
        if log is None:
            subprocess.run(cmd, check=True, env=env, cwd=tree, stdout=subprocess.DEVNULL)
        else:
            with open(log, "w") as f:
                f.write(f"# {' '.join(cmd)}\n# load average before: {open('/proc/loadavg').read()}")
                f.flush()
                subprocess.run(cmd, check=True, env=env, cwd=tree, stdout=f, stderr=subprocess.STDOUT)
            shutil.copy(out, log[:-len(".txt")] + ".json")
        with open(out) as f:
            return flatten(json.load(f))


def main() -> int:
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    ap = argparse.ArgumentParser(usage=__doc__)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ranks", type=int, default=4, help="0: without mpiexec")
    ap.add_argument("--logs", default=None, help="keep each run's output in this directory")
    a = ap.parse_args(argv[:cut])
    script, *args = argv[cut + 1:]
    ratios: dict[str, list[float]] = {}
    if a.logs:
        os.makedirs(a.logs, exist_ok=True)
    for i in range(a.rounds):
        logs = [os.path.join(a.logs, f"{i}-{which}.txt") if a.logs else None for which in ("old", "new")]
        old = run(os.path.abspath(a.old), a.ranks, script, args, logs[0])
        new = run(os.path.abspath(a.new), a.ranks, script, args, logs[1])
        for key in sorted(set(old) & set(new)):
            if old[key] > 0 and new[key] >= 0:
                ratios.setdefault(key, []).append(new[key] / old[key])
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    print(f"# {script} {' '.join(args)}: new/old, median of {a.rounds} paired rounds, {a.ranks} ranks, {cpu}")
    for key, r in ratios.items():
        print(f"{key}\t{statistics.median(r):.3f}\t(min {min(r):.3f}, max {max(r):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
