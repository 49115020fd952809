"""Command-line front ends: ``hpcckpt interval`` and ``hpcckpt simulate``.

Why: users want the Young/Daly interval for their cost and MTBF without
writing code, and to see what a wrong interval costs.  The core ``hpcckpt``
CLI calls :func:`add_subcommands` on its subparsers; each subcommand sets
``func`` (and ``policy_command``) so either ``args.func(args)`` or
:func:`run` dispatches.  Standalone for testing::

    python -m hpcckpt.policy.cli interval --cost 40s --mtbf 12h
    python -m hpcckpt.policy.cli simulate --work 7d --cost 10m --mtbf 12h --plot waste.png

Durations are plain seconds or a number with an s/m/h/d suffix, or a sum of
such terms (``1h30m``).  A bad value prints one error line and exits with 2.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from typing import List, Optional

from hpcckpt.errors import CheckpointError

__all__ = ["parse_duration", "format_hms", "add_subcommands", "run", "run_interval", "run_simulate", "main"]

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_TERM = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?\s*([smhd]?)", re.ASCII)
_FULL = re.compile(r"^\s*(?:(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?\s*[smhd]?\s*)+$", re.ASCII)


def parse_duration(text) -> float:
    """``"40"`` -> 40.0, ``"40s"``, ``"5m"``, ``"12h"``, ``"1.5d"``, ``"1h30m"``; seconds.

    Raises CheckpointError with a one-line message for anything else
    (negative, empty, NaN, unknown suffix).
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        v = float(text)
        if math.isfinite(v) and v >= 0:
            return v
        raise CheckpointError(f"bad duration {text!r}: must be finite and >= 0")
    s = str(text).strip().lower()
    if not s or not _FULL.match(s):
        raise CheckpointError(
            f"bad duration {text!r}: use seconds or a number with s/m/h/d, e.g. 40, 40s, 5m, 12h, 2d, 1h30m")
    total = 0.0
    terms = list(_TERM.finditer(s))
    if len(terms) > 1 and any(m.group(2) == "" for m in terms):
        raise CheckpointError(f"bad duration {text!r}: every term of a compound duration needs a unit (1h30m)")
    for m in terms:
        num = float(m.group(0)[: len(m.group(0)) - len(m.group(2))].strip())
        total += num * _UNITS.get(m.group(2) or "s")
    if not math.isfinite(total):
        raise CheckpointError(f"bad duration {text!r}: too large")
    return total


def format_hms(seconds: float) -> str:
    """``1893.3`` -> ``"31m 33s"``; ``90061`` -> ``"1d 1h 1m 1s"``."""
    if not math.isfinite(seconds):
        return str(seconds)
    s = int(round(seconds))
    if s < 60:
        return f"{seconds:.3g}s" if seconds < 10 else f"{s}s"
    parts = []
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        q, s = divmod(s, n)
        if q:
            parts.append(f"{q}{unit}")
    return " ".join(parts)


def add_subcommands(subparsers) -> None:
    """Add ``interval`` and ``simulate`` to an ``argparse`` subparsers object."""
    p = subparsers.add_parser("interval", help="Young and Daly checkpoint intervals for a cost and MTBF",
                              description="Print the Young and Daly checkpoint intervals and the expected "
                                          "waste of each (exponential failure model).")
    p.add_argument("--cost", required=True, help="blocking cost of one checkpoint (e.g. 40s, 5m)")
    p.add_argument("--mtbf", required=True, help="mean time between failures (e.g. 12h, 2d)")
    p.add_argument("--restart", default="0", help="restart cost (default 0)")
    p.set_defaults(func=run_interval, policy_command="interval")

    q = subparsers.add_parser("simulate", help="simulate a failing job under several checkpoint intervals",
                              description="Discrete-event Monte Carlo simulation comparing fixed intervals, "
                                          "Young, Daly (oracle) and the learned policy.")
    q.add_argument("--work", default="7d", help="computation the job needs (default 7d)")
    q.add_argument("--cost", default="10m", help="checkpoint cost (default 10m)")
    q.add_argument("--restart", default="5m", help="restart cost (default 5m)")
    q.add_argument("--mtbf", default="12h", help="true mean time between failures (default 12h)")
    q.add_argument("--dist", choices=("exponential", "weibull"), default="exponential")
    q.add_argument("--shape", type=float, default=0.7, help="Weibull shape k (default 0.7; --dist weibull)")
    q.add_argument("--seeds", type=int, default=100, help="Monte Carlo histories (default 100)")
    q.add_argument("--seed", type=int, default=0, help="base random seed (default 0)")
    q.add_argument("--prior-factor", type=float, nargs="+", default=[10.0, 0.1],
                   help="learned policy prior MTBF as multiples of the true MTBF (default 10 0.1)")
    q.add_argument("--history-failures", type=int, default=0, metavar="N",
                   help="also run the learned policies with N earlier failures already in the history")
    q.add_argument("--sweep", action="store_true", help="also print every fixed interval of the sweep")
    q.add_argument("--plot", metavar="PATH", help="write a PNG of waste against interval")
    q.set_defaults(func=run_simulate, policy_command="simulate")


def _error(cmd: str, msg: str) -> int:
    print(f"hpcckpt {cmd}: error: {msg}", file=sys.stderr)
    return 2


def run_interval(args) -> int:
    from hpcckpt.policy import formulas

    try:
        c = parse_duration(args.cost)
        m = parse_duration(args.mtbf)
        r = parse_duration(args.restart)
        if m <= 0:
            raise CheckpointError("--mtbf must be > 0")
        rows = [("Young", formulas.young(c, m)), ("Daly", formulas.daly(c, m))]
        rows.append(("exact (model)", formulas.exact_optimum(c, m)))
        out = [f"checkpoint cost C = {format_hms(c)}, MTBF M = {format_hms(m)}, restart R = {format_hms(r)}"
               f"  (C/M = {c / m:.3g})",
               f"{'policy':<14} {'interval':<22} {'expected waste':>14}"]
        for name, tau in rows:
            w = formulas.expected_waste(tau, c, m, r) if tau > 0 else (0.0 if c == 0 else 1.0)
            out.append(f"{name:<14} {format_hms(tau) + f' ({tau:.0f} s)':<22} {w * 100:>13.3f}%")
        out.append("waste: share of wall-clock time lost to checkpoints, rework and restarts, "
                   "exponential failures (Daly 2006 model)")
    except CheckpointError as exc:
        return _error("interval", str(exc))
    print("\n".join(out))
    return 0


def run_simulate(args) -> int:
    from hpcckpt.policy import simulate, simulate_report

    try:
        sc = simulate.Scenario(work=parse_duration(args.work), cost=parse_duration(args.cost),
                               restart=parse_duration(args.restart), mtbf=parse_duration(args.mtbf),
                               dist=args.dist, shape=float(args.shape) if args.dist == "weibull" else 1.0)
        if args.seeds < 1:
            raise CheckpointError("--seeds must be >= 1")
        if any(not (f > 0 and math.isfinite(f)) for f in args.prior_factor):
            raise CheckpointError("--prior-factor values must be > 0")
        if args.history_failures < 0:
            raise CheckpointError("--history-failures must be >= 0")
        res = simulate.run_simulation(sc, seeds=args.seeds, seed=args.seed, prior_factors=args.prior_factor,
                                      history_failures=args.history_failures)
    except CheckpointError as exc:
        return _error("simulate", str(exc))
    print(simulate_report.format_table(res, show_sweep=args.sweep))
    if args.plot:
        try:
            simulate_report.plot_waste(res, args.plot)
        except (OSError, ImportError) as exc:
            return _error("simulate", f"cannot write plot {args.plot}: {exc}")
        print(f"plot written to {args.plot}")
    return 0


def run(args) -> int:
    """Dispatch to the subcommand chosen by :func:`add_subcommands`."""
    cmd = getattr(args, "policy_command", None)
    if cmd == "interval":
        return run_interval(args)
    if cmd == "simulate":
        return run_simulate(args)
    raise CheckpointError(f"not a policy subcommand: {cmd!r}")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="hpcckpt", description="hpcckpt checkpoint-interval tools")
    sub = parser.add_subparsers(dest="command", required=True)
    add_subcommands(sub)
    args = parser.parse_args(argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
