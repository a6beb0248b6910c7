"""Power before the run: exact Fisher power vs brute force and simulation, log-rank vs Schoenfeld,
and the ``orchestrator design power`` command."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats
from scipy.stats import fisher_exact
from statsmodels.stats.power import NormalIndPower
from statsmodels.stats.proportion import proportion_effectsize

from orchestrator.cli import main
from orchestrator.design.power import (
    EscapeModel,
    fisher_power,
    fisher_sample_size,
    fisher_sequential,
    hazard_from_median,
    logrank_power,
    logrank_sample_size,
    schoenfeld_n,
)


@pytest.mark.parametrize("p0,p1,n", [(0.9, 0.4, 10), (0.7, 0.5, 13), (0.2, 0.2, 9)])
def test_fisher_power_equals_brute_force_with_scipy(p0, p1, n):
    ref = 0.0
    for a in range(n + 1):
        for b in range(n + 1):
            if fisher_exact([[a, n - a], [b, n - b]]).pvalue <= 0.05:
                ref += stats.binom.pmf(a, n, p0) * stats.binom.pmf(b, n, p1)
    assert fisher_power(p0, p1, n) == pytest.approx(ref, abs=1e-12)


def test_fisher_power_against_independent_simulation():
    rng = np.random.default_rng(123)
    n, sims = 17, 100_000
    a = rng.binomial(n, 0.9, sims)
    b = rng.binomial(n, 0.4, sims)
    cache: dict[tuple[int, int], bool] = {}
    hits = 0
    for x, y in zip(a.tolist(), b.tolist()):
        if (x, y) not in cache:
            cache[(x, y)] = fisher_exact([[x, n - x], [y, n - y]]).pvalue <= 0.05
        hits += cache[(x, y)]
    sim = hits / sims
    exact = fisher_power(0.9, 0.4, n)
    assert abs(sim - exact) < 4 * math.sqrt(exact * (1 - exact) / sims)


def _casagrande_pike_smith(p0, p1, alpha=0.05, power=0.8):
    """Continuity-corrected normal sample size, the classical approximation to Fisher's exact test
    (Casagrande, Pike & Smith 1978, Biometrics 34:483)."""
    za, zb = stats.norm.isf(alpha / 2), stats.norm.isf(1 - power)
    pbar = (p0 + p1) / 2
    d = abs(p0 - p1)
    n1 = (za * math.sqrt(2 * pbar * (1 - pbar)) + zb * math.sqrt(p0 * (1 - p0) + p1 * (1 - p1))) ** 2 / d**2
    return n1 / 4 * (1 + math.sqrt(1 + 4 / (n1 * d))) ** 2


@pytest.mark.parametrize("p0,p1", [(0.9, 0.4), (0.7, 0.3), (0.8, 0.5), (0.6, 0.3)])
def test_fisher_sample_size_vs_published_approximations(p0, p1):
    r = fisher_sample_size(p0, p1, 0.05, 0.8)
    assert r.n is not None and r.power >= 0.8
    assert fisher_power(p0, p1, r.n - 1) < 0.8
    cps = _casagrande_pike_smith(p0, p1)
    assert abs(r.n - cps) <= 2, (r.n, cps)
    # the uncorrected normal approximation (statsmodels, arcsine effect size) needs fewer seeds
    # than the exact test really does
    n_norm = NormalIndPower().solve_power(proportion_effectsize(p0, p1), alpha=0.05, power=0.8)
    assert r.n > n_norm


def test_fisher_power_is_a_sawtooth_and_both_answers_are_reported():
    r = fisher_sample_size(0.9, 0.4, 0.05, 0.8)
    curve = dict(r.curve)
    assert curve[10] < curve[9]  # more seeds, less power: the exact test's discreteness
    assert r.n == 17 and r.n_stays is not None and r.n_stays >= r.n
    assert all(curve[n] >= 0.8 for n in range(r.n_stays, r.n_scanned + 1))
    r2 = fisher_sample_size(0.62, 0.4, 0.05, 0.5, n_max=120)
    assert r2.n_stays >= r2.n


def test_one_look_sequential_is_the_fixed_test():
    for n in (9, 17, 24):
        seq = fisher_sequential(0.9, 0.4, [n], 0.05)
        assert seq.power == pytest.approx(fisher_power(0.9, 0.4, n), abs=1e-12)
        assert seq.expected_n_h1 == pytest.approx(n)


@pytest.mark.parametrize("m0,m1,budget", [(600, 2400, 3000), (1000, 2000, 3000), (800, 1600, 6000)])
def test_logrank_sample_size_vs_schoenfeld(m0, m1, budget):
    model = EscapeModel(hazard_from_median(m0), hazard_from_median(m1), budget, 100)
    _, n_sch = schoenfeld_n(model.h0, model.h1, budget, 0.05, 0.8)
    r = logrank_sample_size(model, 0.05, 0.8, sims=4000, seed=1)
    assert r.n is not None
    assert abs(r.n - n_sch) <= max(2.0, 0.1 * n_sch), (r.n, n_sch)
    # and the simulated power at the answer is at the target, not far above
    pw = logrank_power(model, r.n, sims=4000, seed=2)
    assert 0.8 - 3 * math.sqrt(0.16 / 4000) <= pw <= 0.9


def test_logrank_power_is_seeded():
    model = EscapeModel(hazard_from_median(600), hazard_from_median(2400), 3000, 100)
    assert logrank_power(model, 10, sims=2000, seed=4) == logrank_power(model, 10, sims=2000, seed=4)


def test_cli_fisher_json(capsys):
    rc = main(
        [
            "design",
            "power",
            "--test",
            "fisher",
            "--rates",
            "0.9,0.4",
            "--alpha",
            "0.05",
            "--power",
            "0.8",
            "--looks",
            "8,16,24,40",
            "--json",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fixed"]["n"] == 17
    seq = out["sequential"]
    assert seq["looks"] == [8, 16, 24, 40]
    assert seq["boundaries"][0] == pytest.approx(4.877, abs=1e-3)
    assert seq["expected_n_h1"] < 40 and seq["size"] <= 0.05
    need = out["sequential_needed"]
    assert need["power"] >= 0.8 and need["expected_n_h1"] < out["fixed"]["n"]


def test_cli_logrank_text(capsys):
    rc = main(
        [
            "design",
            "power",
            "--test",
            "logrank",
            "--medians",
            "600,2400",
            "--budget",
            "3000",
            "--looks",
            "4,8,12,16",
            "--sims",
            "2000",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "fixed design:" in out and "Schoenfeld:" in out and "expected seeds per group" in out


@pytest.mark.parametrize(
    "args,match",
    [
        (["--test", "fisher", "--rates", "0.9"], "--rates needs exactly two values"),
        (["--test", "fisher", "--rates", "0.9,1.2"], "--rates values must be in [0, 1]"),
        (["--test", "fisher", "--rates", "0.5,0.5"], "the two groups are equal"),
        (["--test", "fisher", "--rates", "a,b"], "--rates must be two numbers"),
        (["--test", "fisher", "--rates", "0.9,0.4", "--alpha", "0.7"], "--alpha must be in (0, 0.5)"),
        (
            ["--test", "fisher", "--rates", "0.9,0.4", "--looks", "8,8"],
            "--looks must be positive and strictly increasing",
        ),
        (["--test", "fisher", "--rates", "0.9,0.4", "--spending", "haybittle"], "--spending must be"),
        (["--test", "logrank", "--medians", "600,2400"], "needs --budget"),
        (["--test", "logrank", "--budget", "3000"], "exactly one of --medians or --hazards"),
        (["--test", "logrank", "--medians", "600,-1", "--budget", "3000"], "--medians values must be in (0, inf)"),
        (["--test", "ttest", "--rates", "0.9,0.4"], "--test must be fisher or logrank"),
    ],
)
def test_cli_bad_input_one_line_exit_2(capsys, args, match):
    rc = main(["design", "power", *args])
    assert rc == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1


@pytest.mark.parametrize("spending", ["obrien_fleming", "pocock"])
def test_fisher_sequential_exact_size_below_alpha_for_every_common_rate(spending):
    # The type-I error of the discrete procedure depends on the common lock-in rate; the exact
    # enumeration shows it stays below alpha across rates (Fisher's conservatism).
    sizes = [fisher_sequential(p, p, [8, 16, 24, 40], 0.05, spending).power for p in np.linspace(0.05, 0.95, 19)]
    assert max(sizes) <= 0.05
    assert max(sizes) > 0.01  # and the test is not vacuous
