"""The published-table sweeps (``sweeps/*.yaml``): every file validates through the CLI, the
trial counts the papers state or imply are pinned (each with its derivation), the designs
carry the papers' structure, and ``orchestrator report sweeps/basin_map.yaml`` prints the
basin map's table layout from traces shaped like its design. No training here."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from conftest import fate_trace
from orchestrator import spec as specs
from orchestrator.store.import_jsonl import write_records
from orchestrator.cli import main
from orchestrator.store.engine import open_store_engine

SWEEPS = Path(__file__).resolve().parents[1] / "sweeps"

# Trial counts, each derived from the paper's text (seed 001 = matched-state decomposition,
# 003 = orthogonalized-read scaffold, 002 = recall scaling laws).
COUNTS = {
    # 001 Tables 1-2: 8 arms x K {8,16,32} x seeds 0-2; the paper's "72/72 trials".
    "factorial": 72,
    # 001 Table 1: 5 arms x 10 seeds + the decay pair (deltanet, gated_deltanet) x 20.
    "factorial_k32_hardened": 5 * 10 + 2 * 20,
    # 001 Table 3: 7 arms (3 conv-free, mamba2_ds16, 3 armed) x K {16,32} x 10 seeds.
    "transition_hardened": 7 * 2 * 10,
    # 001 sec. 4.2: 2 no-conv arms x 3 lrs x 5 seeds + 3 armed arms x 3 lrs x 5 seeds.
    "lr_sensitivity": 2 * 3 * 5 + 3 * 3 * 5,
    # 001 Table 4: 4 arms x L {64,128,256,512} x 5 seeds.
    "haystack_wall": 4 * 4 * 5,
    # 001 Table 5: 3 bidirectional recipes x 10 + causal x 10 + attention 5 (absolute) + 10.
    "curriculum": 3 * 10 + 10 + 5 + 10,
    # 001 Table 6: 3 rows x {uniform, ramp} x 10 seeds + rotary attention on the ramp x 10.
    "collision": 3 * 2 * 10 + 10,
    # 001 sec. 6 (ii): L=256 ramp 5 + uniform 9 (5 + 4 pooled); L=512 2 directions x
    # {ramp, gated} x 3 seeds.
    "length_boundary": 5 + 9 + 2 * 2 * 3,
    # 001 Table 7: 2 arms x depth {2,4,8,16} x 10 seeds, plus its caption's RWKV-7 pair
    # (armed_dg_rank vs dg_rank) x depth {8, 16} x 10 seeds.
    "s5_guardrail": 80 + 2 * 2 * 10,
    # 003 sec. 7: 3 lrs x 3 vocabs x {baseline, ns5} x 8 seeds ("a 144-run grid").
    "basin_map": 144,
    # 003 sec. 8: batch {4..64} x 3 lrs x 8 seeds (the 120 baseline runs of the escape law),
    # the ns5 arm at batch 4 / 8 / 16 (8 + 8 + 16 seeds) and the v96 batch-64 reconciliation
    # arm ({baseline, ns5} x 8 seeds).
    "batch_lr": 120 + (8 + 8 + 16) + 2 * 8,
    # 003 sec. 8: {ns5, baseline} x (batch 4: 8 + batch 8: 8 + batch 16: 16 seeds).
    "batch_ns5": 2 * (8 + 8 + 16),
    # 003 sec. 4: {cos2000, cos4000, constant} x {baseline, ns5} x 16 seeds.
    "schedule_confound": 3 * 2 * 16,
    # 003 Table 1: 12 variants x 16 seeds.
    "elimination": 12 * 16,
    # 003 sec. 6: ns5 x anneal {none, time, escape} x 16 seeds.
    "scaffold_anneal": 3 * 16,
    # 002: 2 tasks x 3 V x 3 Nf x 5 D x 5 N x 3 seeds + 3 layer counts x 25 x 3
    # + 4 head patterns x 16 x 3.
    "recall_scaling": 2 * 3 * 3 * 25 * 3 + 3 * 25 * 3 + 4 * 16 * 3,
}
TABLE_FILES = sorted(f"{n}.yaml" for n in COUNTS)


def permutation_logrank_p(ta, ea, tb, eb) -> float:
    """Two-sided p of the log-rank with the permutation variance, written out: the pooled
    Nelson-Aalen scores a_i = event_i - Lambda(t_i), z = sum of group a's scores over the
    square root of their variance over relabellings, n_a n_b / (N (N - 1)) sum a_i^2."""
    from scipy.stats import norm

    t = np.asarray(list(ta) + list(tb), float)
    d = np.asarray(list(ea) + list(eb), bool)
    lam = {u: sum(((t == v) & d).sum() / (t >= v).sum() for v in np.unique(t) if v <= u) for u in np.unique(t)}
    a = d - np.array([lam[u] for u in t])
    na, nb = len(ta), len(tb)
    n = na + nb
    z = a[:na].sum() / math.sqrt(na * nb / (n * (n - 1)) * (a**2).sum())
    return float(2 * norm.sf(abs(z)))


def _cli(capsys, *argv) -> str:
    code = main([str(a) for a in argv])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    return cap.out


def _load(name: str) -> specs.Sweep:
    return specs.load(SWEEPS / f"{name}.yaml")


def _count(sweep: specs.Sweep, **match) -> int:
    return sum(all(p.get(k) == v for k, v in match.items()) for _, p in sweep.trials)


def test_every_published_table_has_its_sweep_file():
    present = {p.name for p in SWEEPS.glob("*.yaml")}
    assert set(TABLE_FILES) <= present, sorted(set(TABLE_FILES) - present)


@pytest.mark.parametrize("name", sorted(p.name for p in SWEEPS.glob("*.yaml")))
def test_every_sweep_validates_through_the_cli(name, capsys):
    out = _cli(capsys, "submit", SWEEPS / name, "--dry-run", "--json")
    d = json.loads(out)
    assert d["trials"] >= 1 and isinstance(d["axes"], dict)
    stem = name.removesuffix(".yaml")
    if stem in COUNTS:
        assert d["trials"] == COUNTS[stem], (name, d["trials"])


@pytest.mark.parametrize("name", TABLE_FILES)
def test_table_sweeps_say_what_they_reproduce_and_carry_an_analysis(name):
    text = (SWEEPS / name).read_text()
    head = text.split("\nname:", 1)[0]
    assert head.startswith("# Seed 00"), name  # which paper and table, first
    assert "silent" in head, name  # the choices made where the paper was silent
    sweep = specs.load(SWEEPS / name)
    assert sweep.name == name.removesuffix(".yaml")
    assert sweep.spec.analysis, name


def test_factorial_designs():
    f = _load("factorial")
    assert Counter(p["arm"] for _, p in f.trials) == {
        a: 9
        for a in (
            "armed_gdn",
            "gated_deltanet",
            "deltanet",
            "dg_rank",
            "dg_diag",
            "mamba2_ref",
            "mamba2_ref_noconv",
            "attention",
        )
    }
    assert {(p["d_model"], p["n_layers"]) for _, p in f.trials} == {(32, 1)}
    assert all(p["model.d_state"] == 16 for _, p in f.trials if p["arm"].startswith("mamba2"))
    h = _load("factorial_k32_hardened")
    per_arm = Counter(p["arm"] for _, p in h.trials)
    assert per_arm["deltanet"] == per_arm["gated_deltanet"] == 20
    assert {per_arm[a] for a in per_arm if a not in ("deltanet", "gated_deltanet")} == {10}
    assert all(p["rebinding"] and p["task.K"] == 32 for _, p in h.trials)
    t = _load("transition_hardened")
    assert {(p["arm"], p["task.K"]) for _, p in t.trials} >= {("armed_dg_diag", 16), ("mamba2_ref", 32)}
    assert all(_count(t, arm=a, **{"task.K": k}) == 10 for a, k in {(p["arm"], p["task.K"]) for _, p in t.trials})
    lr = _load("lr_sensitivity")
    assert {p["lr"] for _, p in lr.trials if p["arm"] == "gated_deltanet"} == {3e-4, 1e-3, 3e-3}
    assert {p["lr"] for _, p in lr.trials if p["arm"] == "armed_gdn"} == {1e-3, 3e-3, 1e-2}


def test_haystack_curriculum_collision_length_designs():
    w = _load("haystack_wall")
    short = [p for _, p in w.trials if p["task.L"] <= 256]
    # The paper's 5-seed table: "all 45 recurrent trials" and attention "15/15 trials".
    assert sum(p["arm"] != "attention" for p in short) == 45
    assert sum(p["arm"] == "attention" for p in short) == 15
    assert {(p["n_layers"], p["model.heads"]) for _, p in w.trials} == {(2, 2)}
    c = _load("curriculum")
    rows = Counter(p["tag.row"] for _, p in c.trials)
    assert rows == {
        "bidir_dense": 10,
        "bidir_curriculum": 10,
        "bidir_dense_curriculum": 10,
        "causal_dense_curriculum": 10,
        "attention_absolute": 5,
        "attention_rotary": 10,
    }
    assert all(p["task.L"] == 64 and p["batch_size"] == 256 and p["steps"] == 3000 for _, p in c.trials)
    assert {(p["task.dense"], p["task.curriculum"]) for _, p in c.trials if p["tag.row"] == "bidir_curriculum"} == {
        (1, "uniform")
    }
    col = _load("collision")
    assert _count(col, **{"tag.row": "noconv", "task.curriculum": "ramp"}) == 10
    assert _count(col, **{"tag.row": "attention_rotary", "task.curriculum": "ramp"}) == 10
    lb = _load("length_boundary")
    # L = 256: 0/9 pooled uniform trials vs a ramp at 5 seeds; L = 512: 6 vs 6.
    assert _count(lb, **{"task.L": 256, "task.curriculum": "uniform"}) == 9
    assert _count(lb, **{"task.L": 256, "task.curriculum": "ramp"}) == 5
    assert _count(lb, **{"task.L": 512, "task.curriculum": "ramp"}) == 6
    assert _count(lb, **{"task.L": 512, "task.curriculum": "gated"}) == 6
    s5 = _load("s5_guardrail")
    assert {p["d_model"] for _, p in s5.trials} == {128}
    assert {p["task.depth"] for _, p in s5.trials} == {2, 4, 8, 16}


def test_scaffold_study_designs():
    b = _load("basin_map")
    assert all(
        p["schedule"] == "constant"
        and p["steps"] == 3000
        and p["batch_size"] == 16
        and p["eval_every"] == 200
        and p["task.seq_len"] == 768
        for _, p in b.trials
    )
    assert {(p["model.read"], p["tag.variant"]) for _, p in b.trials} == {("raw", "baseline"), ("ns5", "ns5")}
    assert all(
        _count(b, lr=lr, **{"task.vocab_size": v, "tag.variant": g}) == 8
        for lr in (1e-3, 3e-3, 1e-2)
        for v in (80, 88, 96)
        for g in ("baseline", "ns5")
    )
    bl = _load("batch_lr")
    budget = {4: 6000, 8: 4000, 16: 3000, 32: 2000, 64: 2000}
    grid = {"tag.part": "grid"}
    assert {(p["batch_size"], p["steps"]) for _, p in bl.trials if p["tag.part"] == "grid"} == set(budget.items())
    assert all(_count(bl, batch_size=bs, lr=lr, **grid) == 8 for bs in budget for lr in (1e-3, 3e-3, 1e-2))
    bn = _load("batch_ns5")
    assert Counter((p["tag.variant"], p["batch_size"]) for _, p in bn.trials) == {
        ("ns5", 4): 8,
        ("ns5", 8): 8,
        ("ns5", 16): 16,
        ("baseline", 4): 8,
        ("baseline", 8): 8,
        ("baseline", 16): 16,
    }
    sc = _load("schedule_confound")
    scheds = {(p["tag.sched"], p["schedule"], p["cosine_steps"], p["steps"]) for _, p in sc.trials}
    assert scheds == {
        ("cos2000", "cosine", 2000, 2000),
        ("cos4000", "cosine", 4000, 4000),
        ("constant", "constant", None, 2000),
    }
    el = _load("elimination")
    variants = Counter(p["tag.variant"] for _, p in el.trials)
    assert set(variants.values()) == {16} and len(variants) == 12
    assert {p["model.write"] for _, p in el.trials if p["tag.variant"] == "delta"} == {"delta"}
    an = _load("scaffold_anneal")
    assert Counter(p["anneal"] for _, p in an.trials) == {"none": 16, "time": 16, "escape": 16}
    assert {p["anneal_frac"] for _, p in an.trials} == {0.3}


def test_recall_scaling_design():
    r = _load("recall_scaling")
    grid = [p for _, p in r.trials if not p["model.norm"] and p["model.heads"] == 1]
    assert len(grid) == 1350 and {p["n_layers"] for p in grid} == {1}
    # The context holds the facts and their queries: L = 4 Nf, the paper's setting.
    assert all(p["task.seq_len"] == 4 * p["task.n_facts"] for _, p in r.trials)
    nd = sorted({p["d_model"] * p["model.d_state"] for p in grid})
    assert nd[0] == 64 and nd[-1] == 16384
    assert {p["n_layers"] for _, p in r.trials if p["model.norm"]} == {1, 2, 4}
    assert {p["model.pattern"] for _, p in r.trials if p["model.heads"] == 4} == {"mha", "mva", "mqa", "mka"}
    assert {p["arm"] for _, p in r.trials} == {"linear_mamba"}


# ---- report of the basin map ------------------------------------------------------------

EVAL_STEPS = [1] + list(range(200, 3001, 200))


def _fate(params: dict) -> tuple[str, int | None, int | None]:
    """(outcome, escape step, collapse step) of one simulated basin-map trial: a corridor
    that narrows with vocabulary, ns5 wider, baseline dying at lr 1e-2."""
    seed, lr, vocab = params["seed"], params["lr"], params["task.vocab_size"]
    ns5 = params["tag.variant"] == "ns5"
    hard = (80, 88, 96).index(vocab)
    if not ns5 and lr == 1e-2:
        return ("dead", None, 800 + 200 * seed) if seed < 5 else ("flat", None, None)
    solvers = {1e-3: 4, 3e-3: 6, 1e-2: 3}[lr] - 2 * hard + (3 if ns5 else 0)
    if seed < solvers:
        return "solved", 400 + 200 * seed + 200 * hard + (0 if ns5 else 800), None
    return ("mid", None, None) if seed == 7 else ("flat", None, None)


def _trace(fate) -> list[dict]:
    return fate_trace(fate, EVAL_STEPS, solved=0.98, mid=0.55, chance=0.013, collapsed=0.001, loss_drop=3.5)


def test_report_prints_the_basin_map_table_layout(tmp_path, capsys):
    sweep = _load("basin_map")
    db = f"sqlite:///{tmp_path / 'basin.db'}"
    engine, _ = open_store_engine(db)
    records = [{"params": p, "trace": _trace(_fate(p))} for _, p in sweep.trials]
    write_records(engine, "basin_map", records)
    out_dir = tmp_path / "report"
    text = _cli(capsys, "report", SWEEPS / "basin_map.yaml", "--db", db, "--out", out_dir)
    lines = text.splitlines()
    assert lines[0].startswith("sweep basin_map: 144 trials")
    # A: rows vocab x variant, columns lr, solved/mid/flat/dead (n) @KM median escape.
    a = lines.index("A. outcomes per stratum: solved/mid/flat/dead (n) @KM median escape step")
    assert lines[a + 1].split() == ["lr=0.001", "lr=0.003", "lr=0.01"]
    assert lines[a + 2].split() == ["vocab_size", "group"]
    trials = [p for _, p in sweep.trials]
    for i, (vocab, variant) in enumerate((v, g) for v in (80, 88, 96) for g in ("baseline", "ns5")):
        want = []
        for lr in (1e-3, 3e-3, 1e-2):
            fates = [
                _fate(p)
                for p in trials
                if p["lr"] == lr and p["task.vocab_size"] == vocab and p["tag.variant"] == variant
            ]
            counts = [sum(f[0] == o for f in fates) for o in ("solved", "mid", "flat", "dead")]
            # The Kaplan-Meier median (lifelines; collapse and the budget censor): the first
            # step where the curve is at or below one half.
            from lifelines import KaplanMeierFitter

            kmf = KaplanMeierFitter().fit(
                [f[1] or f[2] or EVAL_STEPS[-1] for f in fates], [f[1] is not None for f in fates]
            )
            sf = kmf.survival_function_.iloc[:, 0]
            hit = sf.index[sf.to_numpy() <= 0.5 + 1e-9]
            med = f"{hit[0]:g}" if len(hit) else "-"
            want += ["/".join(map(str, counts)), f"({len(fates)})", f"@{med}"]
        assert lines[a + 3 + i].split()[-9:] == want, (vocab, variant, lines[a + 3 + i])
    # B: log-rank ns5 vs baseline pooled and in each of the nine cells.
    b = lines.index("B. log-rank on escape times by variant (collapse censors)")
    assert lines[b + 1].startswith("  pooled: baseline ")
    cells = [ln.split(":")[0].strip() for ln in lines[b + 2 : b + 11]]
    assert cells == [f"vocab_size={v} lr={lr:g}" for v in (80, 88, 96) for lr in (1e-3, 3e-3, 1e-2)]
    # Cell v88, lr 1e-3: the independent log-rank of the two groups' escape times.
    from lifelines.statistics import logrank_test

    def durations(variant):
        fs = [
            _fate(p) for p in trials if p["lr"] == 1e-3 and p["task.vocab_size"] == 88 and p["tag.variant"] == variant
        ]
        return ([f[1] or f[2] or EVAL_STEPS[-1] for f in fs], [int(f[1] is not None) for f in fs])

    (ta, ea), (tb, eb) = durations("baseline"), durations("ns5")
    # 8 vs 8 seeds: the report's log-rank uses the permutation variance (--logrank auto) and
    # says so; lifelines' textbook variance is what --logrank hypergeometric gives.
    want_p = permutation_logrank_p(ta, ea, tb, eb)
    assert want_p != pytest.approx(logrank_test(ta, tb, ea, eb).p_value, rel=1e-3)
    line = next(ln for ln in lines if ln.startswith("  vocab_size=88 lr=0.001:"))
    assert f"raw p = {want_p:.4g}" in line and "(permutation variance)" in line
    # C: the hazard fit with the paper's formula and the ns5 term.
    assert "C. discrete-time hazard fit (" in text
    assert "event ~ np.log(t) + C(lr) + C(vocab_size) + C(variant)" in text
    assert any(ln.strip().startswith("C(variant)[T.ns5]") for ln in lines)
    assert any(ln.strip().startswith("C(vocab_size)[T.96]") for ln in lines)
    # D and E, the figures (the basin heatmap faceted by variant), and --json agrees.
    assert "D. lock-in (final acc >= 0.8)" in text
    assert "E. final accuracy: mean [min, max]" in text
    for name in ("index.html", "basin.png", "km.png", "hazard.png"):
        assert (out_dir / name).stat().st_size > 1000
    d = json.loads(_cli(capsys, "report", SWEEPS / "basin_map.yaml", "--db", db, "--out", tmp_path / "r2", "--json"))
    assert d["heatmap"] == {"x": "lr", "y": "vocab_size", "facet": "variant"}
    assert d["hazard"]["n_trials"] == 144
    n_esc = sum(_fate(p)[1] is not None for p in trials)
    assert d["hazard"]["n_events"] == n_esc
    outcomes = {(r["vocab_size"], r["lr"], r["group"]): r for r in d["outcomes"]}
    assert outcomes[(96, 0.01, "baseline")]["dead"] == 5


# ---- contrasts, horizon and the rebinding column on other tables' layouts -----------------


def test_report_contrasts_and_horizon_on_the_schedule_confound(tmp_path, capsys):
    """Schedule confound, simulated: the cos4000 arm escapes by step 2,000 on more seeds.
    The report cuts traces at step 2,000 (the spec's horizon) and its contrasts match
    scipy, and the permutation log-rank written out here, computed from the simulated outcomes."""
    from scipy.stats import binomtest, fisher_exact

    sweep = _load("schedule_confound")
    steps_of = {"cos2000": 2000, "cos4000": 4000, "constant": 2000}

    def escape(p):
        s, sched, ns5 = p["seed"], p["tag.sched"], p["tag.variant"] == "ns5"
        first = {"cos2000": 1400, "cos4000": 600, "constant": 1000}[sched] - (200 if ns5 else 0)
        step = first + 200 * s
        return step if step <= steps_of[sched] else None

    records = []
    for _, p in sweep.trials:
        esc = escape(p)
        grid = [1] + list(range(200, steps_of[p["tag.sched"]] + 1, 200))
        records.append(
            {"params": p, "trace": [{"step": s, "acc": 0.99 if esc is not None and s >= esc else 0.02} for s in grid]}
        )
    db = f"sqlite:///{tmp_path / 'sched.db'}"
    write_records(open_store_engine(db)[0], "schedule_confound", records)
    d = json.loads(
        _cli(capsys, "report", SWEEPS / "schedule_confound.yaml", "--db", db, "--out", tmp_path / "rep", "--json")
    )
    assert d["config"]["horizon"] == 2000
    by_pair = {(c["a"], c["b"]): c for c in d["contrasts"]}
    c = by_pair[("baseline/cos4000", "baseline/cos2000")]

    def solved(sched, variant, horizon=2000):
        return {
            p["seed"]: (escape(p) is not None and escape(p) <= horizon)
            for _, p in sweep.trials
            if p["tag.sched"] == sched and p["tag.variant"] == variant
        }

    a_, b_ = solved("cos4000", "baseline"), solved("cos2000", "baseline")
    ka, kb = sum(a_.values()), sum(b_.values())
    assert (c["fisher"]["groups"]["baseline/cos4000"]["k"], c["fisher"]["groups"]["baseline/cos2000"]["k"]) == (ka, kb)
    assert math.isclose(c["fisher"]["p_two_sided"], fisher_exact([[ka, 16 - ka], [kb, 16 - kb]]).pvalue, rel_tol=1e-9)
    only_a = sum(a_[s] and not b_[s] for s in a_)
    only_b = sum(b_[s] and not a_[s] for s in a_)
    assert c["mcnemar"]["only_a"] == only_a and c["mcnemar"]["only_b"] == only_b
    assert math.isclose(c["mcnemar"]["p_value"], binomtest(only_a, only_a + only_b, 0.5).pvalue, rel_tol=1e-9)

    def times(sched, variant):
        out = []
        for _, p in sweep.trials:
            if p["tag.sched"] == sched and p["tag.variant"] == variant:
                e = escape(p)
                out.append((e, 1) if e is not None and e <= 2000 else (2000, 0))
        return [t for t, _ in out], [e for _, e in out]

    (t1, e1), (t2, e2) = times("cos2000", "ns5"), times("constant", "baseline")
    assert math.isclose(
        by_pair[("ns5/cos2000", "baseline/constant")]["logrank"]["p_value"],
        permutation_logrank_p(t1, e1, t2, e2),
        rel_tol=1e-9,
    )
    # Without the cut, the cos4000 arm's later escapes count (13/16 -> more solved).
    d4 = json.loads(
        _cli(
            capsys,
            "report",
            SWEEPS / "schedule_confound.yaml",
            "--db",
            db,
            "--out",
            tmp_path / "rep4",
            "--horizon",
            "4000",
            "--json",
        )
    )
    c4 = {(c["a"], c["b"]): c for c in d4["contrasts"]}[("baseline/cos4000", "baseline/cos2000")]
    k4 = sum(solved("cos4000", "baseline", 4000).values())
    assert k4 > ka and c4["fisher"]["groups"]["baseline/cos4000"]["k"] == k4
    text = _cli(capsys, "report", SWEEPS / "schedule_confound.yaml", "--db", db, "--out", tmp_path / "rep5")
    assert "traces cut at step 2000" in text.splitlines()[0]
    assert any(
        ln.startswith("  baseline/cos4000 vs baseline/cos2000: mean ") and "McNemar p = " in ln
        for ln in text.splitlines()
    )


def test_report_accuracy_table_shows_the_rebinding_control(tmp_path, capsys):
    """Table 1 of seed 001 in its hardened form: mean [min, max] per arm and the rebound
    accuracy read from the eval rows' metrics; the permutation p of a contrast is scipy's."""
    from scipy.stats import permutation_test

    sweep = _load("factorial_k32_hardened")
    rng = np.random.default_rng(7)
    level = {
        "armed_gdn": 0.98,
        "dg_rank": 0.65,
        "dg_diag": 0.39,
        "mamba2_ref": 0.59,
        "mamba2_ref_noconv": 0.15,
        "deltanet": 0.56,
        "gated_deltanet": 0.52,
    }
    finals, records = {}, []
    for _, p in sweep.trials:
        final = float(np.clip(level[p["arm"]] + rng.normal(0, 0.05), 0, 1))
        finals[(p["arm"], p["seed"])] = final
        rb = 0.03 + 0.001 * p["seed"]
        trace = [{"step": s, "acc": final * min(1.0, s / 3000), "rebind_acc": rb} for s in (1, 1000, 2000, 3000)]
        records.append({"params": p, "trace": trace})
    db = f"sqlite:///{tmp_path / 'k32.db'}"
    write_records(open_store_engine(db)[0], "factorial_k32_hardened", records)
    text = _cli(capsys, "report", SWEEPS / "factorial_k32_hardened.yaml", "--db", db, "--out", tmp_path / "rep")
    lines = text.splitlines()
    e = lines.index("E. final accuracy: mean [min, max] rb mean rebinding-control accuracy")
    row = next(ln for ln in lines[e:] if ln.strip().startswith("deltanet "))
    vals = [finals[("deltanet", s)] for s in range(20)]
    rb = np.mean([0.03 + 0.001 * s for s in range(20)])
    assert f"{np.mean(vals):.3f} [{min(vals):.3f}, {max(vals):.3f}] rb {rb:.3f}" in row, row
    d = json.loads(
        _cli(capsys, "report", SWEEPS / "factorial_k32_hardened.yaml", "--db", db, "--out", tmp_path / "rep2", "--json")
    )
    c = next(c for c in d["contrasts"] if (c["a"], c["b"]) == ("dg_rank", "dg_diag"))
    xa = [finals[("dg_rank", s)] for s in range(10)]
    xb = [finals[("dg_diag", s)] for s in range(10)]
    want = permutation_test(
        (xa, xb),
        lambda x, y, axis: np.mean(x, axis=axis) - np.mean(y, axis=axis),
        vectorized=True,
        n_resamples=100_000,
        rng=np.random.default_rng(0),
    ).pvalue
    assert math.isclose(c["permutation"]["p_value"], want, rel_tol=1e-9)
    assert c["mcnemar"] is not None  # both arms hold seeds 0-9 once each
    assert next(x for x in d["contrasts"] if x["b"] == "gated_deltanet" and x["a"] == "deltanet")["mcnemar"] is not None
