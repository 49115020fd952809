"""``hpcckpt interval`` and ``hpcckpt simulate``: checkpoint intervals and the failure simulator (hpcckpt.policy).

Why: users want the Young/Daly interval for their cost and MTBF without
writing code, and to see what a wrong interval costs.  Durations are plain
seconds or a number with an s/m/h/d suffix, or a sum of such terms
(``1h30m``); a bad value prints one error line
(``hpcckpt interval: error: ...``) and exits with 2.  The tables are in the
one output style of common.py; ``simulate --markdown`` prints the Markdown
table of hpcckpt.policy.simulate_report instead (as docs/interval.md shows
it).  ``simulate`` shows a progress bar on stderr when stderr is a terminal
(or with ``--progress``), one tick per simulated platform history.
"""

from __future__ import annotations

import math
import sys

import numpy as np

from hpcckpt.errors import CheckpointError
from hpcckpt.cli.common import (EXIT_USAGE, add_progress_flags, duration_text, parse_duration, print_table, progress_bar,
                     show_progress)

__all__ = ["add_subcommands", "run_interval", "run_simulate"]


def add_subcommands(subparsers) -> None:
    """Add ``interval`` and ``simulate`` to an ``argparse`` subparsers object."""
    p = subparsers.add_parser("interval", help="Young and Daly checkpoint intervals for a cost and MTBF",
                              description="Print the Young and Daly checkpoint intervals and the expected "
                                          "waste of each (exponential failure model); with --level-costs, the "
                                          "per-level periods of a multi-level pattern and its expected makespan.")
    p.add_argument("--cost", help="blocking cost of one checkpoint (e.g. 40s, 5m)")
    p.add_argument("--mtbf", help="mean time between failures (e.g. 12h, 2d)")
    p.add_argument("--restart", default="0", help="restart cost (default 0)")
    m = p.add_argument_group("multi-level (levels cheapest first)")
    m.add_argument("--level-costs", nargs="+", metavar="C", help="checkpoint cost of each level (e.g. 10s 5m)")
    m.add_argument("--level-mtbf", nargs="+", metavar="M",
                   help="mean time between the failures that need each level (or a higher one) to recover")
    m.add_argument("--level-restarts", nargs="+", metavar="R", help="restart cost of each level (default: its cost)")
    m.add_argument("--work", default="7d", help="computation the job needs (default 7d)")
    m.add_argument("--method", nargs="+", choices=("formula", "learned", "search"), default=["formula", "learned"],
                   help="first-order formula (Benoit et al.), the learned model, the exhaustive search "
                        "(default: formula learned)")
    p.set_defaults(func=run_interval)

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
    q.add_argument("--markdown", action="store_true", help="print the results as a Markdown table (as in the docs)")
    q.add_argument("--plot", metavar="PATH", help="write a PNG of waste against interval")
    add_progress_flags(q, "only on a terminal")
    q.set_defaults(func=run_simulate)


def _error(cmd: str, msg: str) -> int:
    print(f"hpcckpt {cmd}: error: {msg}", file=sys.stderr)
    return EXIT_USAGE


def run_interval(args) -> int:
    from hpcckpt.policy import formulas

    if args.level_costs is not None or args.level_mtbf is not None:
        return _run_levels(args)
    try:
        if args.cost is None or args.mtbf is None:
            raise CheckpointError("give --cost and --mtbf (or --level-costs and --level-mtbf)")
        c = parse_duration(args.cost)
        m = parse_duration(args.mtbf)
        r = parse_duration(args.restart)
        if m <= 0:
            raise CheckpointError("--mtbf must be > 0")
        rows = [("Young", formulas.young(c, m)), ("Daly", formulas.daly(c, m)),
                ("exact (model)", formulas.exact_optimum(c, m))]
        table = [("POLICY", "INTERVAL", "SECONDS", "EXPECTED WASTE")]
        for name, tau in rows:
            w = formulas.expected_waste(tau, c, m, r) if tau > 0 else (0.0 if c == 0 else 1.0)
            table.append((name, duration_text(tau), f"{tau:.0f}", f"{w * 100:.3f}%"))
    except CheckpointError as exc:
        return _error("interval", str(exc))
    print(f"checkpoint cost C = {duration_text(c)}, MTBF M = {duration_text(m)}, restart R = {duration_text(r)}"
          f"  (C/M = {c / m:.3g})")
    print_table(table, right={1, 2, 3})
    print("waste: share of wall-clock time lost to checkpoints, rework and restarts, "
          "exponential failures (Daly 2006 model)")
    return 0


def _run_levels(args) -> int:
    """``hpcckpt interval --level-costs ... --level-mtbf ...``: the multi-level patterns of ``--method``."""
    from hpcckpt.policy import learned_levels, multilevel

    methods = {"formula": ("first-order (Benoit)", multilevel.formula_pattern),
               "learned": ("learned", learned_levels.predict), "search": ("search", multilevel.search)}
    try:
        if args.level_costs is None or args.level_mtbf is None:
            raise CheckpointError("--level-costs and --level-mtbf go together")
        costs = [parse_duration(c) for c in args.level_costs]
        mtbfs = [parse_duration(m) for m in args.level_mtbf]
        restarts = costs if args.level_restarts is None else [parse_duration(r) for r in args.level_restarts]
        if any(m <= 0 for m in mtbfs):
            raise CheckpointError("--level-mtbf values must be > 0")
        config = multilevel.LevelConfig(tuple(costs), tuple(restarts), tuple(1.0 / m for m in mtbfs),
                                        parse_duration(args.work))
        found = [(methods[k][0], methods[k][1](config)) for k in dict.fromkeys(args.method)]
    except CheckpointError as exc:
        return _error("interval", str(exc))
    print(f"levels: C = {', '.join(map(duration_text, costs))}; R = {', '.join(map(duration_text, restarts))}; "
          f"MTBF per level = {', '.join(map(duration_text, mtbfs))}; work {duration_text(config.work)}")
    table = [("METHOD", "PERIODS", "CHECKPOINTS PER TOP LEVEL", "EXPECTED MAKESPAN", "WASTE")]
    for name, pattern in found:
        table.append((name, ", ".join(duration_text(x) for x in pattern.periods),
                      ", ".join(str(n) for n in pattern.counts), duration_text(pattern.makespan),
                      f"{(1 - config.work / pattern.makespan) * 100:.3f}%"))
    print_table(table, right={3, 4})
    print("periods: work between two checkpoints of each level (a level's checkpoint includes the ones below); "
          "exact expected makespan, exponential failures (docs/interval.md)")
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
        show = show_progress(args, True)
        with progress_bar(show, args.seeds, "simulate", unit="history") as bar:
            res = simulate.run_simulation(sc, seeds=args.seeds, seed=args.seed, prior_factors=args.prior_factor,
                                          history_failures=args.history_failures,
                                          progress=bar.update if show else None)
    except CheckpointError as exc:
        return _error("simulate", str(exc))
    if args.markdown:
        print(simulate_report.format_table(res, show_sweep=args.sweep))
    else:
        _print_results(res, args.sweep)
    if args.plot:
        try:
            simulate_report.plot_waste(res, args.plot)
        except (OSError, ImportError) as exc:
            return _error("simulate", f"cannot write plot {args.plot}: {exc}")
        print(f"plot written to {args.plot}")
    return 0


def _print_results(res, show_sweep: bool) -> None:
    """The simulator's results as one table: a policy per row (and the sweep's fixed intervals with --sweep)."""
    s = res.scenario
    dist = "exponential" if s.dist == "exponential" else f"weibull k={s.shape:g}"
    print(f"work {duration_text(s.work)}, C {duration_text(s.cost)}, R {duration_text(s.restart)}, "
          f"MTBF {duration_text(s.mtbf)} ({dist}), {res.seeds} seeds (seed {res.seed})")
    oracle = res.policies["daly (oracle)"].mean
    table = [("POLICY", "INTERVAL", "MEAN MAKESPAN", "S.E.", "WASTE", "FAILURES", "VS ORACLE")]
    for p in list(res.policies.values()) + (res.sweep if show_sweep else []):
        interval = (duration_text(p.interval) if p.interval is not None
                    else f"-> {duration_text(float(np.median(p.final_intervals)))}")
        table.append((p.name, interval, duration_text(p.mean), f"{p.stderr / p.mean * 100:.2f}%",
                      f"{p.waste * 100:.2f}%", f"{p.mean_failures:.1f}", f"{p.mean / oracle:.4f}"))
    print_table(table, right={1, 2, 3, 4, 5, 6})
    exact = "" if math.isnan(res.exact_interval) else f", exact model optimum {duration_text(res.exact_interval)}"
    print(f"intervals: Young {duration_text(res.young_interval)}, Daly {duration_text(res.daly_interval)}{exact}; "
          f"simulated optimum {duration_text(res.optimum_interval)} "
          f"({(res.optimum_interval / res.daly_interval - 1) * 100:+.1f}% vs Daly)")
