"""``orchestrator analyze`` and ``orchestrator bench analysis`` through the real entry
point: the JSON shapes scripts rely on, flags over a spec's analysis block, one-line
errors."""

from __future__ import annotations

import json

import pytest
from scipy.stats import fisher_exact

from orchestrator.store.import_jsonl import write_records
from cli_support import run_cli
from orchestrator.store.engine import open_store_engine

GRID = [1] + list(range(200, 2001, 200))
# (variant, lr) -> escape steps of seeds 0..5 (None: stays at chance)
ESCAPES = {
    ("baseline", 0.001): [None, None, None, 1800, None, None],
    ("baseline", 0.003): [1400, None, 2000, None, None, 1000],
    ("ns5", 0.001): [800, 1200, None, 600, 1600, None],
    ("ns5", 0.003): [400, 600, 800, 400, 1000, 1200],
}


def _records():
    out = []
    for (variant, lr), escapes in ESCAPES.items():
        for seed, esc in enumerate(escapes):
            out.append(
                {
                    "params": {"arm": "mlstm", "seed": seed, "lr": lr, "tag.variant": variant, "task.vocab_size": 80},
                    "trace": [{"step": s, "acc": 0.9 if esc and s >= esc else 0.03} for s in GRID],
                }
            )
    return out


@pytest.fixture
def url(db_url):
    engine, _ = open_store_engine(db_url)
    write_records(engine, "cli", _records())
    engine.dispose()
    return db_url


def run_json(capsys, *argv):
    code, out, err = run_cli(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_json_shapes_of_every_analysis(url, capsys):
    base = ("analyze", "cli")
    h = run_json(capsys, *base, "hazard", "--db", url, "--by", "variant", "--formula", "np.log(t) + C(lr) + C(variant)")
    assert set(h) >= {"n_intervals", "n_events", "terms"}
    n_esc = sum(e is not None for v in ESCAPES.values() for e in v)
    assert h["n_events"] == n_esc
    assert [t["term"] for t in h["terms"]][0] == "Intercept"
    for t in h["terms"]:
        assert set(t) == {"term", "coef", "se", "hr", "ci_low", "ci_high", "z", "p"}
    clog = run_json(capsys, *base, "hazard", "--db", url, "--link", "cloglog")
    assert clog["link"] == "cloglog" and clog["formula"] == "event ~ np.log(t)"

    f = run_json(capsys, *base, "fisher", "--db", url, "--by", "variant", "--groups", "ns5,baseline")
    want = fisher_exact([[10, 2], [4, 8]]).pvalue
    assert f["p_value"] == pytest.approx(want)
    assert f["groups"] == {"ns5": {"k": 10, "n": 12, "rate": 10 / 12}, "baseline": {"k": 4, "n": 12, "rate": 4 / 12}}
    for kind in ("permutation", "logrank"):
        d = run_json(capsys, *base, kind, "--db", url, "--by", "variant")
        assert 0 <= d["p_value"] <= 1 and set(d["groups"]) == {"baseline", "ns5"}, kind
        assert "test_statistic" in d
    mc = run_json(capsys, *base, "mcnemar", "--db", url, "--by", "variant", "--pair-on", "seed,lr")
    assert mc["n_pairs"] == 12 and (mc["only_a"], mc["only_b"]) == (0, 6)
    multi = run_json(capsys, *base, "logrank", "--db", url, "--by", "variant,lr")
    assert multi["kind"] == "multi-group" and len(multi["groups"]) == 4
    cells = run_json(capsys, *base, "logrank", "--db", url, "--by", "variant", "--strata", "lr")
    assert [c["cell"] for c in cells["cells"]] == [{"lr": 0.001}, {"lr": 0.003}]
    lock = run_json(capsys, *base, "lockin", "--db", url, "--by", "variant", "--strata", "lr")
    assert [(r["lr"], r["group"], r["k"], r["n"]) for r in lock] == [
        (0.001, "baseline", 1, 6),
        (0.001, "ns5", 4, 6),
        (0.003, "baseline", 3, 6),
        (0.003, "ns5", 6, 6),
    ]
    # --cells is the deprecated spelling of --strata: same result, a note on stderr.
    code, out, err = run_cli(capsys, *base, "lockin", "--db", url, "--by", "variant", "--cells", "lr", "--json")
    assert code == 0 and json.loads(out) == lock and "--cells is deprecated" in err
    code, _, err = run_cli(capsys, *base, "lockin", "--db", url, "--strata", "lr", "--cells", "lr")
    assert code == 2 and "give one of them" in err
    km = run_json(capsys, *base, "km", "--db", url, "--by", "variant", "--where", "lr = 0.003")
    assert km["groups"]["ns5"]["median"] == 600 and km["groups"]["ns5"]["n"] == 6
    code, out, _ = run_cli(capsys, *base, "hazard", "--db", url, "--by", "variant")
    assert code == 0 and "C(variant)[T.ns5]" in out and "run-intervals" in out


def test_spec_analysis_block_with_flags_over_it(url, tmp_path, capsys):
    spec = tmp_path / "cli.yaml"
    spec.write_text("name: cli\narms: [mlstm]\nanalysis:\n  by: variant\n  lockin: 0.95\n  compare: [ns5, baseline]\n")
    d = run_json(capsys, "analyze", spec, "fisher", "--db", url)
    assert d["lockin"] == 0.95 and d["groups"]["ns5"]["k"] == 0  # 0.9 < 0.95: none locked
    d = run_json(capsys, "analyze", spec, "fisher", "--db", url, "--lockin", "0.8")
    assert list(d["groups"]) == ["ns5", "baseline"] and d["groups"]["ns5"]["k"] == 10
    d = run_json(
        capsys,
        "analyze",
        spec,
        "fisher",
        "--db",
        url,
        "--by",
        "lr",
        "--lockin",
        "0.8",
        "--groups",
        "0.003,0.001",
        "--alternative",
        "greater",
    )
    assert d["groups"]["0.003"] == {"k": 9, "n": 12, "rate": 0.75}
    assert d["p_value"] == pytest.approx(fisher_exact([[9, 3], [5, 7]], "greater").pvalue)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: cli\nanalysis:\n  by: variant\n  lockn: 0.9\n")
    code, _, err = run_cli(capsys, "analyze", bad, "lockin", "--db", url)
    assert code == 2 and "analysis: lockn" in err


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["nosuch"], "unknown analysis 'nosuch'"),
        (["fisher", "--by", "colour"], "--by 'colour': no such parameter"),
        (["fisher", "--by", "variant", "--groups", "ns5,ns6"], "no group 'ns6'"),
        (["fisher", "--by", "lr,variant"], "compares two groups, found 4"),
        (["fisher"], "needs --by"),
        (["hazard", "--formula", "np.log(t) + C(colour)"], "--formula"),
        (["lockin", "--metric", "worst"], "metric"),
    ],
)
def test_errors_are_one_line_exit_2(url, capsys, argv, msg):
    code, out, err = run_cli(capsys, "analyze", "cli", *argv, "--db", url)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and msg in err and err.count("\n") == 1, err


def test_bench_analysis_prints_its_figures(capsys, tmp_path):
    keep = tmp_path / "b.db"
    d = run_json(capsys, "bench", "analysis", "--trials", 90, "--evals", 8, "--keep-db", keep)
    assert d["n_trials"] == 90 and d["n_eval_rows"] == 720 and keep.exists()
    assert d["total_s"] == pytest.approx(d["load_s"] + d["expand_s"] + d["fit_s"])
    assert 0 < d["n_events"] <= d["n_intervals"] <= 90 * 7
    code, out, _ = run_cli(capsys, "bench", "analysis", "--trials", 40, "--evals", 4)
    assert code == 0 and "goal < 10 s" in out and "run-intervals" in out


def test_every_analysis_says_the_rule_it_read(url, capsys):
    # Which threshold? The output says: lock-in's (and its metric) at the budget, the escape
    # threshold and what censors for escape times, the horizon when there is one.
    code, out, _ = run_cli(capsys, "analyze", "cli", "lockin", "--by", "variant", "--db", url, "--lockin", "0.9")
    assert code == 0 and out.splitlines()[0] == "lock-in: final eval accuracy >= 0.9"
    code, out, _ = run_cli(capsys, "analyze", "cli", "km", "--by", "variant", "--db", url, "--horizon", "1600")
    assert code == 0
    assert (
        "escape: the first eval after the first with accuracy >= 0.8 (a collapse below 0.005 to the end censors); traces cut at step 1600"
        in out
    )
