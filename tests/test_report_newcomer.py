"""Reports by sweep name: the stored analysis: block, the unfinished-sweep warning, one
median escape (Kaplan-Meier) in every table, a legend for the trace colours, >= 150 dpi."""

from __future__ import annotations

import sqlalchemy as sa
from lifelines import KaplanMeierFitter
from PIL import Image

from orchestrator.cli import main
from orchestrator.store.engine import open_store_engine
from orchestrator.store.import_jsonl import write_records

STEPS = list(range(100, 1001, 100))
# arm a: escapes at 200, 200, 400, 600 (np.median of the escaped = 300, KM median = 200);
# arm b: 500, 700 and two that never escape (median of the escaped 600, KM median 700).
FATES = {"a": [200, 200, 400, 600], "b": [500, 700, None, None]}
SPEC = "name: rep\nfixed: {task: mqar}\nanalysis:\n  by: [tag.g]\n  lockin: 0.9\n"


def _db(tmp_path, running: int = 0) -> str:
    db = str(tmp_path / "rep.db")
    recs = []
    for g, fates in FATES.items():
        for seed, esc in enumerate(fates):
            recs.append(
                {
                    "params": {"arm": "deltanet", "seed": seed, "tag": {"g": g}, "task": {"name": "mqar"}},
                    "trace": [{"step": s, "acc": 0.95 if esc and s >= esc else 0.05, "loss": 1.0} for s in STEPS],
                }
            )
    write_records(db, "rep", recs)
    engine, _ = open_store_engine(db)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE sweeps SET spec_text = :t"), {"t": SPEC})
        conn.execute(sa.text("UPDATE trials SET status = 'completed'"))
        if running:
            conn.execute(
                sa.text(
                    "UPDATE trials SET status = 'running' WHERE id IN "
                    f"(SELECT id FROM trials ORDER BY id DESC LIMIT {running})"
                )
            )
    return db


def _report(capsys, *argv) -> str:
    assert main([str(a) for a in argv]) == 0
    return capsys.readouterr().out


def test_report_by_name_uses_the_stored_analysis_block(tmp_path, capsys):
    import json

    db = _db(tmp_path)
    d = json.loads(_report(capsys, "report", "rep", "--db", db, "--out", tmp_path / "r", "--json"))
    assert d["config"]["by"] == ["tag.g"] and d["config"]["lockin"] == 0.9
    assert {r["group"] for r in d["lockin"]} == {"a", "b"}
    assert d["unfinished"] is None


def test_report_warns_on_an_unfinished_sweep(tmp_path, capsys):
    db = _db(tmp_path, running=3)
    text = _report(capsys, "report", "rep", "--db", db, "--out", tmp_path / "r")
    assert text.splitlines()[0] == (
        "WARNING: unfinished sweep: 5 of 8 trials finished "
        "(completed 5, running 3); the tables cover the finished "
        "trials only"
    )
    page = (tmp_path / "r" / "index.html").read_text()
    assert "unfinished sweep: 5 of 8 trials finished" in page and "class='warning'" in page


def test_one_median_escape_everywhere_is_the_km_median(tmp_path, capsys):
    import json

    db = _db(tmp_path)
    d = json.loads(_report(capsys, "report", "rep", "--db", db, "--out", tmp_path / "r", "--json"))
    outcome = {r["group"]: r["median_escape"] for r in d["outcomes"]}
    km = {g: v["median"] for g, v in d["km"]["groups"].items()}
    # Independent: lifelines' KM on the escape steps (never-escaped trials censored at the
    # last step); the median is the first step where the curve is at or below one half.
    ref = {}
    for g, fates in FATES.items():
        kmf = KaplanMeierFitter().fit([e or STEPS[-1] for e in fates], [e is not None for e in fates])
        sf = kmf.survival_function_.iloc[:, 0]
        ref[g] = float(sf.index[sf.to_numpy() <= 0.5 + 1e-9][0])
    assert outcome == km == ref == {"a": 200.0, "b": 700.0}  # np.median of escaped: 300, 600


def test_figures_have_legends_and_150_dpi(tmp_path, capsys):
    db = _db(tmp_path)
    _report(capsys, "report", "rep", "--db", db, "--out", tmp_path / "png")
    img = Image.open(tmp_path / "png" / "traces.png")
    assert round(img.info["dpi"][0]) >= 150
    assert img.size[0] >= 6.0 * 150  # wide enough for the title over a single panel
    assert round(Image.open(tmp_path / "png" / "km.png").info["dpi"][0]) >= 150
    _report(capsys, "report", "rep", "--db", db, "--out", tmp_path / "svg", "--format", "svg")
    svg = (tmp_path / "svg" / "traces.svg").read_text()
    for label in ("solved", "flat", "escape at 0.8", "Per-seed accuracy traces, one line per"):
        assert f"<!-- {label}" in svg, label
