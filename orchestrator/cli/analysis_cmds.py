"""``orchestrator analyze | report | import`` and ``orchestrator bench analysis``.

Imported on every CLI start, so the statistics libraries are imported inside the commands.
The analysis options of ``analyze`` and ``report`` are :mod:`.analysis_options`'s, one per
field of the analysis config.
"""

import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

import typer

from orchestrator.cli.analysis_options import analysis_options
from orchestrator.cli.app import DB_HELP, app, bench_app
from orchestrator.errors import UserError, printable

# The analysis kinds are the rows of orchestrator.analysis.analyses.ANALYSES; the help text
# is written out here because that table imports the statistics libraries.
_KINDS = "lockin|outcomes|fisher|permutation|mcnemar|km|logrank|hazard|sequential|scaling|importance"

DB = typer.Option(None, "--db", help=DB_HELP)
JSON = typer.Option(False, "--json", help="print JSON")
# The time-to-event analyses, whose at-risk intervals the --diverged rule defines: they always
# say which rule they used; the others do when a diverged trial is among theirs.
_SURVIVAL = ("km", "logrank", "hazard")
# Analyses whose output starts with the event rule they read (the thresholds and the metric).
_RULED = _SURVIVAL + ("lockin", "outcomes", "fisher", "permutation", "mcnemar")


def _config(target: str, db: Optional[str], options: dict[str, Any]):
    """``(sweep name, config, spec storage)``: the target's ``analysis:`` block (a spec file's,
    or the one stored with the sweep) with the options given over it."""
    from orchestrator.analysis.config import parse_config
    from orchestrator.analysis.report import resolve_target

    sweep, block, storage = resolve_target(target, db)
    return sweep, parse_config(block, source=f"{target}: analysis").with_overrides(**options), storage


def _print_json(obj) -> None:
    from orchestrator.analysis.results import jsonable

    print(json.dumps(jsonable(obj), indent=2, allow_nan=False))


@app.command("analyze")
@analysis_options
def analyze(
    sweep: str = typer.Argument(..., help="sweep name, or a spec YAML (uses its analysis: block)"),
    kind: str = typer.Argument(..., help=_KINDS),
    db: Optional[str] = DB,
    json_out: bool = JSON,
    *,
    options: dict[str, Any],
) -> None:
    """Statistics of one sweep straight off the database.

    KIND: lockin, outcomes, fisher, permutation, mcnemar, km, logrank, hazard, scaling
    (recall scaling law: accuracy vs N*D/Nf per vocabulary, beside the Omega(Nf log V)
    boundary; columns from the spec's analysis.scaling block), importance (fANOVA
    importance of the swept parameters for final accuracy, lock-in and escape step).
    """
    from orchestrator.analysis import pipeline
    from orchestrator.analysis.analyses import ANALYSES, format_result, to_json
    from orchestrator.analysis.diverged import diverged_note, n_diverged
    from orchestrator.analysis.survival import logrank_strata

    if kind not in ANALYSES and kind != "importance":
        raise UserError(f"unknown analysis {kind!r}; expected one of {'|'.join(ANALYSES)}|importance")
    name, cfg, storage = _config(sweep, db, options)
    prep = pipeline.prepare(db or storage, name, cfg)
    if kind == "importance":  # not a row of ANALYSES: it reads the parameters' names beside the trials
        from orchestrator.analysis.importance import METHOD, OUTCOMES, importance

        found = [importance(prep.trials, list(prep.data.params), o, prep.cfg.stopped_as) for o in OUTCOMES]
        if json_out:
            _print_json({"method": METHOD, "outcomes": [r.to_dict() for r in found]})
        else:
            print("\n".join(r.summary() for r in found))
        return
    note = prep.data.unfinished_note()
    if note is not None:
        print(f"note: {note}", file=sys.stderr)
    n_div = n_diverged(prep.trials)
    rule = diverged_note(prep.cfg.diverged, n_div, len(prep.trials)) if kind in _SURVIVAL or n_div else None
    if kind == "logrank" and options.get("strata"):
        from orchestrator.analysis import multiplicity

        res = logrank_strata(prep.trials, prep.cfg)
        multiplicity.annotate(res, prep.cfg.adjust)
        if json_out:
            _print_json(
                {
                    "cells": res,
                    "adjust": {"method": prep.cfg.adjust, "family": multiplicity.STRATA_FAMILY},
                    "diverged": {"rule": prep.cfg.diverged, "trials": n_div},
                }
            )
        else:
            from orchestrator.events import rule_text

            print(f"{rule}\n{rule_text(prep.cfg, survival=True)}")
            print(multiplicity.note(prep.cfg.adjust, multiplicity.STRATA_FAMILY))
            print(format_result(kind, res))
        return
    res = pipeline.run(prep, kind)
    if json_out:
        out = to_json(res)
        if isinstance(out, dict) and rule:
            out = {**out, "diverged": {"rule": prep.cfg.diverged, "trials": n_div}}
        _print_json(out)
    else:
        from orchestrator.events import rule_text

        events_rule = rule_text(prep.cfg, survival=kind in _SURVIVAL) if kind in _RULED else None
        head = "".join(f"{line}\n" for line in (rule, events_rule) if line)
        print(head + format_result(kind, res))


@app.command("report")
@analysis_options
def report_cmd(
    target: str = typer.Argument(..., help="sweep name, or a spec YAML (uses its name and analysis: block)"),
    out: Optional[Path] = typer.Option(None, "--out", help="output folder (default runs/reports/SWEEP)"),
    db: Optional[str] = DB,
    fmt: str = typer.Option("png", "--format", help="png or svg"),
    json_out: bool = JSON,
    *,
    options: dict[str, Any],
) -> None:
    """Print a sweep's tables and write an HTML report with figures.

    Tables: outcomes per stratum, log-rank per stratum, hazard fit, lock-in rates, accuracy
    mean [min, max] (with the rebinding control), the spec's contrasts.
    """
    from orchestrator.analysis import pipeline
    from orchestrator.analysis.report import build_report

    name, cfg, storage = _config(target, db, options)
    prep = pipeline.prepare(db or storage, name, cfg)
    rep = build_report(prep, out, fmt=fmt, db=db or storage)
    if json_out:
        _print_json(rep.to_dict())
    else:
        print(rep.text())


@app.command("import")
def import_cmd(
    file: Path = typer.Argument(..., help='JSON lines: {"params": {...}, "trace": [{"step", "acc", "loss"}, ...]}'),
    sweep: str = typer.Option(..., "--sweep", help="sweep to import into (created if new)"),
    db: Optional[str] = DB,
    json_out: bool = JSON,
) -> None:
    """Import traces produced elsewhere; a malformed file imports nothing."""
    from orchestrator.store.import_jsonl import import_jsonl

    res = import_jsonl(db, file, sweep)
    if json_out:
        _print_json(res)
    else:
        div = f", {res['diverged']} diverged" if res.get("diverged") else ""
        # a file name may hold terminal control characters (an ESC would start a sequence)
        print(
            printable(
                f"imported {res['trials']} trials ({res['new_trials']} new{div}, {res['evals']} "
                f"eval rows) from {res['file']} into sweep {res['sweep']}"
            )
        )


@bench_app.command("analysis")
def bench_analysis(
    trials: int = typer.Option(10_000, "--trials", help="synthetic trials"),
    evals: int = typer.Option(50, "--evals", help="eval points per trial"),
    keep_db: Optional[Path] = typer.Option(None, "--keep-db", help="write the synthetic DB here and keep it"),
    json_out: bool = JSON,
) -> None:
    """Time the hazard fit straight from a SQLite database (goal < 10 s).

    Times load + events, person-period expansion and GLM fit over synthetic traces.
    """
    from orchestrator.bench.analysis import build_db, time_hazard

    if trials < 20 or evals < 3:
        raise UserError("--trials must be >= 20 and --evals >= 3")
    with tempfile.TemporaryDirectory(prefix="orch-bench-") as tmp:
        path = keep_db if keep_db else Path(tmp) / "bench.db"
        if path.exists():
            raise UserError(f"--keep-db {path}: file exists; pass a new path")
        from orchestrator.store.engine import sqlite_url

        url = sqlite_url(path)
        build_s = build_db(url, trials, evals)
        res = time_hazard(url)
        res.build_s = build_s
    if json_out:
        _print_json(res.to_dict())
        return
    print(
        f"bench analysis: {res.n_trials} trials x {evals} eval points "
        f"({res.n_eval_rows} eval rows) in SQLite, built in {res.build_s:.1f} s"
    )
    print(
        f"  hazard fit straight from the DB: load+events {res.load_s:.2f} s, person-period "
        f"{res.expand_s:.2f} s ({res.n_intervals} run-intervals, {res.n_events} escapes), "
        f"GLM fit {res.fit_s:.2f} s"
    )
    print(
        f"  total {res.total_s:.2f} s (goal < 10 s); ns5 HR {res.ns5_hr:.2f} "
        f"[{res.ns5_ci[0]:.2f}, {res.ns5_ci[1]:.2f}] (simulated 6.00)"
    )
