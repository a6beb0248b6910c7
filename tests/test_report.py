"""``orchestrator report``: the basin-map table layout from a spec's analysis block, the
figures, and the HTML page opened in headless Chromium with every figure loaded."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import fate_trace
from orchestrator import analysis as oa
from orchestrator.store.import_jsonl import write_records
from orchestrator.cli import main
from orchestrator.store.engine import open_store_engine

GRID = [1] + list(range(200, 3001, 200))
LRS, VOCABS, VARIANTS, SEEDS = (1e-3, 3e-3, 1e-2), (80, 88, 96), ("baseline", "ns5"), range(3)


def fate(variant, lr, vocab, seed):
    """(outcome, escape step or None, collapse step or None) of one simulated trial."""
    hard = VOCABS.index(vocab)
    if variant == "baseline" and lr == 1e-2:
        return ("dead", None, 1000 + 200 * seed) if seed < 2 else ("flat", None, None)
    if variant == "ns5" and lr == 1e-2 and vocab == 96 and seed == 2:
        return "dead", None, 1600
    gate = {1e-3: 1, 3e-3: 3, 1e-2: 2}[lr] - hard + (2 if variant == "ns5" else 0)
    if seed < gate:
        return "solved", 400 * (seed + 1) + 200 * hard + (0 if variant == "ns5" else 600), None
    return ("mid", None, None) if seed == 2 and lr == 3e-3 else ("flat", None, None)


def records():
    out = []
    for variant in VARIANTS:
        for lr in LRS:
            for vocab in VOCABS:
                for seed in SEEDS:
                    levels = dict(solved=0.97, mid=0.6, chance=0.012, collapsed=0.0, loss_drop=3.0)
                    accs = fate_trace(fate(variant, lr, vocab, seed), GRID, **levels)
                    out.append(
                        {
                            "params": {
                                "arm": "mlstm",
                                "seed": seed,
                                "lr": lr,
                                "tag": {"variant": variant},
                                "task": {"name": "mad_recall", "vocab_size": vocab, "seq_len": 768},
                            },
                            "trace": accs,
                        }
                    )
    return out


SPEC = """name: basin_map
arms: [mlstm]
grid: {lr: [0.001, 0.003, 0.01], task.vocab_size: [80, 88, 96]}
analysis:
  by: variant
  cells: [vocab_size, lr]
  formula: "np.log(t) + C(lr) + C(vocab_size) + C(variant)"
"""


def _report(capsys, *argv):
    code = main([str(a) for a in argv])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    return cap.out


def test_report_prints_the_basin_map_layout_and_writes_figures(db_url, tmp_path, capsys):
    engine, _ = open_store_engine(db_url)
    write_records(engine, "basin_map", records())
    spec = tmp_path / "basin_map.yaml"
    spec.write_text(SPEC)
    out_dir = tmp_path / "rep"
    text = _report(capsys, "report", spec, "--db", db_url, "--out", out_dir)
    lines = text.splitlines()
    a = lines.index("A. outcomes per stratum: solved/mid/flat/dead (n) @KM median escape step")
    assert lines[a + 1].split() == ["lr=0.001", "lr=0.003", "lr=0.01"]
    assert lines[a + 2].split() == ["vocab_size", "group"]
    rows = lines[a + 3 : a + 9]
    for i, (vocab, variant) in enumerate([(v, g) for v in VOCABS for g in VARIANTS]):
        want = []
        for lr in LRS:
            fates = [fate(variant, lr, vocab, s) for s in SEEDS]
            counts = [sum(f[0] == o for f in fates) for o in ("solved", "mid", "flat", "dead")]
            # The Kaplan-Meier median (lifelines; collapse and the budget censor): the first
            # step where the curve is at or below one half.
            from lifelines import KaplanMeierFitter

            kmf = KaplanMeierFitter().fit([f[1] or f[2] or GRID[-1] for f in fates], [f[1] is not None for f in fates])
            sf = kmf.survival_function_.iloc[:, 0]
            hit = sf.index[sf.to_numpy() <= 0.5 + 1e-9]
            med = f"{hit[0]:g}" if len(hit) else "-"
            want += ["/".join(map(str, counts)), f"({len(fates)})", f"@{med}"]
        assert rows[i].split()[-9:] == want, (vocab, variant, rows[i])
    b = lines.index("B. log-rank on escape times by variant (collapse censors)")
    assert lines[b + 1].startswith("  pooled: baseline ")
    cell_lines = lines[b + 2 : b + 11]
    assert [ln.split(":")[0].strip() for ln in cell_lines] == [
        f"vocab_size={v} lr={lr:g}" for v in VOCABS for lr in LRS
    ]
    # The hazard fit, with its run-intervals counted here from the fates.
    n_int = n_esc = 0
    for variant in VARIANTS:
        for lr in LRS:
            for vocab in VOCABS:
                for s in SEEDS:
                    _, esc, col = fate(variant, lr, vocab, s)
                    n_int += (esc or col or GRID[-1]) // 200
                    n_esc += esc is not None
    assert (
        f"C. discrete-time hazard fit ({n_int} run-intervals, {n_esc} escapes, logit "
        "link): event ~ np.log(t) + C(lr) + C(vocab_size) + C(variant)"
    ) in text
    assert re.search(r"C\(variant\)\[T\.ns5\]\s+\S+", text)
    assert "D. lock-in (final acc >= 0.8)" in text
    assert f"wrote {out_dir / 'index.html'}" in text
    for name in ("index.html", "km.png", "basin.png", "traces.png", "hazard.png"):
        assert (out_dir / name).stat().st_size > 1000, name
    html = (out_dir / "index.html").read_text()
    for name in ("km.png", "basin.png", "traces.png", "hazard.png"):
        assert f'src="{name}"' in html
    # Flags override the spec's block; --json carries the same tables.
    d = json.loads(
        _report(
            capsys,
            "report",
            spec,
            "--db",
            db_url,
            "--out",
            tmp_path / "r2",
            "--by",
            "lr",
            "--cells",
            "vocab_size",
            "--lockin",
            "0.95",
            "--formula",
            "np.log(t) + C(lr)",
            "--json",
        )
    )
    assert d["config"]["by"] == ["lr"] and d["config"]["lockin"] == 0.95
    assert d["hazard"]["formula"] == "event ~ np.log(t) + C(lr)"
    assert {r["group"] for r in d["lockin"]} == {"0.001", "0.003", "0.01"}
    assert d["heatmap"] == {"x": "lr", "y": "vocab_size", "facet": "lr"}
    assert len(d["logrank_cells"]) == 3 and d["logrank"]["kind"] == "multi-group"


CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
IMG_CHECK = (
    "<script>window.addEventListener('load', () => {"
    "const im = Array.from(document.images);"
    "const ok = im.filter(i => i.complete && i.naturalWidth > 0).length;"
    "const d = document.createElement('div'); d.id = 'img-check';"
    "d.textContent = 'loaded=' + ok + ' total=' + im.length;"
    "document.body.appendChild(d);});</script></body>"
)


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail(
        "headless Chromium is not installed: `apt-get install -y chromium` (the report test opens the HTML in it)"
    )


def _images_loaded(page: Path, profile: Path) -> tuple[int, int]:
    """(loaded, total) images of ``page`` once Chromium has fired its load event."""
    check = page.with_name("check_" + page.name)
    check.write_text(page.read_text().replace("</body>", IMG_CHECK))
    proc = subprocess.run(
        [
            _chromium(),
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            "--virtual-time-budget=10000",
            "--dump-dom",
            check.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOME": str(profile)},
    )
    m = re.search(r"loaded=(\d+) total=(\d+)", proc.stdout)
    assert m, f"chromium printed no image check (rc {proc.returncode}): {proc.stderr[-800:]}"
    return int(m[1]), int(m[2])


@pytest.mark.slow
def test_report_html_loads_every_figure_in_headless_chromium(tmp_path, capsys):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    engine, _ = open_store_engine(db)
    write_records(engine, "basin_map", records())
    spec = tmp_path / "basin_map.yaml"
    spec.write_text(SPEC)
    _report(capsys, "report", spec, "--db", db, "--out", tmp_path / "png")
    # The notebook API writes the same page; SVG figures load too.
    rep = oa.write_report(db, str(spec), tmp_path / "svg", fmt="svg")
    assert sorted(rep.figures.values()) == ["basin.svg", "hazard.svg", "km.svg", "traces.svg"]
    for fmt in ("png", "svg"):
        out = tmp_path / fmt
        assert _images_loaded(out / "index.html", tmp_path / f"profile_{fmt}") == (4, 4)
    # The check can fail: the same page with one figure missing loads 3 of 4.
    (tmp_path / "png" / "basin.png").unlink()
    assert _images_loaded(tmp_path / "png" / "index.html", tmp_path / "profile_neg") == (3, 4)
