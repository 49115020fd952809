"""Tables and plots of the failure simulator's results (simulate.py): text for the CLI, PNG for the docs.

matplotlib is imported only when a plot is drawn.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from hpcckpt.policy import formulas
from hpcckpt.core.humanize import format_duration
from hpcckpt.policy.simulate import SimulationResults, YoungDalyRow

__all__ = ["format_table", "print_table", "plot_waste", "format_young_daly", "plot_young_daly", "pyplot"]


def format_table(res: SimulationResults, show_sweep: bool = False) -> str:
    """A plain-text (Markdown-compatible) table of the results."""
    s = res.scenario
    dist = "exponential" if s.dist == "exponential" else f"weibull k={s.shape:g}"
    lines = [
        f"work {format_duration(s.work)}, C {format_duration(s.cost)}, R {format_duration(s.restart)}, "
        f"MTBF {format_duration(s.mtbf)} ({dist}), {res.seeds} seeds (seed {res.seed})",
        "",
        "| policy | interval | mean makespan | +- s.e. | waste | failures | vs oracle |",
        "|---|---|---|---|---|---|---|",
    ]
    oracle = res.policies["daly (oracle)"].mean
    rows = list(res.policies.values())
    if show_sweep:
        rows += res.sweep
    for p in rows:
        if p.interval is not None:
            iv = format_duration(p.interval)
        else:
            iv = f"-> {format_duration(float(np.median(p.final_intervals)))}"
        lines.append(
            f"| {p.name} | {iv} | {format_duration(p.mean)} | {p.stderr / p.mean * 100:.2f}% | "
            f"{p.waste * 100:.2f}% | {p.mean_failures:.1f} | {p.mean / oracle:.4f} |")
    lines.append("")
    ex = "" if math.isnan(res.exact_interval) else f", exact model optimum {format_duration(res.exact_interval)}"
    lines.append(
        f"intervals: Young {format_duration(res.young_interval)}, Daly {format_duration(res.daly_interval)}"
        f"{ex}; simulated optimum {format_duration(res.optimum_interval)} "
        f"({(res.optimum_interval / res.daly_interval - 1) * 100:+.1f}% vs Daly)")
    return "\n".join(lines)


def print_table(res: SimulationResults, show_sweep: bool = False) -> None:
    print(format_table(res, show_sweep))


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_waste(res: SimulationResults, path: str) -> str:
    """PNG of mean waste vs fixed interval, with the formula intervals marked."""
    plt = pyplot()
    s = res.scenario
    x = np.array([p.interval for p in res.sweep]) / 3600.0
    y = np.array([p.waste for p in res.sweep]) * 100
    e = np.array([p.stderr / p.mean * (1 - p.waste) for p in res.sweep]) * 100
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    ax.plot(x, y, "o-", ms=3, color="k", label="fixed interval (simulated)")
    ax.fill_between(x, y - 2 * e, y + 2 * e, color="0.8", label="±2 s.e. (per point)")
    if s.dist == "exponential":
        xs = np.geomspace(x.min(), x.max(), 200) * 3600.0
        ax.plot(xs / 3600.0, [formulas.expected_waste(t, s.cost, s.mtbf, s.restart) * 100 for t in xs],
                "--", color="tab:gray", lw=1, label="exponential model")
    ax.axvline(res.young_interval / 3600.0, color="tab:blue", ls=":", label="Young")
    ax.axvline(res.daly_interval / 3600.0, color="tab:red", ls="--", label="Daly")
    ax.axvline(res.optimum_interval / 3600.0, color="tab:green", ls="-", lw=1, label="simulated optimum")
    for k, p in res.policies.items():
        if k.startswith("learned"):
            ax.axhline(p.waste * 100, color="tab:purple" if "x10" in k else "tab:orange", lw=1, alpha=0.7,
                       label=f"{k} waste")
    ax.set_xscale("log")
    from matplotlib.ticker import ScalarFormatter

    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(ScalarFormatter())
    ax.tick_params(axis="x", which="minor", labelsize=7)
    ax.set_xlabel("compute interval between checkpoints (hours)")
    ax.set_ylabel("waste (% of makespan)")
    dist = "exponential" if s.dist == "exponential" else f"Weibull k={s.shape:g}"
    ax.set_title(f"C={format_duration(s.cost)}, R={format_duration(s.restart)}, MTBF={format_duration(s.mtbf)} "
                 f"({dist}), {res.seeds} seeds", fontsize=9)
    ax.legend(fontsize=7, loc="upper center", framealpha=0.9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def format_young_daly(rows: Sequence[YoungDalyRow]) -> str:
    lines = [
        "| C/M | Young tau/M | Daly tau/M | exact tau/M | sim Young/Daly makespan | +- s.e. "
        "| sim Daly/exact | model Young/exact | model Daly/exact |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.ratio:g} | {r.young:.4f} | {r.daly:.4f} | {r.exact:.4f} | {r.sim_young / r.sim_daly:.4f} | "
            f"{r.se_diff / r.sim_daly:.4f} | {r.sim_daly / r.sim_exact:.4f} | "
            f"{r.model_young / r.model_exact:.4f} | {r.model_daly / r.model_exact:.4f} |")
    return "\n".join(lines)


def plot_young_daly(rows: Sequence[YoungDalyRow], path: str) -> str:
    """PNG: excess makespan of Young's and Daly's intervals over the exact optimum vs C/M."""
    plt = pyplot()
    x = np.array([r.ratio for r in rows])
    fig, ax = plt.subplots(figsize=(6.5, 4), dpi=120)
    ax.plot(x, [(r.model_young / r.model_exact - 1) * 100 for r in rows], "-", color="tab:blue",
            label="Young (model)")
    ax.plot(x, [(r.model_daly / r.model_exact - 1) * 100 for r in rows], "-", color="tab:red",
            label="Daly (model)")
    ax.plot(x, [(r.sim_young / r.sim_exact - 1) * 100 for r in rows], "o", color="tab:blue",
            label="Young (simulated)")
    ax.plot(x, [(r.sim_daly / r.sim_exact - 1) * 100 for r in rows], "s", color="tab:red", mfc="none",
            label="Daly (simulated)")
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint cost / MTBF (C/M)")
    ax.set_ylabel("makespan excess over optimum (%)")
    ax.axhline(0, color="k", lw=0.5)
    ax.legend(fontsize=8)
    ax.set_title("Young vs Daly interval, exponential failures", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
