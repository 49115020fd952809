#!/usr/bin/env python
"""Learned multi-level intervals against the first-order formula and the exhaustive search.

    PYTHONPATH=. .venv/bin/python bench/ml_intervals.py --train     # regenerate hpcckpt/policy/data/ml_intervals.json
    PYTHONPATH=. .venv/bin/python bench/ml_intervals.py --json ml.json

``--train``: for each number of levels (2 and 3), ``--train-configs``
configurations drawn by ``learned_levels.sample_configs`` (seed 1), their
optimum found by ``multilevel.search_many``, and the model fitted by
``learned_levels.fit``; written to the package's model file.

Evaluation: ``--test-configs`` held-out configurations (seed 2, never
trained on), for each the searched optimum, Benoit et al.'s first-order
pattern (``multilevel.formula_pattern``) and the learned one
(``learned_levels.predict``), and the formula's pattern fitted to the work
(``multilevel.fit_to_work``, as the learned prediction is: the share of the
gain that is not the model's), all scored by the exact expected makespan of
the same model.  Gap = makespan / searched optimum - 1.  Times: median wall
time of one ``search`` and of one ``predict(..., with_makespan=False)`` per
configuration (``--timed`` of them), on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hpcckpt.policy import learned_levels, multilevel  # noqa: E402

LEVELS = (2, 3)


def train(n: int, degree: int) -> dict:
    models = {}
    for levels in LEVELS:
        t0 = time.perf_counter()
        configs = learned_levels.sample_configs(np.random.default_rng([1, levels]), n, levels)
        optima = multilevel.search_many(configs)
        models[str(levels)] = learned_levels.fit(configs, optima, degree=degree)
        print(f"{levels} levels: {n} configurations searched and fitted in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr)
    doc = {"format": learned_levels.MODEL_FORMAT, "version": learned_levels.MODEL_VERSION,
           "generated_by": "bench/ml_intervals.py --train --train-configs %d --degree %d" % (n, degree),
           "models": models}
    os.makedirs(os.path.dirname(learned_levels.MODEL_FILE), exist_ok=True)
    with open(learned_levels.MODEL_FILE, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=0)
        f.write("\n")
    return doc


def evaluate(n: int, timed: int) -> list:
    rows = []
    for levels in LEVELS:
        configs = learned_levels.sample_configs(np.random.default_rng([2, levels]), n, levels)
        optima = multilevel.search_many(configs)
        gaps = {"learned": [], "first-order formula": [], "first-order formula, fitted to the work": []}
        for c, best in zip(configs, optima):
            gaps["learned"].append(learned_levels.predict(c).makespan / best.makespan - 1)
            formula = multilevel.formula_pattern(c)
            gaps["first-order formula"].append(formula.makespan / best.makespan - 1)
            fitted = multilevel.fit_to_work(c, formula)
            gaps["first-order formula, fitted to the work"].append(
                multilevel.expected_makespan(c, fitted.period, fitted.ratios) / best.makespan - 1)
        t_search, t_pred = [], []
        for c in configs[:timed]:
            t0 = time.perf_counter()
            multilevel.search(c)
            t1 = time.perf_counter()
            for _ in range(20):
                learned_levels.predict(c, with_makespan=False)
            t2 = time.perf_counter()
            t_search.append(t1 - t0)
            t_pred.append((t2 - t1) / 20)
        for method, g in gaps.items():
            g = np.asarray(g)
            rows.append({"levels": levels, "method": method, "configs": n,
                         "within_2pct": float(np.mean(g <= 0.02)), "median_gap": float(np.median(g)),
                         "p90_gap": float(np.quantile(g, 0.9)), "worst_gap": float(g.max()),
                         "search_s": statistics.median(t_search),
                         "predict_s": statistics.median(t_pred) if method == "learned" else None})
    return rows


def table(rows: list) -> str:
    out = ["| levels | method | held-out configs | within 2 % of the search | median gap | 90th pct gap | worst gap "
           "| time per prediction | time per search | speed-up |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        pred = r["predict_s"]
        out.append(f"| {r['levels']} | {r['method']} | {r['configs']} | {r['within_2pct'] * 100:.1f} % "
                   f"| {r['median_gap'] * 100:+.3f} % | {r['p90_gap'] * 100:+.3f} % | {r['worst_gap'] * 100:+.2f} % "
                   + (f"| {pred * 1e6:.0f} µs | {r['search_s'] * 1e3:.0f} ms | {r['search_s'] / pred:,.0f}x |"
                      if pred else f"| - | {r['search_s'] * 1e3:.0f} ms | - |"))
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", action="store_true", help="regenerate the shipped model file first")
    ap.add_argument("--train-configs", type=int, default=600)
    ap.add_argument("--degree", type=int, default=3)
    ap.add_argument("--test-configs", type=int, default=300)
    ap.add_argument("--timed", type=int, default=20, help="configurations whose search and prediction are timed")
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    if args.train:
        train(args.train_configs, args.degree)
        learned_levels.load_models.cache_clear()
    rows = evaluate(args.test_configs, args.timed)
    print(table(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"bench": "ml_intervals", "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
