"""Report figures, drawn with matplotlib's object API on the Agg canvas (no pyplot, so a
notebook's backend is never switched). Each function writes one file (PNG or SVG, from the
path's suffix) and returns its path."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.ticker import FormatStrFormatter, NullFormatter

from .config import AnalysisConfig, HeatmapConfig
from .groups import format_value, labels, ordered

MAX_TRACE_PANELS = 36
DPI = 150  # raster figures; SVG is resolution-free
OUTCOME_COLOURS = {"solved": "tab:green", "mid": "tab:orange", "flat": "tab:gray", "dead": "tab:red"}


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    return path


def km_figure(km_result, path: Path, title: str = "") -> Path:
    """Kaplan-Meier curves, one per group: fraction of trials not yet escaped vs step, with
    the 95% band lifelines gives."""
    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot()
    for g, kmf in km_result.fitters.items():
        sf = kmf.survival_function_.iloc[:, 0]
        n = km_result.groups[g]["n"]
        esc = km_result.groups[g]["escapes"]
        (line,) = ax.step(sf.index, sf.values, where="post", label=f"{g} ({esc}/{n} escaped)")
        ci = kmf.confidence_interval_survival_function_
        ax.fill_between(
            ci.index, ci.iloc[:, 0], ci.iloc[:, 1], step="post", alpha=0.15, color=line.get_color(), linewidth=0
        )
    ax.set_xlabel("training step")
    ax.set_ylabel("fraction not yet escaped")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title or "Escape times (Kaplan-Meier; collapse censors)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    return _save(fig, path)


def traces_figure(
    trials: pd.DataFrame, evals: pd.DataFrame, cfg: AnalysisConfig, path: Path, panel_by: Sequence[str]
) -> Path:
    """Per-seed accuracy traces: one panel per group of ``panel_by`` (at most
    :data:`MAX_TRACE_PANELS`), one line per trial coloured by its outcome, the escape
    threshold dashed."""
    groups = ordered(trials, panel_by)[:MAX_TRACE_PANELS]
    labs = labels(trials, panel_by)
    ncol = min(4, max(1, len(groups)))
    nrow = max(1, math.ceil(len(groups) / ncol))
    # At least 6.4 in wide, so the title and the legend fit over a single panel.
    fig = Figure(figsize=(max(6.4, 3.0 * ncol), 2.1 * nrow + 0.9))
    axes = fig.subplots(nrow, ncol, sharex=True, sharey=True, squeeze=False).ravel()
    starts = np.flatnonzero(np.r_[True, evals["trial_id"].to_numpy()[1:] != evals["trial_id"].to_numpy()[:-1]])
    bounds = dict(zip(evals["trial_id"].to_numpy()[starts], zip(starts, np.r_[starts[1:], len(evals)])))
    xy = evals[["step", "acc"]].to_numpy(dtype=float)
    prefix = "/".join(panel_by) + "=" if panel_by else ""
    for ax, g in zip(axes, groups):
        part = trials[labs == g]
        segs, cols = [], []
        for tid, outcome in zip(part["trial_id"], part["outcome"]):
            if tid in bounds:
                a, b = bounds[tid]
                segs.append(xy[a:b])
                cols.append(OUTCOME_COLOURS.get(outcome, "tab:blue"))
        ax.add_collection(LineCollection(segs, colors=cols, linewidths=0.9, alpha=0.8))
        ax.axhline(cfg.escape_at, linestyle="--", color="black", linewidth=0.6)
        ax.set_title(f"{prefix}{g} (n={len(part)})", fontsize=7)
        ax.tick_params(labelsize=7)
    for ax in axes[len(groups) :]:
        ax.set_visible(False)
    axes[0].set_ylim(-0.02, 1.02)
    if len(evals):
        axes[0].set_xlim(0, float(evals["step"].max()) * 1.02)
    for r in range(nrow):
        axes[r * ncol].set_ylabel("accuracy", fontsize=8)
    for c in range(min(ncol, len(groups))):
        last = axes[max(i for i in range(c, len(groups), ncol))]
        last.xaxis.set_tick_params(labelbottom=True)
        last.set_xlabel("step", fontsize=8)
    height = 2.1 * nrow + 0.9
    fig.suptitle("Per-seed accuracy traces, one line per trial, coloured by outcome", fontsize=9, y=1 - 0.12 / height)
    from matplotlib.lines import Line2D

    present = [o for o in OUTCOME_COLOURS if (trials["outcome"] == o).any()] or list(OUTCOME_COLOURS)
    handles = [Line2D([], [], color=OUTCOME_COLOURS[o], label=o) for o in present]
    handles.append(Line2D([], [], color="black", linestyle="--", linewidth=0.6, label=f"escape at {cfg.escape_at:g}"))
    fig.legend(
        handles=handles,
        loc="upper center",
        ncol=len(handles),
        fontsize=7,
        frameon=False,
        bbox_to_anchor=(0.5, 1 - 0.32 / height),
    )
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.45 / height, top=1 - 0.85 / height, hspace=0.5, wspace=0.12)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    return path


def heatmap_figure(trials: pd.DataFrame, hm: HeatmapConfig, path: Path) -> Path:
    """Basin map: solved fraction per (x, y) cell, one panel per ``facet`` value, each
    cell annotated with solved/n."""
    facets = ordered(trials, [hm.facet]) if hm.facet else ["all"]
    flabs = labels(trials, [hm.facet]) if hm.facet else pd.Series("all", index=trials.index)
    xs = sorted(trials[hm.x].dropna().unique(), key=_num_key)
    ys = sorted(trials[hm.y].dropna().unique(), key=_num_key)
    fig = Figure(figsize=(1.2 + 1.3 * len(xs) * len(facets), 1.0 + 0.75 * len(ys)))
    im = None
    for j, f in enumerate(facets):
        ax = fig.add_subplot(1, len(facets), j + 1)
        sub = trials[flabs == f]
        frac = np.full((len(ys), len(xs)), np.nan)
        for yi, yv in enumerate(ys):
            for xi, xv in enumerate(xs):
                cell = sub[(sub[hm.x] == xv) & (sub[hm.y] == yv)]
                if len(cell):
                    k = int((cell["outcome"] == "solved").sum())
                    frac[yi, xi] = k / len(cell)
                    ax.text(
                        xi,
                        yi,
                        f"{k}/{len(cell)}",
                        ha="center",
                        va="center",
                        fontsize=8,
                        color="white" if frac[yi, xi] < 0.5 else "black",
                    )
        im = ax.imshow(frac, vmin=0, vmax=1, cmap="viridis", origin="lower", aspect="auto")
        ax.set_xticks(range(len(xs)), [format_value(v) for v in xs], fontsize=8)
        ax.set_yticks(range(len(ys)), [format_value(v) for v in ys], fontsize=8)
        ax.set_xlabel(hm.x)
        if j == 0:
            ax.set_ylabel(hm.y)
        ax.set_title(f"{hm.facet}={f}" if hm.facet else "solved fraction", fontsize=9)
    if im is not None:
        fig.colorbar(im, ax=fig.axes, shrink=0.8, label="solved fraction")
    return _save(fig, path)


def hazard_figure(summary: pd.DataFrame, path: Path) -> Path:
    """Forest plot of exp(coef) with its 95% CI for every finite term but the intercept."""
    s = summary.drop(index=[i for i in summary.index if str(i) == "Intercept"])
    # A separated term (exp(coef) 0 or inf) has no place on a log axis.
    s = s[np.isfinite(np.log(s[["hr", "ci_low", "ci_high"]].clip(lower=1e-300))).all(axis=1)]
    fig = Figure(figsize=(6.0, 0.9 + 0.35 * max(1, len(s))))
    ax = fig.add_subplot()
    y = np.arange(len(s))[::-1]
    hr, lo, hi = (s[c].to_numpy(dtype=float) for c in ("hr", "ci_low", "ci_high"))
    ax.errorbar(hr, y, xerr=np.vstack([hr - lo, hi - hr]), fmt="o", color="tab:blue", ecolor="tab:blue", capsize=3)
    ax.axvline(1.0, color="black", linewidth=0.7)
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.set_yticks(y, [str(i) for i in s.index], fontsize=8)
    ax.set_xlabel("exp(coef) with 95% CI (log scale)")
    ax.grid(alpha=0.3, axis="x")
    return _save(fig, path)


def _num_key(v):
    try:
        return (0, float(v), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(v))
