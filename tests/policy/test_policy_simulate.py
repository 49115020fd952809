"""Tests for the simulator (event logic, issue targets at modest Monte Carlo sizes) and the CLI."""

import math

import numpy as np
import pytest

from hpcckpt.errors import CheckpointError
from hpcckpt import cli
from hpcckpt.cli import intervals
from hpcckpt.cli.common import parse_duration
from hpcckpt.policy import formulas
from hpcckpt.policy import simulate as S
from hpcckpt.policy import simulate_report as R


class FixedStream(S.FailureStream):
    """A failure stream with given times (then none)."""

    def __init__(self, times):
        self.times = list(times) + [1e300]

    def __getitem__(self, i):
        return self.times[min(i, len(self.times) - 1)]


def test_event_logic_hand_computed():
    # W = 10, C = 1, R = 2, tau = 4, failures at 7 and 8.5:
    #  0-4 compute, 4-5 checkpoint (committed 4), 5-7 compute, failure at 7 (2 s lost)
    #  restart 7-9, but failure at 8.5 -> restart again 8.5-10.5
    #  remaining 6: 10.5-14.5 compute, 14.5-15.5 checkpoint, 15.5-17.5 compute -> done at 17.5
    s = S.Scenario(work=10, cost=1, restart=2, mtbf=1.0)
    r = S.simulate_job(s, 4.0, FixedStream([7.0, 8.5]))
    assert r.makespan == pytest.approx(17.5)
    assert r.failures == 2
    assert r.checkpoints == 2


def test_no_failure_makespan_and_failure_during_checkpoint():
    s = S.Scenario(work=10, cost=1, restart=0, mtbf=1.0)
    assert S.simulate_job(s, 3.0, FixedStream([])).makespan == pytest.approx(10 + 3)  # 4 segments, 3 ckpts
    # failure at 4.5, during the first checkpoint (3-4 is compute 3..., ckpt 3-4; second compute 4-7)
    # tau = 3: compute 0-3, ckpt 3-4 (committed 3); failure at 3.5 inside the *first* checkpoint:
    r = S.simulate_job(s, 3.0, FixedStream([3.5]))
    # everything lost: restart at 3.5 (R = 0), then 13 s more -> 16.5
    assert r.makespan == pytest.approx(16.5)


def test_simulated_mean_matches_exponential_model():
    # long job, fixed interval: the Monte Carlo mean should match Daly's expectation
    # (the model has W/tau full segments; the simulated job skips the last checkpoint: -C)
    s = S.Scenario(work=100.0, cost=0.1, restart=0.05, mtbf=1.0)
    tau = 0.5
    ms = []
    for child in np.random.SeedSequence(3).spawn(200):
        ms.append(S.simulate_job(s, tau, S.FailureStream(s, np.random.default_rng(child))).makespan)
    ms = np.array(ms)
    model = formulas.expected_makespan(s.work, tau, s.cost, s.mtbf, s.restart)
    se = ms.std(ddof=1) / math.sqrt(len(ms))
    assert abs(ms.mean() - model) < 4 * se + 0.01 * model


def test_optimum_within_5pct_of_daly_exponential():
    # C/M = 0.1 (Young would be 17 % too long): 50 histories of 50 M of work, cubic fit
    s = S.Scenario(work=50.0, cost=0.1, restart=0.0, mtbf=1.0)
    res = S.run_simulation(s, seeds=50, seed=4, prior_factors=())
    assert res.optimum_interval == pytest.approx(res.daly_interval, rel=0.05)
    assert res.young_interval / res.daly_interval > 1.15  # the test can tell Young from Daly
    assert not res.optimum_interval == pytest.approx(res.young_interval, rel=0.05)


def test_empirical_optimum_on_model_curve():
    for ratio in (0.01, 0.1, 1.0):
        iv = S.default_sweep(S.Scenario(1.0, ratio, 0.0, 1.0))
        ys = [formulas.expected_makespan(1.0, t, ratio, 1.0) for t in iv]
        assert S.empirical_optimum(iv, ys) == pytest.approx(formulas.exact_optimum(ratio, 1.0), rel=0.005)


def test_learned_within_5pct_of_oracle_after_10_failures():
    # Issue target: prior MTBF 10x too high or too low; once 10 failures are in the history the
    # learned policy's mean makespan is within 5 % of the oracle's (Daly with the true M).
    # Hard case: C/M = 0.05 (30 % waste), a job of 10 M of work (~14 failures of its own).
    s = S.Scenario(work=10.0, cost=0.05, restart=0.025, mtbf=1.0)
    res = S.run_simulation(s, seeds=150, seed=5, intervals=[0.3], history_failures=10)
    assert 8 <= res.policies["daly (oracle)"].mean_failures <= 20
    for k in ("learned (prior x10, 10 past failures)", "learned (prior x0.1, 10 past failures)"):
        assert res.ratio(k) < 1.03, (k, res.ratio(k))
    # learning from nothing inside this short job costs more (~3-5 %, see docs/interval.md)
    for k in ("learned (prior x10)", "learned (prior x0.1)"):
        assert res.ratio(k) < 1.08, (k, res.ratio(k))


def test_learned_from_scratch_long_job():
    # a job long enough to see ~40 failures: learning from a 10x-wrong prior inside the job
    s = S.Scenario(work=30.0, cost=0.05, restart=0.025, mtbf=1.0)
    res = S.run_simulation(s, seeds=60, seed=9, intervals=[0.3])
    for k in ("learned (prior x10)", "learned (prior x0.1)"):
        assert res.ratio(k) < 1.05, (k, res.ratio(k))
    # and the learned interval converges towards Daly's
    med = float(np.median(res.policies["learned (prior x10)"].final_intervals))
    assert med == pytest.approx(res.daly_interval, rel=0.2)


@pytest.mark.parametrize("dist,shape", [("exponential", 1.0), ("weibull", 0.7)])
def test_learned_better_than_wrong_prior_fixed(dist, shape):
    # Daly with the 10x-wrong MTBF and no learning is clearly worse than learning
    s = S.Scenario(work=20.0, cost=0.05, restart=0.0, mtbf=1.0, dist=dist, shape=shape)
    wrong = formulas.daly(0.05, 10.0)
    res = S.run_simulation(s, seeds=60, seed=6, intervals=[wrong], prior_factors=(10.0,))
    assert res.policies["learned (prior x10)"].mean < res.sweep[0].mean


def test_daly_no_worse_than_young_when_cost_large():
    rows = S.compare_young_daly(ratios=(0.01, 0.5, 1.0), seeds=80, seed=7, work_in_mtbf=100)
    small, mid, large = rows
    # small C/M: the two are equivalent (model ratio within 0.1 %)
    assert small.model_young / small.model_daly == pytest.approx(1.0, abs=1e-3)
    # large C/M: Young's makespan is larger, in the model and in the simulation
    for r in (mid, large):
        assert r.model_young > r.model_daly * 1.03
        assert r.sim_young - r.sim_daly > 2 * r.se_diff
    # the gap grows with C/M (the shape of Daly's comparison)
    assert large.model_young / large.model_exact > mid.model_young / mid.model_exact
    assert large.model_daly / large.model_exact < 1.01


def test_scenario_validation():
    for kw in ({"work": 0}, {"mtbf": -1}, {"cost": float("nan")}, {"dist": "gamma"}, {"shape": 0}):
        args = dict(work=1.0, cost=0.1, restart=0.0, mtbf=1.0)
        args.update(kw)
        with pytest.raises(CheckpointError):
            S.Scenario(**args)
    with pytest.raises(CheckpointError):
        S.run_simulation(S.Scenario(1.0, 0.1, 0.0, 1.0), seeds=0)


def test_table_and_plot(tmp_path):
    s = S.Scenario(work=20.0, cost=0.05, restart=0.0, mtbf=1.0)
    res = S.run_simulation(s, seeds=10, seed=8)
    text = R.format_table(res, show_sweep=True)
    assert "daly (oracle)" in text and "learned (prior x10)" in text and "simulated optimum" in text
    assert text.count("| fixed ") == len(res.sweep)
    path = R.plot_waste(res, str(tmp_path / "w.png"))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    rows = S.compare_young_daly(ratios=(0.1, 1.0), seeds=5)
    assert "Young" in R.format_young_daly(rows)
    p2 = R.plot_young_daly(rows, str(tmp_path / "yd.png"))
    with open(p2, "rb") as f:
        assert f.read(4) == b"\x89PNG"


# ---------------------------------------------------------------------- CLI
@pytest.mark.parametrize("text,seconds", [("40", 40), ("40s", 40), ("5m", 300), ("12h", 43200), ("2d", 172800),
                                          ("1.5h", 5400), ("1h30m", 5400), (" 10 m ", 600), ("0", 0),
                                          (".5m", 30), (7, 7.0)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "abc", "4x0", "-5", "12hh", "nan", "inf", "1h30", "h", "5 y"])
def test_parse_duration_rejects(text):
    with pytest.raises(CheckpointError, match="bad duration"):
        parse_duration(text)


def test_cli_interval_output(capsys):
    assert cli.main(["interval", "--cost", "40s", "--mtbf", "12h"]) == 0
    out = capsys.readouterr().out
    # Young sqrt(2*40*43200) = 1859 s = 31m; Daly 1832 s = 30.5m
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[2:5]}
    assert out.splitlines()[1].split() == ["POLICY", "INTERVAL", "SECONDS", "EXPECTED", "WASTE"]
    assert rows["Young"][:2] == ["31m", "1859"] and rows["Daly"][:2] == ["30.5m", "1832"]
    assert all(r[-1].endswith("%") for r in rows.values())


def test_cli_bad_duration_one_line(capsys):
    assert cli.main(["interval", "--cost", "4x0", "--mtbf", "12h"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad duration '4x0'" in err
    assert cli.main(["interval", "--cost", "40s", "--mtbf", "0"]) == 2
    assert "mtbf" in capsys.readouterr().err


def test_cli_simulate_small(capsys, tmp_path):
    png = tmp_path / "s.png"
    rc = cli.main(["simulate", "--work", "2d", "--cost", "10m", "--mtbf", "6h", "--seeds", "5",
                   "--plot", str(png)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "daly (oracle)" in out and png.exists()
    assert cli.main(["simulate", "--work", "x", "--seeds", "5"]) == 2


def test_add_subcommands_dispatch():
    import argparse

    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="command")
    intervals.add_subcommands(sub)
    args = p.parse_args(["interval", "--cost", "1m", "--mtbf", "1d"])
    assert args.func is intervals.run_interval
    assert p.parse_args(["simulate"]).func is intervals.run_simulate


def test_run_simulation_reports_progress_once_per_history():
    ticks = []
    s = S.Scenario(work=86400.0, cost=600.0, restart=300.0, mtbf=43200.0)
    with_progress = S.run_simulation(s, seeds=5, progress=ticks.append)
    assert ticks == [1] * 5
    assert with_progress.policies["young"].mean == S.run_simulation(s, seeds=5).policies["young"].mean
