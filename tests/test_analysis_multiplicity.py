"""Multiplicity (``--adjust``): the adjusting module against statsmodels and against Holm and
Benjamini-Hochberg worked by hand; ``orchestrator analyze logrank --strata`` and the report's
tables B and F on a real SQLite sweep, adjusted by default and saying so, raw beside; a bad
method is a one-line error."""

from __future__ import annotations

import gc
import json
import math
import re

import numpy as np
import pytest
from statsmodels.stats.multitest import multipletests
from test_analysis_cli import _records

from orchestrator import analysis as oa
from orchestrator.analysis import multiplicity
from orchestrator.analysis.report import build_report
from cli_support import run_cli
from orchestrator.store.engine import open_store_engine
from orchestrator.store.import_jsonl import write_records

STATSMODELS = {"holm": "holm", "bh": "fdr_bh", "bonferroni": "bonferroni"}


@pytest.mark.parametrize("method", ["holm", "bh", "bonferroni"])
def test_adjust_matches_statsmodels_with_nones_left_out(method):
    rng = np.random.default_rng(29)
    # statsmodels' holm branch runs gc.collect() on every call: with the suite's heap frozen
    # that walks only what this test makes (0.2 s a call otherwise, 50 calls).
    gc.freeze()
    try:
        _compare_with_statsmodels(rng, method)
    finally:
        gc.unfreeze()


def _compare_with_statsmodels(rng: np.random.Generator, method: str) -> None:
    for _ in range(50):
        n = int(rng.integers(1, 15))
        ps: list[float | None] = [float(p) for p in rng.uniform(0, 1, n) ** 3]
        for i in rng.choice(n, size=int(rng.integers(0, n)), replace=False):
            ps[i] = None
        got = multiplicity.adjust(ps, method)
        present = [p for p in ps if p is not None]
        want = iter(multipletests(present, method=STATSMODELS[method])[1] if present else [])
        assert [g is None for g in got] == [p is None for p in ps]
        for g, p in zip(got, ps):
            if p is not None:
                assert g == pytest.approx(next(want), abs=1e-15)
        assert all(g is None or p <= g <= 1 for g, p in zip(got, ps))  # never below raw


def test_holm_and_bh_by_hand():
    # Four p-values (and an untestable stratum), sorted 0.01 < 0.02 < 0.03 < 0.2, m = 4.
    ps = [0.03, None, 0.01, 0.2, 0.02]
    # Holm: step-down max of (m - i + 1) p_(i): 4*0.01, 3*0.02, 2*0.03, 1*0.2 -> 0.04, 0.06, 0.06, 0.2.
    assert multiplicity.adjust(ps, "holm") == pytest.approx([0.06, None, 0.04, 0.2, 0.06])
    # BH: step-up min of m/i p_(i): 0.04, 0.04, 0.04, 0.2 (4/3*0.03 = 0.04 caps the first two).
    assert multiplicity.adjust(ps, "bh") == pytest.approx([0.04, None, 0.04, 0.2, 0.04])
    assert multiplicity.adjust(ps, "bonferroni") == pytest.approx([0.12, None, 0.04, 0.8, 0.08])
    assert multiplicity.adjust(ps, "none") == pytest.approx([0.03, None, 0.01, 0.2, 0.02])
    # A family of one is left as it is, whatever the method.
    assert multiplicity.adjust([0.01, None], "holm") == [0.01, None]
    assert multiplicity.adjust([None, float("nan")], "bh") == [None, None]
    with pytest.raises(ValueError, match="expected one of holm, bh, bonferroni, none"):
        multiplicity.adjust([0.1], "sidak")


@pytest.fixture
def url(tmp_path):
    """The two-variant x two-lr sweep of test_analysis_cli, in a real SQLite file."""
    db = f"sqlite:///{tmp_path / 'mult.db'}"
    engine, _ = open_store_engine(db)
    write_records(engine, "cli", _records())
    engine.dispose()
    return db


def test_analyze_strata_prints_adjusted_and_raw(url, capsys):
    base = ("analyze", "cli", "logrank", "--db", url, "--by", "variant", "--strata", "lr")
    code, out, err = run_cli(capsys, *base, "--json")
    assert code == 0, err
    d = json.loads(out)
    raw = [c["p_value"] for c in d["cells"]]
    assert len(raw) == 2 and all(0 < p < 1 for p in raw)
    assert d["adjust"] == {"method": "holm", "family": "the per-stratum log-rank tests"}  # the default
    want = multipletests(raw, method="holm")[1]
    assert [c["p_adjusted"] for c in d["cells"]] == pytest.approx(list(want))
    assert [c["adjust"] for c in d["cells"]] == ["holm", "holm"]
    # The raw p-values are the stratum's own log-rank, as `--where` on one stratum gives it.
    alone = run_cli(
        capsys, "analyze", "cli", "logrank", "--db", url, "--by", "variant", "--where", "lr = 0.003", "--json"
    )
    assert json.loads(alone[1])["p_value"] == pytest.approx(raw[1])

    code, out, err = run_cli(capsys, *base, "--adjust", "holm")
    assert code == 0, err
    lines = out.splitlines()
    assert "p-values adjusted within the per-stratum log-rank tests: holm (raw p in parentheses)" in lines
    for stratum, p, q in zip(("lr=0.001", "lr=0.003"), raw, want):
        line = next(ln for ln in lines if ln.startswith(stratum + ":"))
        assert f"p = {q:.4g} (raw p = {p:.4g})" in line, line
    assert not math.isclose(want[1], raw[1])  # the smaller p really moved (Holm doubles it)

    code, out, _ = run_cli(capsys, *base, "--adjust", "bh", "--json")
    assert [c["p_adjusted"] for c in json.loads(out)["cells"]] == pytest.approx(
        list(multipletests(raw, method="fdr_bh")[1])
    )
    code, out, _ = run_cli(capsys, *base, "--adjust", "none")
    assert "not adjusted for multiplicity (--adjust none)" in out and "raw p" not in out
    assert f"lr=0.003: p = {raw[1]:.4g}," in out


@pytest.mark.parametrize("command", [("analyze", "cli", "logrank"), ("report", "cli")])
def test_bad_adjust_is_a_one_line_error(url, capsys, command):
    code, out, err = run_cli(capsys, *command, "--db", url, "--by", "variant", "--adjust", "foo")
    assert code == 2 and out == ""
    assert err.startswith("error: ") and "adjust" in err and "'holm', 'bh', 'bonferroni' or 'none'" in err
    assert err.count("\n") == 1, err


def _contrast_ps(contrasts):
    return [e[t]["p_value"] for e in contrasts for t in multiplicity.CONTRAST_TESTS if e[t] is not None]


def test_report_adjusts_each_table_by_default_and_says_so(url, tmp_path, capsys):
    opts = ("--by", "variant", "--strata", "lr", "--contrasts", "ns5,baseline")
    code, out, err = run_cli(capsys, "report", "cli", "--db", url, "--out", tmp_path / "r", *opts, "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["config"]["adjust"] == "holm" and d["adjust"]["method"] == "holm"
    tests = [e[t] for e in d["contrasts"] for t in multiplicity.CONTRAST_TESTS if e[t] is not None]
    # 2 strata x (Fisher, permutation, log-rank, McNemar: the groups share seeds 0-5).
    assert len(tests) == 8
    want = multipletests([t["p_value"] for t in tests], method="holm")[1]
    assert [t["p_adjusted"] for t in tests] == pytest.approx(list(want))
    # Table B's strata are their own family, the pooled test is not adjusted.
    cells = d["logrank_cells"]
    assert [c["p_adjusted"] for c in cells] == pytest.approx(
        list(multipletests([c["p_value"] for c in cells], method="holm")[1])
    )
    assert "p_adjusted" not in d["logrank"]

    code, text, err = run_cli(capsys, "report", "cli", "--db", url, "--out", tmp_path / "r2", *opts)
    assert code == 0, err
    lines = text.splitlines()
    f = lines.index("F. contrasts (final acc; permutation two-sided, lock-in >= 0.8)")
    assert lines[f + 1] == (
        "  p-values adjusted within this table (every contrast x stratum x test): holm (raw p in parentheses)"
    )
    line = next(ln for ln in lines[f:] if ln.startswith("  ns5 vs baseline at lr=0.003:"))
    e = next(x for x in d["contrasts"] if x["cell"] == {"lr": 0.003})
    for t, label in (("permutation", "permutation"), ("fisher", "Fisher two-sided"), ("mcnemar", "McNemar")):
        assert f"{label} p = {e[t]['p_adjusted']:.4g} (raw p = {e[t]['p_value']:.4g})" in line, (t, line)
    assert any(ln.startswith("  p-values adjusted within the per-stratum log-rank tests: holm") for ln in lines)
    html = (tmp_path / "r2" / "index.html").read_text()
    assert "p-values adjusted within this table (every contrast x stratum x test): holm" in html

    # --adjust none prints the raw p-values alone and says they are unadjusted.
    rep = build_report(
        oa.prepare(url, "cli", by="variant", strata="lr", contrasts=[["ns5", "baseline"]], adjust="none"), write=False
    )
    text = rep.text()
    assert "raw p" not in text and "not adjusted for multiplicity (--adjust none)" in text
    assert _contrast_ps(rep.contrasts) == pytest.approx([t["p_value"] for t in tests])
    assert re.search(r"Fisher two-sided p = [0-9.e-]+,", text)


def test_spec_block_chooses_the_method(url, tmp_path, capsys):
    spec = tmp_path / "cli.yaml"
    spec.write_text("name: cli\narms: [mlstm]\nanalysis:\n  by: variant\n  strata: [lr]\n  adjust: bonferroni\n")
    code, out, err = run_cli(capsys, "analyze", spec, "logrank", "--db", url, "--strata", "lr", "--json")
    assert code == 0, err
    d = json.loads(out)
    raw = [c["p_value"] for c in d["cells"]]
    assert d["adjust"]["method"] == "bonferroni"
    assert [c["p_adjusted"] for c in d["cells"]] == pytest.approx([min(1.0, 2 * p) for p in raw])
