"""``orchestrator report``: the tables a paper prints and an HTML page with figures.

The target is a sweep name or a spec YAML (its ``name`` and optional ``analysis:`` block
are read; nothing else of the spec is interpreted here). The report holds:

A. outcome classes per stratum, laid out as the scaffold study's table: rows are the strata
   parameters (``cells``) but the last, times the ``by`` groups; columns are the values of
   the last one; an entry is ``solved/mid/flat/dead (n) @KM median escape step``;
B. log-rank tests between the ``by`` groups, pooled and within each stratum;
C. the discrete-time hazard fit (``formula``, ``link``);
D. lock-in rates per stratum and group (with Fisher exact when there are two groups);
E. final accuracy per stratum, laid out as A: ``mean [min, max]``, plus the mean
   rebinding-control accuracy (``rb``) where the trials ran the control (the 001 papers'
   hardened tables);
F. the ``contrasts`` the spec names, within each stratum: lock-in with Fisher exact, the mean
   gap with a permutation test, log-rank on escape times, and exact McNemar when the two
   groups share every pairing key (same seeds);
plus figures: Kaplan-Meier curves per group, the basin-map heatmap (when the sweep has an
lr x hardness grid, or ``heatmap`` says which axes), per-seed traces and the hazard
forest plot.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from orchestrator.errors import UserError

from . import multiplicity, survival, tables
from .analyses import ANALYSES
from .pipeline import Prepared, fit, run
from .config import AnalysisConfig, HeatmapConfig, parse_config
from .diverged import diverged_note
from .diverged import n_diverged
from .groups import format_value, labels, strata_groups, strata_iter
from .hazard import HazardResult
from .results import jsonable

DEFAULT_OUT = Path("runs") / "reports"


_NO_DB = object()  # "no database given" (None is the default database)


def resolve_target(target: str, db: Any = _NO_DB) -> tuple[str, dict[str, Any] | None, str | None]:
    """``(sweep name, analysis block or None, spec storage or None)`` of a sweep name or a
    path to a spec YAML. Given ``db``, a sweep name's block is the one stored with the
    sweep's spec, so ``report NAME`` keeps the design ``report spec.yaml`` would use."""
    p = Path(target)
    if p.suffix.lower() in (".yaml", ".yml") or p.is_file():
        import yaml

        from orchestrator.sources import MAX_SPEC_BYTES, read_text_file
        from orchestrator.yaml_load import DuplicateKeyError, load_strict

        if not p.exists():
            raise UserError(f"no spec file {target!r}")
        text = read_text_file(p, limit=MAX_SPEC_BYTES, label=target)  # a regular file, bounded
        try:
            # The spec's own loader: duplicate keys are refused and 1e-3 is a float, as in submit.
            spec = load_strict(text)
        except DuplicateKeyError as exc:
            line = exc.mark.line + 1 if exc.mark else "?"
            raise UserError(f"{target}: line {line}: duplicate key {exc.key!r}") from None
        except yaml.YAMLError as exc:
            raise UserError(f"{target}: not valid YAML ({str(exc).splitlines()[0]})") from None
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise UserError(f"{target}: expected a sweep spec with a 'name'")
        block = spec.get("analysis")
        if block is not None and not isinstance(block, dict):
            raise UserError(f"{target}: 'analysis' must be a mapping")
        storage = spec.get("storage") if isinstance(spec.get("storage"), str) else None
        return spec["name"], block, storage
    if db is not _NO_DB:
        from orchestrator.store.reader import open_engine

        from .stored import stored_spec

        spec = stored_spec(open_engine(db), target)
        block = spec.get("analysis") if spec else None
        return target, block if isinstance(block, dict) else None, None
    return target, None, None


def auto_heatmap(
    trials: pd.DataFrame, params: list[str], cfg: AnalysisConfig, aliases: dict[str, str]
) -> HeatmapConfig | None:
    """An lr x hardness grid: ``lr`` with several values and a numeric task parameter with
    several values (the first such ``task.*``); facet on the first ``by`` parameter."""
    if cfg.heatmap is not None:
        return cfg.heatmap
    if "lr" not in trials.columns or trials["lr"].nunique() < 2:
        return None
    back = {full: a for a, full in aliases.items() if "." not in a and not a.startswith("task_")}
    for name in params:
        if not name.startswith("task.") or name in ("task.seed",):
            continue
        col = trials[name]
        if pd.api.types.is_numeric_dtype(col) and col.nunique() >= 2:
            return HeatmapConfig(x="lr", y=back.get(name, name), facet=cfg.by[0] if cfg.by else None)
    return None


def _pivot(frame: pd.DataFrame, strata: list[str], entry: str) -> pd.DataFrame:
    """Rows: the ``strata`` parameters but the last, times the group; columns: the values of
    the last one; values: the ``entry`` column."""
    if not strata:
        return frame.set_index("group")[[entry]].rename(columns={entry: "all"})
    col = strata[-1]
    rows = [*strata[:-1], "group"]
    frame = frame.assign(**{col: frame[col].map(lambda v: f"{col}={format_value(v)}")})
    order = list(dict.fromkeys(frame[col]))
    wide = frame.pivot_table(index=rows, columns=col, values=entry, aggfunc="first", sort=False)
    wide = wide.reindex(columns=order).fillna("-")
    wide.columns.name = None
    return wide


def layout_table(outcomes: pd.DataFrame, strata: list[str]) -> pd.DataFrame:
    """Table A: one string entry per (row stratum, group) x column value."""
    if outcomes.empty:
        return pd.DataFrame()
    return _pivot(outcomes.assign(entry=outcomes.apply(tables.format_cell, axis=1)), strata, "entry")


def accuracy_table(trials: pd.DataFrame, cfg: AnalysisConfig) -> pd.DataFrame:
    """Per stratum and group: n, mean, min and max of the final accuracy, and the mean of the
    rebinding-control accuracy (``rebind_acc`` column, NaN where absent)."""
    rows = []
    has_rb = "rebind_acc" in trials.columns
    for stratum, g, part in strata_groups(trials, cfg.strata, cfg.by):
        acc = part["final_acc"].astype(float)
        rb = part["rebind_acc"].astype(float) if has_rb else pd.Series([], dtype=float)
        rows.append(
            {
                **stratum,
                "group": g,
                "n": int(len(acc)),
                "mean": acc.mean(),
                "min": acc.min(),
                "max": acc.max(),
                "rebind_mean": rb.mean() if rb.notna().any() else float("nan"),
            }
        )
    return pd.DataFrame(rows, columns=[*cfg.strata, "group", "n", "mean", "min", "max", "rebind_mean"])


def _acc_entry(row) -> str:
    if row["n"] == 0 or row["mean"] != row["mean"]:
        return "-"
    out = f"{row['mean']:.3f} [{row['min']:.3f}, {row['max']:.3f}]"
    if row["rebind_mean"] == row["rebind_mean"]:
        out += f" rb {row['rebind_mean']:.3f}"
    return out


def accuracy_layout(acc: pd.DataFrame, strata: list[str]) -> pd.DataFrame:
    """Table E: ``mean [min, max]`` (and ``rb`` rebinding mean) laid out as table A."""
    if acc.empty:
        return pd.DataFrame()
    return _pivot(acc.assign(entry=acc.apply(_acc_entry, axis=1)), strata, "entry")


def contrast_tests(trials: pd.DataFrame, cfg: AnalysisConfig) -> list[dict[str, Any]]:
    """Each ``cfg.contrasts`` pair within each stratum where both groups occur (one pooled
    stratum without ``cells``; the stratum under the key ``cell``): Fisher (lock-in),
    permutation (mean of the metric accuracy), log-rank (escape times; None without escapes)
    and exact McNemar (None unless both groups hold the same ``pair_on`` keys, once each)."""
    out: list[dict[str, Any]] = []
    if not cfg.contrasts or not cfg.by:
        return out
    for a, b in cfg.contrasts:
        pair_cfg = cfg.with_overrides(compare=[a, b])
        for stratum, sub in strata_iter(trials, cfg.strata):
            labs = labels(sub, cfg.by)
            ta, tb = sub[labs == a], sub[labs == b]
            if ta.empty or tb.empty:
                continue
            entry: dict[str, Any] = {"cell": stratum, "a": a, "b": b}
            entry["fisher"] = _try("fisher", sub, pair_cfg)
            entry["permutation"] = _try("permutation", sub, pair_cfg)
            entry["logrank"] = (
                _try("logrank", sub, pair_cfg) if int(ta["event"].sum() + tb["event"].sum()) > 0 else None
            )
            entry["mcnemar"] = _try("mcnemar", sub, pair_cfg) if _paired(ta, tb, cfg.pair_on) else None
            out.append(entry)
    return out


def _try(kind: str, trials: pd.DataFrame, cfg: AnalysisConfig) -> dict[str, Any] | None:
    """A test's result as a dict, or None where it cannot be computed here (e.g. a group
    whose trials all diverged has no accuracy to permute)."""
    try:
        return ANALYSES[kind].fn(trials, cfg, None).to_dict()
    except UserError:
        return None


def _paired(ta: pd.DataFrame, tb: pd.DataFrame, pair_on: list[str]) -> bool:
    if not pair_on or any(p not in ta.columns for p in pair_on):
        return False
    ka = [tuple(map(format_value, r)) for r in ta[pair_on].itertuples(index=False, name=None)]
    kb = [tuple(map(format_value, r)) for r in tb[pair_on].itertuples(index=False, name=None)]
    return len(set(ka)) == len(ka) and len(set(kb)) == len(kb) and set(ka) == set(kb)


def _contrast_line(e: dict[str, Any]) -> str:
    stratum = " ".join(f"{k}={format_value(v)}" for k, v in e["cell"].items())
    f, pm = e["fisher"], e["permutation"]
    parts = [f"{e['a']} vs {e['b']}" + (f" at {stratum}" if stratum else "") + ":"]
    if pm:
        ma, mb = pm["groups"][e["a"]]["mean"], pm["groups"][e["b"]]["mean"]
        parts.append(f"mean {ma:.3f} vs {mb:.3f} (gap {ma - mb:+.3f}, permutation {multiplicity.p_text(pm)});")
    else:
        parts.append("mean - (no accuracies to permute);")
    if f:
        ga, gb = f["groups"][e["a"]], f["groups"][e["b"]]
        # The family holds Fisher's p_value (the --alternative one); the other side stays raw.
        parts.append(
            f"lock-in {ga['k']}/{ga['n']} vs {gb['k']}/{gb['n']} (Fisher {f['alternative']} "
            f"{multiplicity.p_text(f)}, one-sided first-higher raw {f['p_greater']:.4g});"
        )
    lr = e["logrank"]
    parts.append(f"log-rank {multiplicity.p_text(lr)}" if lr else "log-rank - (no escapes)")
    if e["mcnemar"]:
        mc = e["mcnemar"]
        parts[-1] += f"; McNemar {multiplicity.p_text(mc)} ({mc['only_a']} vs {mc['only_b']} discordant)"
    return " ".join(parts)


def attach_rebinding(prep: Prepared, db) -> Prepared:
    """Add ``rebind_acc`` (the rebinding-control accuracy of each trial's last eval, from the
    evals' ``metrics``) when the sweep ran the control (``rebinding: true``)."""
    trials = prep.trials
    if "rebinding" not in trials.columns or not trials["rebinding"].eq(True).any():
        return prep
    from orchestrator.store import reader

    last = trials.set_index("trial_id")["last_step"]
    values: dict[int, float] = {}
    for tid, step, metrics in reader.eval_metrics(reader.open_engine(db), list(last.index)):
        if step == last.get(tid) and isinstance(metrics, dict) and isinstance(metrics.get("rebind_acc"), (int, float)):
            values[int(tid)] = float(metrics["rebind_acc"])
    rb = trials["trial_id"].map(lambda t: values.get(int(t), float("nan")))
    return replace(prep, trials=trials.assign(rebind_acc=rb.astype(float)))


@dataclass
class Report:
    sweep: str
    cfg: AnalysisConfig
    n_trials: int
    outcomes: pd.DataFrame
    layout: pd.DataFrame
    lockin: pd.DataFrame
    fisher: dict[str, Any] | None
    logrank: dict[str, Any] | None
    logrank_strata: list[dict[str, Any]]
    km: dict[str, Any]
    hazard: HazardResult | None
    hazard_error: str | None
    heatmap: HeatmapConfig | None
    accuracy: pd.DataFrame = field(default_factory=pd.DataFrame)
    accuracy_layout: pd.DataFrame = field(default_factory=pd.DataFrame)
    contrasts: list[dict[str, Any]] = field(default_factory=list)
    figures: dict[str, str] = field(default_factory=dict)
    html_path: str | None = None
    # Designs: sequential looks (format_looks text), stop-rule handling, compute saved.
    design: list[str] = field(default_factory=list)
    unfinished: str | None = None  # the warning line of a sweep still running (or stopped)
    diverged: str = ""  # how diverged trials were counted (diverged.describe)

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "sweep": self.sweep,
                "config": self.cfg.model_dump(),
                "n_trials": self.n_trials,
                "outcomes": self.outcomes,
                "lockin": self.lockin,
                "fisher": self.fisher,
                "logrank": self.logrank,
                "logrank_cells": self.logrank_strata,
                "km": self.km,
                "hazard": self.hazard.to_dict() if self.hazard else None,
                "hazard_error": self.hazard_error,
                "heatmap": self.heatmap.model_dump() if self.heatmap else None,
                "accuracy": self.accuracy,
                "contrasts": self.contrasts,
                "adjust": {
                    "method": self.cfg.adjust,
                    "logrank_cells": multiplicity.STRATA_FAMILY,
                    "contrasts": multiplicity.CONTRASTS_FAMILY,
                },
                "figures": self.figures,
                "html": self.html_path,
                "design": self.design,
                "unfinished": self.unfinished,
                "diverged": self.diverged,
            }
        )

    def text(self) -> str:
        """The tables as plain text (what ``orchestrator report`` prints)."""
        c = self.cfg
        out = (
            ([f"WARNING: {self.unfinished}"] if self.unfinished else [])
            + [
                f"sweep {self.sweep}: {self.n_trials} trials ({', '.join(c.statuses)})"
                + (f", where {c.where}" if c.where else "")
                + (f", traces cut at step {c.horizon}" if c.horizon else ""),
                f"escape: first eval after the first with acc >= {c.escape_at:g}; collapse: acc "
                f"< {c.collapse_below:g} from some eval to the end; solved/lock-in: {c.metric} "
                f"acc >= {c.lockin:g}; mid: final acc >= {c.mid_at:g}",
            ]
            + ([self.diverged] if self.diverged else [])
            + [""]
        )
        out.append("A. outcomes per stratum: solved/mid/flat/dead (n) @KM median escape step")
        out.append(_indent(self.layout.to_string()) if not self.layout.empty else "  (none)")
        out.append("")
        out.append(f"B. log-rank on escape times by {'/'.join(c.by) or '(no --by)'} (collapse censors)")
        if self.logrank:
            out.append("  pooled: " + _logrank_line(self.logrank))
        elif c.by:
            out.append("  pooled: - (no escapes, or fewer than two groups)")
        out += [f"  {stratum}: {line}" for stratum, line in _strata_lines(self.logrank_strata)]
        # After the strata, not above them: scripts read the pooled line and the strata by position.
        if self.logrank_strata:
            out.append("  " + multiplicity.note(c.adjust, multiplicity.STRATA_FAMILY) + "; pooled: a single test")
        out.append("")
        if self.hazard is not None:
            h = self.hazard
            out.append(
                f"C. discrete-time hazard fit ({h.n_intervals} run-intervals, "
                f"{h.n_events} escapes, {h.link} link): {h.formula}"
            )
            s = h.summary
            lines = [f"  {'term':<34} {'coef':>8} {'se':>7} {'z':>7}  {'exp(coef)':>9}  95% CI"]
            for term, r in s.iterrows():
                lines.append(
                    f"  {str(term):<34} {r['coef']:>8.3f} {r['se']:>7.3f} "
                    f"{r['z']:>7.2f}  {r['hr']:>9.3g}  [{r['ci_low']:.3g}, "
                    f"{r['ci_high']:.3g}]"
                )
            out.extend(lines)
            if h.warnings:
                out.append("  warnings: " + "; ".join(h.warnings))
        else:
            out.append(f"C. hazard fit: not fitted ({self.hazard_error})")
        out.append("")
        out.append(f"D. lock-in ({c.metric} acc >= {c.lockin:g})")
        out.append(_indent(self.lockin.to_string(index=False, float_format=lambda v: f"{v:.3g}")))
        if self.fisher:
            f = self.fisher
            a, b = list(f["groups"])
            out.append(
                f"  Fisher exact {a} {f['groups'][a]['k']}/{f['groups'][a]['n']} vs {b} "
                f"{f['groups'][b]['k']}/{f['groups'][b]['n']}: two-sided p = "
                f"{f['p_two_sided']:.4g}, one-sided ({a} higher) p = "
                f"{f['p_greater']:.4g}"
            )
        out.append("")
        out.append(
            "E. final accuracy: mean [min, max]"
            + (
                " rb mean rebinding-control accuracy"
                if self.accuracy.get("rebind_mean", pd.Series(dtype=float)).notna().any()
                else ""
            )
        )
        out.append(_indent(self.accuracy_layout.to_string()) if not self.accuracy_layout.empty else "  (none)")
        if c.contrasts:
            out.append("")
            out.append(f"F. contrasts ({c.metric} acc; permutation {c.alternative}, lock-in >= {c.lockin:g})")
            if self.contrasts:
                out.append("  " + multiplicity.note(c.adjust, multiplicity.CONTRASTS_FAMILY))
                out.extend("  " + _contrast_line(e) for e in self.contrasts)
            else:
                out.append("  - (no stratum holds both groups of any contrast)")
        if self.design:
            out += ["", "G. design: sequential looks, stopped trials, compute saved"]
            out.extend(_indent(line) for line in self.design)
        if self.html_path:
            out += ["", f"wrote {self.html_path}"]
        return "\n".join(out)


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def _strata_lines(entries: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(stratum, its log-rank line or why there is none) per per-stratum log-rank entry."""
    return [
        (
            " ".join(f"{k}={format_value(v)}" for k, v in e["cell"].items()) or "all",
            _logrank_line(e) if e.get("p_value") is not None else f"- ({e.get('reason')})",
        )
        for e in entries
    ]


def _logrank_line(d: dict[str, Any]) -> str:
    parts = [f"{g} {v['escapes']}/{v['n']}" for g, v in d["groups"].items()]
    variance = d.get("variance")
    how = f" ({variance} variance)" if variance else ""
    return f"{' vs '.join(parts)} escaped, chi2 = {d['test_statistic']:.2f}, {multiplicity.p_text(d)}{how}"


def design_lines(prep: Prepared) -> tuple[list[str], Prepared]:
    """Section G's lines, and the prepared sweep the at-budget tables (A, D, E, F) use:
    without ``--stopped-as`` the trials the stop rule ended are left out of those tables
    (their state at the budget is unknown), with ``--stopped-as solved`` they count solved."""
    from .analyses import format_looks
    from .pipeline import n_stopped

    data, lines = prep.data, []
    if data.looks:
        lines.extend(format_looks(data.looks).splitlines())
        lines.append(f"{data.skipped} trial(s) skipped (never run: contrast decided, or beyond the last look)")
    note = data.unfinished_note()
    if note is not None:
        lines.append(note)
    budget = prep
    stopped = n_stopped(prep.trials)
    if stopped and prep.cfg.stopped_as is None:
        keep = prep.trials["stopped_at"].isna()
        budget = Prepared(data=data, trials=prep.trials[keep].reset_index(drop=True), cfg=prep.cfg)
        lines.append(
            f"{stopped} trial(s) ended by the stop rule after their escape: in B, C "
            "(escape times unchanged); left out of A, D, E, F (lock-in at budget and "
            "final accuracy unknown; --stopped-as solved counts them solved)"
        )
    elif stopped:
        lines.append(
            f"{stopped} trial(s) ended by the stop rule after their escape: counted as "
            "solved in A, D, F (--stopped-as solved); E shows their accuracy at the stop"
        )
    if data.saved_steps:
        frac = data.saved_steps / data.budget_steps if data.budget_steps else 0.0
        lines.append(f"compute saved: {data.saved_steps:,} of {data.budget_steps:,} training steps ({frac:.0%})")
    return lines, budget


def build_report(
    prep: Prepared, out_dir: str | Path | None = None, fmt: str = "png", write: bool = True, db: Any = _NO_DB
) -> Report:
    """Compute every table, draw the figures and write ``index.html`` under ``out_dir``
    (default ``runs/reports/<sweep>``). ``db`` (the database the sweep was read from; None
    is the default database) lets table E show the rebinding control, which lives in the
    evals' metrics; without it table E has no ``rb``."""
    from .figures import hazard_figure, heatmap_figure, km_figure, traces_figure

    if db is not _NO_DB:
        prep = attach_rebinding(prep, db)
    cfg, trials = prep.cfg, prep.trials
    if fmt not in ("png", "svg"):
        raise UserError(f"--format {fmt!r}: expected png or svg")
    design, budget = design_lines(prep)
    outcomes = run(budget, "outcomes")
    layout = layout_table(outcomes, cfg.strata)
    lock = run(budget, "lockin")
    groups = lock["group"].unique().tolist() if not lock.empty else []
    n_groups = len(set(groups))
    fisher = None
    logrank = None
    if cfg.by and (cfg.compare or n_groups == 2):
        fisher = run(budget, "fisher").to_dict()
    if cfg.by and n_groups >= 2 and int(trials["event"].sum()) > 0:
        logrank = run(prep, "logrank").to_dict()
    lr_strata = survival.logrank_strata(trials, cfg) if cfg.by and cfg.strata else []
    multiplicity.annotate(lr_strata, cfg.adjust)
    km = run(prep, "km")
    hz, hz_err = None, None
    try:
        hz = fit(prep)
    except UserError as exc:
        hz_err = str(exc)
    hm = auto_heatmap(trials, prep.data.params, cfg, prep.data.aliases)
    rep = Report(
        sweep=prep.data.sweep,
        cfg=cfg,
        n_trials=len(trials),
        outcomes=outcomes,
        layout=layout,
        lockin=lock,
        fisher=fisher,
        logrank=logrank,
        logrank_strata=lr_strata,
        km=km.to_dict(),
        hazard=hz,
        hazard_error=hz_err,
        heatmap=hm,
    )
    rep.accuracy = accuracy_table(budget.trials, cfg)
    rep.accuracy_layout = accuracy_layout(rep.accuracy, cfg.strata)
    rep.contrasts = contrast_tests(budget.trials, cfg)
    multiplicity.annotate((e[t] for e in rep.contrasts for t in multiplicity.CONTRAST_TESTS), cfg.adjust)
    rep.design = design
    rep.diverged = diverged_note(cfg.diverged, n_diverged(trials), len(trials))
    if db is not _NO_DB:
        from orchestrator.store.reader import open_engine

        from .stored import completion

        rep.unfinished = completion(open_engine(db), prep.data.sweep).warning()
    if not write:
        return rep
    out = Path(out_dir) if out_dir else DEFAULT_OUT / re.sub(r"[^\w.-]", "_", prep.data.sweep)
    out.mkdir(parents=True, exist_ok=True)
    figs = {"km": km_figure(km, out / f"km.{fmt}")}
    if hm is not None:
        figs["basin"] = heatmap_figure(trials, hm, out / f"basin.{fmt}")
    figs["traces"] = traces_figure(trials, prep.data.evals, cfg, out / f"traces.{fmt}", [*cfg.strata, *cfg.by])
    if hz is not None and len(hz.summary) > 1:
        figs["hazard"] = hazard_figure(hz.summary, out / f"hazard.{fmt}")
    rep.figures = {k: p.name for k, p in figs.items()}
    html_path = out / "index.html"
    html_path.write_text(render_html(rep), encoding="utf-8")
    rep.html_path = str(html_path)
    return rep


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f3f3f3; } p.note { color: #555; font-size: 0.9em; }
p.warning { background: #fff3cd; border: 1px solid #e0c060; padding: 0.5em; }
figure { margin: 1em 0; } img { max-width: 100%; border: 1px solid #eee; }
pre { background: #f7f7f7; padding: 0.6em; font-size: 0.85em; }
"""


def _table(df: pd.DataFrame, index: bool = True) -> str:
    return df.to_html(index=index, border=0, na_rep="-", float_format=lambda v: f"{v:.4g}")


def _figure(rep: Report, key: str, caption: str) -> str:
    name = rep.figures.get(key)
    if not name:
        return ""
    return (
        f'<figure><img src="{html.escape(name)}" alt="{html.escape(caption)}">'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def render_html(rep: Report) -> str:
    c = rep.cfg
    e = html.escape
    parts = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{e(rep.sweep)} report"
        f"</title><style>{_CSS}</style></head><body>",
        f"<h1>Sweep <code>{e(rep.sweep)}</code></h1>",
        (f"<p class='warning'><strong>Warning:</strong> {e(rep.unfinished)}</p>" if rep.unfinished else ""),
        f"<p class='note'>{rep.n_trials} trials (status {e(', '.join(c.statuses))})"
        + (f", where <code>{e(c.where)}</code>" if c.where else "")
        + f". Escape: first eval after the first with accuracy &ge; {c.escape_at:g}. "
        f"Collapse: accuracy &lt; {c.collapse_below:g} from some eval to the end "
        f"(censors escape, a competing risk). Solved / lock-in: {e(c.metric)} accuracy "
        f"&ge; {c.lockin:g}; mid: final accuracy &ge; {c.mid_at:g}."
        + (f" {e(rep.diverged[:1].upper() + rep.diverged[1:])}." if rep.diverged else "")
        + "</p>",
    ]
    parts.append("<h2>Outcomes per stratum: solved/mid/flat/dead (n) @KM median escape step</h2>")
    parts.append(_table(rep.layout) if not rep.layout.empty else "<p>(none)</p>")
    parts.append("<h2>Lock-in rates</h2>" + _table(rep.lockin, index=False))
    parts.append(
        "<h2>Final accuracy: mean [min, max]</h2>"
        + (_table(rep.accuracy_layout) if not rep.accuracy_layout.empty else "<p>(none)</p>")
    )
    if rep.contrasts:
        parts.append(
            "<h2>Contrasts</h2>"
            + f"<p class='note'>{e(multiplicity.note(c.adjust, multiplicity.CONTRASTS_FAMILY))}.</p><ul>"
            + "".join(f"<li>{e(_contrast_line(x))}</li>" for x in rep.contrasts)
            + "</ul>"
        )
    if rep.design:
        parts.append(
            "<h2>Design: sequential looks, stopped trials, compute saved</h2><pre>"
            + e("\n".join(rep.design))
            + "</pre>"
        )
    if rep.fisher:
        f = rep.fisher
        parts.append(
            f"<p>Fisher exact: two-sided p = {f['p_two_sided']:.4g}; one-sided "
            f"(first group higher) p = {f['p_greater']:.4g}.</p>"
        )
    if rep.heatmap is not None:
        parts.append(
            "<h2>Basin map</h2>" + _figure(rep, "basin", f"Solved fraction per {rep.heatmap.x} x {rep.heatmap.y} cell")
        )
    parts.append("<h2>Escape times</h2>" + _figure(rep, "km", "Kaplan-Meier curves per group"))
    lr_rows = []
    if rep.logrank:
        lr_rows.append(("pooled", _logrank_line(rep.logrank)))
    lr_rows += _strata_lines(rep.logrank_strata)
    if lr_rows:
        if rep.logrank_strata:
            parts.append(f"<p class='note'>{e(multiplicity.note(c.adjust, multiplicity.STRATA_FAMILY))}.</p>")
        parts.append(_table(pd.DataFrame(lr_rows, columns=["stratum", "log-rank"]), index=False))
    km_sum = pd.DataFrame.from_dict(
        {g: {k: v for k, v in d.items() if k != "survival"} for g, d in rep.km["groups"].items()}, orient="index"
    )
    parts.append(_table(km_sum))
    parts.append("<h2>Discrete-time hazard model</h2>")
    if rep.hazard is not None:
        h = rep.hazard
        parts.append(
            f"<p><code>{e(h.formula)}</code>, {e(h.link)} link: {h.n_intervals} "
            f"run-intervals, {h.n_events} escapes, {h.n_trials} trials.</p>"
        )
        parts.append(_table(h.summary))
        if h.warnings:
            parts.append(f"<p class='note'>warnings: {e('; '.join(h.warnings))}</p>")
        parts.append(_figure(rep, "hazard", "exp(coef) per term with 95% CI"))
    else:
        parts.append(f"<p>Not fitted: {e(rep.hazard_error or '')}</p>")
    parts.append("<h2>Per-seed accuracy traces</h2>" + _figure(rep, "traces", "Accuracy traces per stratum and group"))
    parts.append("<h2>Configuration</h2><pre>" + e(c.model_dump_json(indent=2)) + "</pre>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(
    db,
    target: str,
    out_dir: str | Path | None = None,
    fmt: str = "png",
    cfg: AnalysisConfig | None = None,
    **overrides: Any,
) -> Report:
    """Notebook mirror of ``orchestrator report TARGET``: the spec's analysis block (when
    TARGET is a spec path), then ``cfg``/``overrides`` over it."""
    from .pipeline import prepare

    sweep, block, storage = resolve_target(target, db)
    base = cfg or parse_config(block, source=f"{target}: analysis")
    if db is None and storage:
        db = storage
    prep = prepare(db, sweep, base, **overrides)
    return build_report(prep, out_dir, fmt=fmt, db=db)
