"""The ``sequential:`` and ``stop:`` blocks in a sweep spec: bad blocks are one line, exit 2,
and nothing is written (the database file is not even created)."""

from __future__ import annotations

import pytest

from orchestrator.cli import main
from orchestrator.spec import SpecError, load

BASE = """
name: seqspec
fixed: {task: mqar, d_model: 16, n_layers: 1, steps: 10, eval_every: 5}
axes: {arm: [armed_gdn, gated_deltanet], seed: 0..7%s}
sequential:
%s
"""
GOOD = """  compare: {by: arm, groups: [armed_gdn, gated_deltanet]}
  test: fisher
  looks: [2, 4, 8]
  alpha: 0.05
  spending: obrien_fleming"""


def _spec(block: str = GOOD, extra_axes: str = "") -> str:
    return BASE % (extra_axes, block)


def test_good_block_parses_with_thresholds():
    sweep = load(text=_spec())
    assert sweep.sequential.looks == [2, 4, 8]
    assert sweep.analysis.lockin == 0.8 and sweep.analysis.escape_at == 0.8


BAD = {
    "group not in the axes": (GOOD.replace("gated_deltanet]", "deltanet]"), "", "compare.groups"),
    "compare.by not an axis": (GOOD.replace("by: arm", "by: lr"), "", "compare.by"),
    "looks not increasing": (GOOD.replace("[2, 4, 8]", "[2, 8, 4]"), "", "strictly increasing"),
    "looks above the seed axis": (GOOD.replace("[2, 4, 8]", "[2, 4, 9]"), "", "has 8"),
    "alpha at 0.5": (GOOD.replace("0.05", "0.5"), "", "sequential.alpha"),
    "alpha at 0": (GOOD.replace("0.05", "0"), "", "sequential.alpha"),
    "stratified without a stratum": (GOOD, ", task.K: [8, 16]", "not a stated stratum"),
    "unknown spending": (GOOD.replace("obrien_fleming", "haybittle"), "", "sequential.spending"),
    "unknown key": (GOOD + "\n  foo: 1", "", "sequential.foo"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_sequential_block_is_one_line_exit_2_nothing_written(case, tmp_path, capsys):
    block, axes, needle = BAD[case]
    with pytest.raises(SpecError) as exc:
        load(text=_spec(block, axes))
    msg = str(exc.value)
    assert needle in msg and "\n" not in msg, msg
    path = tmp_path / "s.yaml"
    path.write_text(_spec(block, axes))
    db = tmp_path / "out.db"
    assert main(["submit", str(path), "--db", f"sqlite:///{db}"]) == 2
    err = capsys.readouterr().err
    assert needle in err
    assert not db.exists()


def test_stated_stratum_is_accepted():
    block = GOOD + "\n  strata: [task.K]"
    sweep = load(text=_spec(block, ", task.K: [8, 16]"))
    assert sweep.sequential.strata == ["task.K"]


def test_stop_block_takes_escape_threshold_from_analysis():
    text = _spec().replace(
        "sequential:", "analysis: {escape_at: 0.7, stopped_as: solved}\nstop: {after_escape_evals: 2}\nsequential:"
    )
    sweep = load(text=text)
    assert sweep.spec.stop.after_escape_evals == 2 and sweep.spec.stop.escape_at == 0.7
    assert sweep.analysis.stopped_as == "solved"


def test_sequential_fisher_with_stop_needs_the_imputation_rule():
    # A look on lock-in at budget cannot read a trial the stop rule ended; the analysis
    # refuses such trials unless told to impute them, and so does the spec.
    text = _spec().replace("sequential:", "stop: {after_escape_evals: 2}\nsequential:")
    with pytest.raises(SpecError, match="stopped_as: solved"):
        load(text=text)
    assert "test: fisher" in GOOD
    logrank = text.replace("test: fisher", "test: logrank")
    assert load(text=logrank).spec.stop is not None  # escape times are unaffected by a stop


@pytest.mark.parametrize(
    "stop,needle", [("{after_escape_evals: 0}", "stop.after_escape_evals"), ("{after: 2}", "stop.after")]
)
def test_bad_stop_block(stop, needle):
    with pytest.raises(SpecError, match=needle.replace(".", r"\.")):
        load(text=_spec().replace("sequential:", f"stop: {stop}\nsequential:"))
