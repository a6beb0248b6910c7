"""Fisher, permutation, McNemar, Kaplan-Meier and log-rank, computed straight off the store
(SQLite and PostgreSQL), each checked against an independent computation: the seed paper's
published p-values, hypergeometric and binomial sums by hand, full enumeration of
relabellings, and the product-limit and log-rank formulas written out."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from orchestrator import analysis as oa
from orchestrator.store.import_jsonl import write_records
from orchestrator.errors import UserError
from orchestrator.store.engine import open_store_engine

GRID = [1] + list(range(200, 3001, 200))


def trace(final: float, escape: int | None = None, collapse: int | None = None) -> list[dict]:
    """A plateau at chance, an escape to ``final`` at ``escape`` (or a late climb to ``final``
    without escaping when it is below 0.8), or zero accuracy from ``collapse`` on."""
    out = []
    for s in GRID:
        if collapse is not None and s >= collapse:
            acc = 0.0
        elif escape is not None and s >= escape:
            acc = final
        elif escape is None and s == GRID[-1]:
            acc = final
        else:
            acc = 0.03
        out.append({"step": s, "acc": acc, "loss": 3.0 - 2.0 * acc})
    return out


def rec(group: str, seed: int, final: float, escape: int | None = None, collapse: int | None = None, **params) -> dict:
    return {
        "params": {"arm": "mlstm", "seed": seed, "tag.group": group, **params},
        "trace": trace(final, escape, collapse),
    }


def fisher_two_sided_by_hand(k1, n1, k2, n2):
    """Sum of hypergeometric probabilities of tables no more likely than the observed."""
    K, N = k1 + k2, n1 + n2

    def prob(x):
        return math.comb(n1, x) * math.comb(n2, K - x) / math.comb(N, K)

    obs = prob(k1)
    xs = range(max(0, K - n2), min(n1, K) + 1)
    return sum(prob(x) for x in xs if prob(x) <= obs * (1 + 1e-9))


def test_fisher_reproduces_the_seed_papers_figures(db_url):
    engine, _ = open_store_engine(db_url)
    recs = (
        [rec("dense", s, 0.99 if s < 1 else 0.02, 1200 if s < 1 else None) for s in range(10)]
        + [rec("distance", s, 0.99 if s < 7 else 0.03, 800 if s < 7 else None) for s in range(10)]
        + [rec("time_ramp", s, 0.02) for s in range(6)]
        + [rec("gated", s, 0.97, 1400) for s in range(6)]
    )
    write_records(engine, "curriculum", recs)
    res = oa.fisher(engine, "curriculum", by="group", compare="distance,dense")
    d = res.to_dict()
    assert d["groups"] == {"distance": {"k": 7, "n": 10, "rate": 0.7}, "dense": {"k": 1, "n": 10, "rate": 0.1}}
    # 7/10 vs 1/10: p = 0.02, Fisher two-sided (001 §6).
    assert round(d["p_value"], 2) == 0.02
    assert d["p_value"] == pytest.approx(fisher_two_sided_by_hand(7, 10, 1, 10), rel=1e-10)
    # One-sided: P(X >= 7) under the hypergeometric with 8 lock-ins among 20.
    one = sum(math.comb(10, x) * math.comb(10, 8 - x) for x in range(7, 9)) / math.comb(20, 8)
    assert d["p_greater"] == pytest.approx(one, rel=1e-10)
    # 6/6 vs 0/6: one-sided p = 0.0011 (001 §6): 1 / C(12, 6).
    g = oa.fisher(engine, "curriculum", by="group", compare="gated,time_ramp", alternative="greater")
    assert g.p_value == pytest.approx(1 / math.comb(12, 6), rel=1e-10)
    assert round(g.p_value, 4) == 0.0011
    assert g.to_dict()["p_two_sided"] == pytest.approx(2 / math.comb(12, 6), rel=1e-10)


def test_permutation_test_is_exact_against_full_enumeration(db_url):
    engine, _ = open_store_engine(db_url)
    a_final = [0.99, 0.97, 0.4, 0.03, 0.95]
    b_final = [0.02, 0.03, 0.5, 0.04, 0.03, 0.9]
    recs = [rec("causal", s, f, 1000 if f >= 0.8 else None) for s, f in enumerate(a_final)] + [
        rec("bidir", s, f, 1600 if f >= 0.8 else None) for s, f in enumerate(b_final)
    ]
    write_records(engine, "collision", recs)
    x = np.array(a_final + b_final)
    obs = np.mean(a_final) - np.mean(b_final)
    diffs = []
    for idx in itertools.combinations(range(len(x)), len(a_final)):
        mask = np.zeros(len(x), bool)
        mask[list(idx)] = True
        diffs.append(x[mask].mean() - x[~mask].mean())
    diffs = np.array(diffs)
    eps = 1e-12
    p_greater = np.mean(diffs >= obs - eps)
    p_less = np.mean(diffs <= obs + eps)
    for alt, want in (("greater", p_greater), ("less", p_less), ("two-sided", min(1.0, 2 * min(p_greater, p_less)))):
        res = oa.permutation(engine, "collision", by="group", compare="causal,bidir", alternative=alt).to_dict()
        assert res["exact"] is True and res["n_relabellings"] == math.comb(11, 5)
        assert res["p_value"] == pytest.approx(want, abs=1e-12), alt
        assert res["test_statistic"] == pytest.approx(obs)
        assert res["groups"]["causal"]["mean"] == pytest.approx(np.mean(a_final))


def mcnemar_by_hand(b: int, c: int) -> float:
    n = b + c
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


def test_mcnemar_matches_the_exact_binomial_by_hand(db_url):
    engine, _ = open_store_engine(db_url)
    # 003 §4: stretching the cosine period flips 8 seeds failed -> solved, none back.
    solved_short = {0, 1, 2}
    solved_long = solved_short | {3, 4, 5, 6, 7, 8, 9, 10}
    recs = [
        rec("tmax2000", s, 0.95 if s in solved_short else 0.03, 1400 if s in solved_short else None) for s in range(16)
    ] + [rec("tmax4000", s, 0.95 if s in solved_long else 0.03, 1000 if s in solved_long else None) for s in range(16)]
    # Two seeds of a second batch size: pairing on seed alone would be ambiguous.
    recs += [rec("tmax2000", s, 0.03, batch_size=64) for s in range(2)]
    recs += [rec("tmax4000", s, 0.95, 600, batch_size=64) for s in range(2)]
    write_records(engine, "schedule", recs)
    res = oa.mcnemar(engine, "schedule", by="group", compare="tmax4000,tmax2000", where="batch_size IS NULL").to_dict()
    assert (res["only_a"], res["only_b"], res["n_pairs"]) == (8, 0, 16)
    assert res["p_value"] == pytest.approx(mcnemar_by_hand(8, 0), rel=1e-12)
    assert round(res["p_value"], 3) == 0.008
    with pytest.raises(UserError, match="several trials"):
        oa.mcnemar(engine, "schedule", by="group", compare="tmax4000,tmax2000")
    both = oa.mcnemar(engine, "schedule", by="group", compare="tmax4000,tmax2000", pair_on="seed,batch_size").to_dict()
    assert (both["only_a"], both["n_pairs"]) == (10, 18)
    assert both["p_value"] == pytest.approx(mcnemar_by_hand(10, 0), rel=1e-12)


def test_mcnemar_with_discordance_both_ways():
    import pandas as pd

    from orchestrator.analysis.contrasts import mcnemar

    rows = []
    pattern = [(1, 0)] * 7 + [(0, 1)] * 2 + [(1, 1)] * 3 + [(0, 0)] * 4
    for seed, (la, lb) in enumerate(pattern):
        rows.append({"trial_id": 2 * seed, "g": "A", "seed": seed, "locked": bool(la)})
        rows.append({"trial_id": 2 * seed + 1, "g": "B", "seed": seed, "locked": bool(lb)})
    res = mcnemar(pd.DataFrame(rows), oa.AnalysisConfig(by="g"))
    assert res.p_value == pytest.approx(mcnemar_by_hand(7, 2), rel=1e-12)
    assert res.p_value == pytest.approx(2 * (1 + 9 + 36) / 512, rel=1e-12)


def logrank_by_hand(times, events, in_a):
    """Two-group log-rank chi-square, the textbook sum over distinct event times;
    ``in_a`` may be a 2-D array of relabellings (one row each)."""
    times, events = np.asarray(times, float), np.asarray(events, bool)
    in_a = np.atleast_2d(np.asarray(in_a, float))
    o_e = np.zeros(in_a.shape[0])
    var = np.zeros(in_a.shape[0])
    for t in np.unique(times[events]):
        at_risk = times >= t
        died = (times == t) & events
        n, d = at_risk.sum(), died.sum()
        n_a = in_a @ at_risk
        d_a = in_a @ died
        o_e += d_a - d * n_a / n
        if n > 1:
            var += d * (n_a / n) * (1 - n_a / n) * (n - d) / (n - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(var > 0, o_e**2 / var, 0.0)


def test_logrank_and_km_against_hand_formulas_and_a_permutation_estimate(db_url):
    from scipy.stats import chi2

    engine, _ = open_store_engine(db_url)
    base = [
        (1800, None),
        (2400, None),
        (None, None),
        (None, 1400),
        (None, None),
        (3000, None),
        (None, None),
        (2200, None),
        (None, None),
    ]
    ns5 = [
        (600, None),
        (800, None),
        (1200, None),
        (None, None),
        (1000, None),
        (1600, None),
        (800, None),
        (2600, None),
        (None, None),
    ]
    recs = [rec("baseline", s, 0.95 if e else (0.0 if c else 0.03), e, c) for s, (e, c) in enumerate(base)]
    recs += [rec("ns5", s, 0.95 if e else 0.03, e, c) for s, (e, c) in enumerate(ns5)]
    write_records(engine, "small", recs)
    res = oa.logrank(engine, "small", by="group", logrank="hypergeometric").to_dict()
    assert res["variance"] == "hypergeometric"
    times = [e or c or 3000 for e, c in base + ns5]
    events = [e is not None for e, _ in base + ns5]
    in_a = [1] * len(base) + [0] * len(ns5)
    stat = float(logrank_by_hand(times, events, in_a)[0])
    assert res["test_statistic"] == pytest.approx(stat, rel=1e-10)
    assert res["p_value"] == pytest.approx(chi2.sf(stat, 1), rel=1e-10)
    assert res["groups"]["baseline"]["collapses"] == 1
    assert res["groups"]["baseline"]["escapes"] == 4 and res["groups"]["ns5"]["escapes"] == 7
    # Brute force: every relabelling of 18 trials into 9 + 9 (48,620), exact permutation p.
    n = len(times)
    labels = np.zeros((math.comb(n, 9), n))
    for i, idx in enumerate(itertools.combinations(range(n), 9)):
        labels[i, list(idx)] = 1
    perm = logrank_by_hand(times, events, labels)
    p_perm = float(np.mean(perm >= stat - 1e-9))
    assert 0.005 < res["p_value"] < 0.1  # a contrast where the approximation matters
    assert res["p_value"] == pytest.approx(p_perm, abs=0.01)

    # The default at 9 vs 9 seeds (auto): the permutation variance, named. Its numerator is
    # the sum of group a's log-rank scores a_i = event_i - Lambda(t_i) (pooled Nelson-Aalen);
    # its variance is that sum's exact variance over the 48,620 relabellings above.
    auto = oa.logrank(engine, "small", by="group").to_dict()
    assert auto["variance"] == "permutation"
    t, d = np.asarray(times, float), np.asarray(events, bool)
    cum = {u: sum(((t == v) & d).sum() / (t >= v).sum() for v in np.unique(t) if v <= u) for u in np.unique(t)}
    scores = d - np.array([cum[u] for u in t])
    sums = labels @ scores
    z_brute = float(np.asarray(in_a, float) @ scores) / math.sqrt(float(np.mean(sums**2) - np.mean(sums) ** 2))
    assert auto["z"] == pytest.approx(z_brute, rel=1e-10)
    assert auto["test_statistic"] == pytest.approx(z_brute**2, rel=1e-10)
    assert auto["p_value"] == pytest.approx(chi2.sf(z_brute**2, 1), rel=1e-10)

    km = oa.km(engine, "small", by="group").to_dict()
    for g, rows in (("baseline", base), ("ns5", ns5)):
        t = np.array([e or c or 3000 for e, c in rows], float)
        d = np.array([e is not None for e, _ in rows])
        s, curve = 1.0, {}
        for u in np.unique(t):
            at = (t >= u).sum()
            s *= 1 - ((t == u) & d).sum() / at
            curve[u] = s
        got = dict((a, b) for a, b in km["groups"][g]["survival"] if a > 0)
        assert got == pytest.approx(curve)
    assert km["groups"]["ns5"]["median"] == 1200
    # Median: the first step where S <= 0.5. Baseline reaches exactly 0.5 at 3000
    # (0.625 * 4/5, the collapse at 1400 having left the risk set).
    assert km["groups"]["baseline"]["median"] == 3000
    later = oa.km(engine, "small", by="group", where="seed != 5").to_dict()
    assert later["groups"]["baseline"]["median"] is None  # 3/8 escaped: never reached


def logrank_k_by_hand(times, events, groups):
    times, events, groups = np.asarray(times, float), np.asarray(events, bool), np.asarray(groups)
    levels = sorted(set(groups))
    k = len(levels)
    o_e, V = np.zeros(k), np.zeros((k, k))
    for t in np.unique(times[events]):
        at = times >= t
        died = (times == t) & events
        n, d = at.sum(), died.sum()
        nj = np.array([(at & (groups == g)).sum() for g in levels], float)
        dj = np.array([(died & (groups == g)).sum() for g in levels], float)
        o_e += dj - d * nj / n
        if n > 1:
            c = d * (n - d) / (n - 1)
            V += c * (np.diag(nj / n) - np.outer(nj, nj) / n**2)
    return float(o_e[:-1] @ np.linalg.solve(V[:-1, :-1], o_e[:-1]))


def test_multigroup_logrank_against_the_k_sample_formula():
    import pandas as pd

    from orchestrator.analysis.survival import logrank

    rng = np.random.default_rng(3)
    rows = []
    for i in range(36):
        g = ["a", "b", "c"][i % 3]
        t = int(rng.choice([400, 800, 1200, 1600, 2000, 3000]))
        ev = int(t < 3000 and rng.random() < (0.9 if g == "c" else 0.5))
        rows.append(
            {
                "trial_id": i,
                "g": g,
                "time": t,
                "event": ev,
                "end": "escape" if ev else "budget",
                "collapse_step": np.nan,
            }
        )
    df = pd.DataFrame(rows)
    res = logrank(df, oa.AnalysisConfig(by="g"))
    assert res.details["kind"] == "multi-group" and res.details["degrees_of_freedom"] == 2
    want = logrank_k_by_hand(df["time"], df["event"].astype(bool), df["g"])
    assert res.test_statistic == pytest.approx(want, rel=1e-8)
