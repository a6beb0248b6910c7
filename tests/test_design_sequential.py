"""The sequential block's validation, the per-look decision, and the procedure's type-I error and
expected seeds by simulation (known truth: equal rates / equal hazards under H0)."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.design.power import (
    EscapeModel,
    fisher_sample_size,
    fisher_sequential,
    hazard_from_median,
    logrank_sequential,
    logrank_z_sims,
)
from orchestrator.design.sequential import (
    FisherData,
    SequentialError,
    SurvivalData,
    contrast_alpha,
    decide_look,
    design_boundaries,
    parse_sequential,
    strata_cells,
    validate_sequential,
)

AXES = {"arm": ["armed_gdn", "gated_deltanet", "mamba2_ref"], "seed": list(range(40))}
BLOCK = {
    "compare": {"by": "arm", "groups": ["armed_gdn", "gated_deltanet"]},
    "test": "fisher",
    "looks": [8, 16, 24, 40],
    "alpha": 0.05,
    "spending": "obrien_fleming",
}


def _with(**kw):
    b = {**BLOCK, **kw}
    return b


def test_valid_block_parses():
    spec = validate_sequential(BLOCK, AXES)
    assert spec.fractions == [0.2, 0.4, 0.6, 1.0]
    assert strata_cells(spec, AXES) == [{}]


@pytest.mark.parametrize(
    "block,axes,match",
    [
        (
            _with(compare={"by": "arm", "groups": ["armed_gdn", "dg_rank"]}),
            AXES,
            r"sequential\.compare\.groups: 'dg_rank' is not a value of axis 'arm'",
        ),
        (
            _with(compare={"by": "cell", "groups": ["a", "b"]}),
            AXES,
            r"sequential\.compare\.by: axis 'cell' is not in the spec's axes",
        ),
        (_with(looks=[8, 16, 16, 40]), AXES, r"sequential\.looks: must be strictly increasing"),
        (
            _with(looks=[8, 16, 24, 48]),
            AXES,
            r"sequential\.looks: last look needs 48 seeds per group but axis 'seed' has 40",
        ),
        (_with(alpha=0.5), AXES, r"sequential\.alpha: must be in \(0, 0\.5\), got 0\.5"),
        (_with(alpha=0.0), AXES, r"sequential\.alpha: must be in \(0, 0\.5\)"),
        (_with(test="ttest"), AXES, r"sequential\.test: "),
        (_with(spending="haybittle"), AXES, r"sequential\.spending: "),
        (_with(looks=[0, 8]), AXES, r"sequential\.looks\.0: "),
        (_with(compare={"by": "arm", "groups": ["armed_gdn"]}), AXES, r"needs exactly 2 groups"),
        (
            BLOCK,
            {**AXES, "K": [4, 8, 16]},
            r"sequential\.strata: axis 'K' varies \(3 values\) but is not a stated stratum",
        ),
        (_with(strata=["L"]), {**AXES, "K": [4, 8]}, r"sequential\.strata: axis 'L' is not in the spec's axes"),
        (_with(strata=["seed"]), AXES, r"sequential\.strata: 'seed' cannot be a stratum"),
        (_with(bogus=1), AXES, r"sequential\.bogus: "),
    ],
)
def test_bad_blocks_are_one_line_errors(block, axes, match):
    with pytest.raises(SequentialError, match=match) as exc:
        validate_sequential(block, axes)
    assert "\n" not in str(exc.value)
    assert exc.value.exit_code == 2


def test_stratified_design_one_contrast_per_stratum_bonferroni():
    axes = {**AXES, "K": [4, 8, 16]}
    spec = validate_sequential(_with(strata=["K"]), axes)
    cells = strata_cells(spec, axes)
    assert cells == [{"K": 4}, {"K": 8}, {"K": 16}]
    assert contrast_alpha(spec, len(cells)) == pytest.approx(0.05 / 3)
    b = design_boundaries(spec, len(cells))
    assert b.cumulative_alpha[-1] == pytest.approx(0.05 / 3)
    assert b.z[-1] > design_boundaries(spec, 1).z[-1]


def test_decide_look_records_and_stops():
    spec = parse_sequential(BLOCK)
    g0, g1 = spec.compare.groups
    # 8/8 vs 0/8: Fisher p = 2/C(16,8) = 1.55e-4, z = 3.78, below the first OBF boundary 4.877
    r1 = decide_look(spec, 1, {g0: FisherData(8, 8), g1: FisherData(8, 0)})
    assert r1.decision == "continue" and r1.seeds_saved == 0
    assert r1.p == pytest.approx(2 / 12870, rel=1e-9)
    assert r1.statistic == pytest.approx(3.7831, abs=1e-3)
    assert r1.boundary == pytest.approx(4.877, abs=1e-3)
    assert r1.nominal_alpha == pytest.approx(2 * 5.4e-7, rel=0.05)
    assert r1.n == {g0: 8, g1: 8}
    r2 = decide_look(spec, 2, {g0: FisherData(16, 15), g1: FisherData(16, 2)}, [r1])
    assert r2.decision == "reject" and r2.statistic > r2.boundary
    assert r2.seeds_saved == (40 - 16) * 2
    with pytest.raises(ValueError, match="already decided at look 2"):
        decide_look(spec, 3, {g0: FisherData(24, 20), g1: FisherData(24, 3)}, [r1, r2])
    with pytest.raises(ValueError, match="needs the record of 1 prior"):
        decide_look(spec, 2, {g0: FisherData(16, 15), g1: FisherData(16, 2)}, [])
    # the reversed effect gives a negative z of the same size
    r2b = decide_look(spec, 2, {g0: FisherData(16, 2), g1: FisherData(16, 15)}, [r1])
    assert r2b.statistic == pytest.approx(-r2.statistic)
    # last look without crossing: accept, nothing saved
    rs = []
    for k, n in [(1, 8), (2, 16), (3, 24), (4, 40)]:
        rs.append(decide_look(spec, k, {g0: FisherData(n, n // 2), g1: FisherData(n, n // 2)}, rs))
    assert [r.decision for r in rs] == ["continue", "continue", "continue", "accept"]
    assert rs[-1].seeds_saved == 0 and rs[-1].alpha_spent == pytest.approx(0.05)


def _run_fisher_sweeps(spec, p0, p1, sweeps, seed):
    """Full sequential procedure through decide_look, one simulated sweep at a time."""
    rng = np.random.default_rng(seed)
    n_max = spec.looks[-1]
    x0 = rng.random((sweeps, n_max)) < p0
    x1 = rng.random((sweeps, n_max)) < p1
    g0, g1 = spec.compare.groups
    rejected = np.zeros(sweeps, bool)
    used = np.zeros(sweeps)
    for s in range(sweeps):
        rec = []
        for k, n in enumerate(spec.looks, start=1):
            r = decide_look(
                spec, k, {g0: FisherData(n, int(x0[s, :n].sum())), g1: FisherData(n, int(x1[s, :n].sum()))}, rec
            )
            rec.append(r)
            if r.stopped:
                rejected[s] = r.decision == "reject"
                used[s] = n
                break
    return rejected, used


@pytest.mark.parametrize("spending", ["obrien_fleming", "pocock"])
def test_fisher_sequential_type_one_error_under_null(spending):
    spec = parse_sequential(_with(spending=spending))
    sweeps = 2500
    rejected, used = _run_fisher_sweeps(spec, 0.5, 0.5, sweeps, seed=1)
    rate = rejected.mean()
    se = np.sqrt(0.05 * 0.95 / sweeps)
    assert rate <= 0.05 + 3 * se, rate
    # the exact enumeration of the same procedure agrees with the simulation
    exact = fisher_sequential(0.5, 0.5, spec.looks, 0.05, spending)
    assert abs(rate - exact.size) < 4 * np.sqrt(exact.size * (1 - exact.size) / sweeps)
    assert exact.size <= 0.05  # conservative: Fisher is discrete
    print(f"fisher {spending} looks {spec.looks}: type-I sim {rate:.4f} (n={sweeps}), exact {exact.size:.4f}")


def test_fisher_sequential_saves_seeds_under_the_papers_alternative():
    # 0.9 vs 0.4 lock-in (armed vs unarmed cells in the papers)
    spec = parse_sequential(BLOCK)
    sweeps = 2000
    rejected, used = _run_fisher_sweeps(spec, 0.9, 0.4, sweeps, seed=2)
    exact = fisher_sequential(0.9, 0.4, spec.looks, 0.05)
    assert abs(used.mean() - exact.expected_n_h1) < 4 * used.std() / np.sqrt(sweeps)
    assert abs(rejected.mean() - exact.power) < 4 * np.sqrt(exact.power * (1 - exact.power) / sweeps) + 1e-3
    # below the fixed design with the same maximum (40 per group) ...
    assert used.mean() < 40
    # ... and the schedule scaled to the fixed design's power uses fewer seeds on average
    fixed = fisher_sample_size(0.9, 0.4, 0.05, 0.8)
    seq = fisher_sequential(0.9, 0.4, [3, 7, 10, 17], 0.05)
    assert seq.power >= 0.8 and seq.expected_n_h1 < fixed.n
    print(
        f"fisher 0.9 vs 0.4 looks {spec.looks}: seeds/group used sim {used.mean():.2f}, exact "
        f"{exact.expected_n_h1:.2f}; power {exact.power:.4f}; fixed n {fixed.n}, "
        f"scaled looks E[n|H1] {seq.expected_n_h1:.2f}"
    )


@pytest.mark.parametrize("median", [600, 2400])
@pytest.mark.parametrize("looks", [[4, 8, 12, 16], [8, 16, 24, 40]])
@pytest.mark.parametrize("spending", ["obrien_fleming", "pocock"])
def test_logrank_sequential_type_one_error_under_null(median, looks, spending):
    h = hazard_from_median(median)
    model = EscapeModel(h, h, budget=3000, eval_every=100)
    sweeps = 20000
    r = logrank_sequential(model, looks, 0.05, spending, sims=sweeps, seed=11)
    se = np.sqrt(0.05 * 0.95 / sweeps)
    assert r.size <= 0.05 + 3 * se, r.size
    print(f"logrank median {median} looks {looks} {spending}: type-I {r.size:.4f} (n={sweeps})")


def test_logrank_vectorised_procedure_equals_decide_look():
    # The simulation engine and the per-look decision on real data take the same decisions.
    spec = parse_sequential(_with(test="logrank", looks=[4, 8, 12, 16]))
    model = EscapeModel(hazard_from_median(600), hazard_from_median(1500), 3000, 100)
    rng = np.random.default_rng(5)
    b0, b1 = model.draw(rng, 60, 16)
    bounds = design_boundaries(spec).z
    g0, g1 = spec.compare.groups
    for s in range(60):
        rec = []
        for k, n in enumerate(spec.looks, start=1):
            data = {}
            for g, b in ((g0, b0), (g1, b1)):
                j = b[s, :n]
                data[g] = SurvivalData(
                    times=list((np.minimum(j, model.n_evals - 1) + 1) * 100.0), events=list(j < model.n_evals)
                )
            r = decide_look(spec, k, data, rec)
            zv = logrank_z_sims(b0[s : s + 1], b1[s : s + 1], n, model.n_evals)[0]
            assert r.statistic == pytest.approx(zv, abs=1e-9)
            assert (abs(zv) >= bounds[k - 1]) == (r.decision == "reject")
            rec.append(r)
            if r.stopped:
                break


def test_logrank_sequential_saves_seeds_under_alternative():
    model = EscapeModel(hazard_from_median(600), hazard_from_median(2400), 3000, 100)
    r = logrank_sequential(model, [4, 8, 12, 16], 0.05, sims=4000, seed=3)
    assert r.expected_n_h1 < 16 and r.power > 0.8
    assert r.expected_n_h0 <= 16
    print(
        f"logrank 600 vs 2400 looks [4,8,12,16]: power {r.power:.3f}, E[n|H1] "
        f"{r.expected_n_h1:.2f}, E[n|H0] {r.expected_n_h0:.2f}"
    )


def test_decide_strata_each_on_its_own():
    from orchestrator.design.sequential import decide_strata

    axes = {**AXES, "K": [4, 8]}
    spec = validate_sequential(_with(strata=["K"]), axes)
    g0, g1 = spec.compare.groups
    # K=4: a decisive difference at look 2; K=8: no difference
    strong = {g0: FisherData(16, 16), g1: FisherData(16, 1)}
    null = {g0: FisherData(16, 8), g1: FisherData(16, 8)}
    look1 = decide_strata(
        spec,
        axes,
        1,
        {(4,): {g0: FisherData(8, 8), g1: FisherData(8, 1)}, (8,): {g0: FisherData(8, 4), g1: FisherData(8, 4)}},
        {},
    )
    assert {k: r.decision for k, r in look1.items()} == {(4,): "continue", (8,): "continue"}
    prior = {k: [r] for k, r in look1.items()}
    look2 = decide_strata(spec, axes, 2, {(4,): strong, (8,): null}, prior)
    assert look2[(4,)].decision == "reject" and look2[(8,)].decision == "continue"
    assert look2[(4,)].stratum == {"K": 4}
    # Bonferroni over the 2 strata: each contrast's boundary is the alpha/2 design's
    assert look2[(4,)].alpha_spent == pytest.approx(spend_at(0.025, 16 / 40))
    prior = {k: prior[k] + [look2[k]] for k in prior}
    look3 = decide_strata(spec, axes, 3, {(8,): {g0: FisherData(24, 12), g1: FisherData(24, 12)}}, prior)
    assert list(look3) == [(8,)]  # the decided stratum runs no more seeds


def spend_at(alpha: float, t: float) -> float:
    from orchestrator.design.boundaries import spend

    return float(2 * spend(t, alpha / 2, "obrien_fleming"))


def test_missing_seeds_use_the_observed_information_fraction():
    spec = parse_sequential(BLOCK)
    g0, g1 = spec.compare.groups
    r1 = decide_look(spec, 1, {g0: FisherData(8, 6), g1: FisherData(8, 3)})
    full = decide_look(spec, 2, {g0: FisherData(16, 12), g1: FisherData(16, 6)}, [r1])
    short = decide_look(spec, 2, {g0: FisherData(16, 12), g1: FisherData(14, 5)}, [r1])
    # 16 vs 14 seeds: information 2·16·14/(30·40) = 0.3733 instead of 0.4 -> less alpha, higher bar
    from orchestrator.design.boundaries import spending_boundaries

    ref = spending_boundaries([0.2, 2 * 16 * 14 / (30 * 40)], 0.05)
    assert short.boundary == pytest.approx(ref.z[1], abs=1e-9)
    assert short.boundary > full.boundary and short.alpha_spent < full.alpha_spent
    assert short.n == {g0: 16, g1: 14}
    with pytest.raises(ValueError, match="plans 16 seeds per group, got 17"):
        decide_look(spec, 2, {g0: FisherData(17, 12), g1: FisherData(16, 5)}, [r1])
    with pytest.raises(ValueError, match="adds no information"):
        decide_look(spec, 2, {g0: FisherData(8, 6), g1: FisherData(8, 3)}, [r1])


def test_format_records_shows_every_look():
    from orchestrator.design.sequential import format_records

    spec = parse_sequential(BLOCK)
    g0, g1 = spec.compare.groups
    r1 = decide_look(spec, 1, {g0: FisherData(8, 7), g1: FisherData(8, 2)})
    r2 = decide_look(spec, 2, {g0: FisherData(16, 15), g1: FisherData(16, 2)}, [r1])
    text = format_records([r1, r2])
    lines = text.splitlines()
    assert len(lines) == 3 and "boundary" in lines[0] and f"n {g0}" in lines[0]
    assert "continue" in lines[1] and "reject" in lines[2] and lines[2].rstrip().endswith("48")
