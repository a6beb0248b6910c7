"""Recall scaling laws (seed 002): accuracy against ``r = N·D / Nf``, and the fitted recall
boundary beside the ``N·D = Ω(Nf log V)`` boundary.

Conventions (``orchestrator analyze SWEEP scaling``; columns named by
:class:`~orchestrator.analysis.config.ScalingConfig`):

- per trial: ``D`` the model width, ``N_eff = layers · N`` (the paper's effective state of a
  Λ-layer model), ``Nf`` the facts in context, ``V`` the vocabulary; ``r = N_eff · D / Nf``.
  ``acc`` is the trial's ``metric`` accuracy (final eval by default).
- grid points: the trials of one (group, V, D, N_eff, Nf) are reduced to one point by the
  best seed (``seeds: best``, the paper's existence reading, its Appendix K.5), the mean,
  or kept one point per trial (``all``).
- floor ``c``: what a model that binds nothing scores; the curve rises from it to 1.
  ``table`` = 1/Nf (guess among the stored values: the paper's no-convolution ablation
  sits there), ``marginal`` = 1/(V − V//2), ``none`` = 0, or a number.
- free fit, per group and V: ``acc ≈ c + (1 − c) Φ(α + β ln r)`` by maximum binomial
  quasi-likelihood on the fractional accuracies (:func:`fit_probit`). Its boundary
  ``r* = exp(−α/β)`` is the N·D/Nf at which accuracy is halfway from the floor to 1; the
  95% interval is the delta method on ``ln r*`` with the quasi-binomial dispersion.
- law fit, per group over every V at once: ``acc ≈ c + (1 − c) Φ(κ √r − √(2 ln V))``, the
  paper's ``p_recall(x) ≈ Φ(x − √(2 log V))`` with ``x = κ √(N·D/Nf)`` (one free
  rescaling κ). Its boundary is ``r* = 2 ln V / κ²``: ``N·D = c_law · Nf · ln V`` with
  ``c_law = 2/κ²``, the Ω(Nf log V) boundary with its constant fitted.
- slope: the free boundaries' ``ln r*`` regressed on ``ln ln V`` (inverse-variance weights);
  the Ω(Nf log V) law predicts slope 1.

Natural logarithms throughout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from orchestrator.errors import UserError

from .config import AnalysisConfig, ScalingConfig
from .groups import labels, ordered
from .results import jsonable

Z95 = 1.959963984540054
BETA_MAX = 60.0  # slope cap on sqrt(r): steeper is a step function; the boundary still fits


def _phi(z: np.ndarray) -> np.ndarray:
    from scipy.stats import norm

    return norm.pdf(z)


def _Phi(z: np.ndarray) -> np.ndarray:
    from scipy.stats import norm

    return norm.cdf(z)


def _nll(mu: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    mu = np.clip(mu, 1e-12, 1 - 1e-12)
    return float(-np.sum(w * (y * np.log(mu) + (1 - y) * np.log1p(-mu))))


def _dispersion(y: np.ndarray, mu: np.ndarray, w: np.ndarray, n_params: int) -> float:
    """Pearson X²/(n − p): the quasi-binomial scale (1 when there is no residual df)."""
    dof = len(y) - n_params
    if dof <= 0:
        return 1.0
    mu = np.clip(mu, 1e-12, 1 - 1e-12)
    return float(np.sum(w * (y - mu) ** 2 / (mu * (1 - mu))) / dof)


@dataclass
class ProbitFit:
    """``acc ≈ c + (1 − c) Φ(alpha + beta x)``: coefficients, covariance (quasi-binomial),
    the midpoint ``x50 = −alpha/beta`` with its standard error, and fit diagnostics."""

    alpha: float
    beta: float
    cov: np.ndarray
    x50: float
    x50_se: float
    dispersion: float
    n: int
    rmse: float
    at_bound: bool
    converged: bool


def fit_probit(x: np.ndarray, y: np.ndarray, floor: np.ndarray | float = 0.0, w: np.ndarray | None = None) -> ProbitFit:
    """Maximum quasi-likelihood fit of ``y ≈ c + (1 − c) Φ(alpha + beta x)`` with ``beta > 0``
    (accuracy rises with x). ``y`` in [0, 1] may be fractional; ``floor`` is ``c`` (a scalar
    or one value per point); ``w`` optional weights. With ``c = 0`` this is the binomial GLM
    with a probit link (tested against statsmodels)."""
    from scipy.optimize import minimize

    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    c = np.broadcast_to(np.asarray(floor, dtype=float), x.shape)
    w = np.ones_like(x) if w is None else np.asarray(w, dtype=float)
    if len(x) < 3 or np.ptp(x) == 0:
        raise UserError("a probit fit needs at least three points at two or more values of x")
    # Start from least squares on the probit scale of the floor-normalised accuracies.
    u = np.clip((y - c) / (1 - c), 0.02, 0.98)
    from scipy.stats import norm

    zb, xb = norm.ppf(u), x
    b0 = max(np.polyfit(xb, zb, 1)[0], 0.05) if np.ptp(zb) > 0 else 1.0
    a0 = float(np.mean(zb) - b0 * np.mean(xb))
    scale = max(float(np.std(x)), 1e-6)

    def obj(theta):
        a, b = theta
        eta = a + b * x
        mu = c + (1 - c) * _Phi(eta)
        mu_c = np.clip(mu, 1e-12, 1 - 1e-12)
        dmu = (1 - c) * _phi(eta)
        r = w * (y / mu_c - (1 - y) / (1 - mu_c)) * dmu
        return _nll(mu, y, w), -np.array([r.sum(), (r * x).sum()])

    bounds = [(-BETA_MAX * (abs(x).max() + 1) - 50, BETA_MAX * (abs(x).max() + 1) + 50), (1e-6 / scale, BETA_MAX)]
    res = minimize(
        obj,
        np.array([a0, min(b0, BETA_MAX)]),
        jac=True,
        method="L-BFGS-B",
        bounds=bounds,
        options={"maxiter": 2000, "ftol": 1e-14, "gtol": 1e-10},
    )
    a, b = (float(v) for v in res.x)
    eta = a + b * x
    mu = c + (1 - c) * _Phi(eta)
    disp = _dispersion(y, mu, w, 2)
    cov = _probit_cov(x, mu, c, eta, w, disp)
    g = np.array([-1.0 / b, a / b**2])
    x50 = -a / b
    var = float(g @ cov @ g) if np.all(np.isfinite(cov)) else float("nan")
    return ProbitFit(
        alpha=a,
        beta=b,
        cov=cov,
        x50=x50,
        x50_se=math.sqrt(var) if var == var and var >= 0 else float("nan"),
        dispersion=disp,
        n=len(x),
        rmse=float(np.sqrt(np.mean((y - mu) ** 2))),
        at_bound=b >= BETA_MAX * 0.999,
        converged=bool(res.success),
    )


def _probit_cov(x, mu, c, eta, w, disp) -> np.ndarray:
    """Quasi-binomial covariance: dispersion × inverse expected information."""
    mu = np.clip(mu, 1e-12, 1 - 1e-12)
    d = (1 - c) * _phi(eta)
    wt = w * d**2 / (mu * (1 - mu))
    info = np.array([[wt.sum(), (wt * x).sum()], [(wt * x).sum(), (wt * x * x).sum()]])
    try:
        return disp * np.linalg.inv(info)
    except np.linalg.LinAlgError:
        return np.full((2, 2), np.nan)


@dataclass
class LawFit:
    """``acc ≈ c + (1 − c) Φ(kappa √r − √(2 ln V))``: kappa with its standard error and
    ``c_law = 2/kappa²`` (the constant of ``N·D = c_law · Nf · ln V``)."""

    kappa: float
    kappa_se: float
    c_law: float
    c_law_ci: tuple[float, float]
    dispersion: float
    n: int
    rmse: float


def fit_law(
    r: np.ndarray, V: np.ndarray, y: np.ndarray, floor: np.ndarray | float = 0.0, w: np.ndarray | None = None
) -> LawFit:
    """One-parameter fit of the paper's law over points at any mix of vocabularies."""
    from scipy.optimize import minimize_scalar

    r = np.asarray(r, dtype=float)
    y = np.asarray(y, dtype=float)
    off = np.sqrt(2 * np.log(np.asarray(V, dtype=float)))
    c = np.broadcast_to(np.asarray(floor, dtype=float), r.shape)
    w = np.ones_like(r) if w is None else np.asarray(w, dtype=float)
    sq = np.sqrt(r)

    def mu_of(k):
        return c + (1 - c) * _Phi(k * sq - off)

    res = minimize_scalar(
        lambda lk: _nll(mu_of(math.exp(lk)), y, w), bounds=(-12.0, 8.0), method="bounded", options={"xatol": 1e-10}
    )
    k = math.exp(res.x)
    mu = mu_of(k)
    disp = _dispersion(y, mu, w, 1)
    eta = k * sq - off
    muc = np.clip(mu, 1e-12, 1 - 1e-12)
    info = float(np.sum(w * ((1 - c) * _phi(eta) * sq) ** 2 / (muc * (1 - muc))))
    se = math.sqrt(disp / info) if info > 0 else float("nan")
    # The interval of c_law = 2/kappa² maps from kappa's (a monotone transform).
    lo_k, hi_k = k - Z95 * se, k + Z95 * se
    ci = (2 / hi_k**2, 2 / lo_k**2 if lo_k > 0 else float("inf"))
    return LawFit(
        kappa=k,
        kappa_se=se,
        c_law=2 / k**2,
        c_law_ci=ci,
        dispersion=disp,
        n=len(r),
        rmse=float(np.sqrt(np.mean((y - mu) ** 2))),
    )


def _floor(spec: ScalingConfig, nf: np.ndarray, V: np.ndarray) -> np.ndarray:
    f = spec.floor
    if f == "table":
        return 1.0 / nf
    if f == "marginal":
        return 1.0 / (V - V // 2)
    if f == "none":
        return np.zeros_like(nf, dtype=float)
    return np.full(len(nf), float(f))


def grid_points(trials: pd.DataFrame, cfg: AnalysisConfig) -> pd.DataFrame:
    """One row per grid point: ``group, V, D, N_eff, Nf, r, acc, n_seeds, floor``
    (see the module docstring for the seed reduction and the floor)."""
    spec = cfg.scaling or ScalingConfig()
    need = {"D": spec.D, "N": spec.N, "Nf": spec.Nf, "V": spec.V}
    if spec.layers:
        need["layers"] = spec.layers
    for role, name in need.items():
        if name not in trials.columns:
            raise UserError(
                f"scaling: {role} = {name!r} is not a parameter of this sweep "
                "(set analysis.scaling." + role + " to its name)"
            )
    frame = pd.DataFrame({"group": labels(trials, cfg.by).to_numpy()})
    for role in ("D", "N", "Nf", "V"):
        col = pd.to_numeric(trials[need[role]], errors="coerce").to_numpy(dtype=float)
        if np.isnan(col).any() or (col <= 0).any():
            raise UserError(
                f"scaling: {role} ({need[role]!r}) must be a positive number on "
                "every trial (some are missing or not positive)"
            )
        frame[role] = col
    layers = (
        pd.to_numeric(trials[need["layers"]], errors="coerce").fillna(1.0).to_numpy(dtype=float)
        if spec.layers
        else np.ones(len(trials))
    )
    frame["N_eff"] = frame["N"] * layers
    frame["acc"] = trials["metric_acc"].astype(float).to_numpy()
    frame = frame[frame["acc"].notna()]
    keys = ["group", "V", "D", "N_eff", "Nf"]
    if spec.seeds == "all":
        pts = frame.assign(n_seeds=1)[keys + ["acc", "n_seeds"]]
    else:
        agg = "max" if spec.seeds == "best" else "mean"
        pts = frame.groupby(keys, sort=True).agg(acc=("acc", agg), n_seeds=("acc", "size")).reset_index()
    pts = pts.assign(r=pts["N_eff"] * pts["D"] / pts["Nf"])
    pts["floor"] = _floor(spec, pts["Nf"].to_numpy(), pts["V"].to_numpy())
    return pts.reset_index(drop=True)


@dataclass
class VocabFit:
    """The free fit at one vocabulary of one group."""

    V: float
    n_points: int
    r_star: float | None
    r_star_ci: tuple[float, float] | None
    beta: float | None
    rmse: float | None
    note: str = ""


@dataclass
class GroupFit:
    group: str
    vocabs: list[VocabFit]
    law: LawFit | None
    slope: float | None
    slope_ci: tuple[float, float] | None
    law_rmse_vs_free: tuple[float, float] | None  # (law rmse, free rmse) on the same points
    note: str = ""


@dataclass
class ScalingResult:
    """Fits of every group; ``summary`` has one row per (group, V)."""

    cfg: ScalingConfig
    by: list[str]
    metric: str
    points: pd.DataFrame
    groups: list[GroupFit] = field(default_factory=list)

    @property
    def summary(self) -> pd.DataFrame:
        rows = []
        for g in self.groups:
            for v in g.vocabs:
                law_r = 2 * math.log(v.V) / g.law.kappa**2 if g.law else float("nan")
                rows.append(
                    {
                        "group": g.group,
                        "V": int(v.V),
                        "points": v.n_points,
                        "r_star": _nan(v.r_star),
                        "ci_low": _nan(v.r_star_ci[0] if v.r_star_ci else None),
                        "ci_high": _nan(v.r_star_ci[1] if v.r_star_ci else None),
                        "r_star_over_lnV": _nan(v.r_star) / math.log(v.V),
                        "law_r_star": law_r,
                        "beta": _nan(v.beta),
                        "rmse": _nan(v.rmse),
                        "note": v.note,
                    }
                )
        return pd.DataFrame(
            rows,
            columns=[
                "group",
                "V",
                "points",
                "r_star",
                "ci_low",
                "ci_high",
                "r_star_over_lnV",
                "law_r_star",
                "beta",
                "rmse",
                "note",
            ],
        )

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "analysis": "scaling",
                "variable": "r = N_eff*D/Nf",
                "by": self.by,
                "metric": self.metric,
                "config": self.cfg.model_dump(),
                "summary": self.summary,
                "groups": [
                    {
                        "group": g.group,
                        "law": None
                        if g.law is None
                        else {
                            "kappa": g.law.kappa,
                            "kappa_se": g.law.kappa_se,
                            "c_law": g.law.c_law,
                            "c_law_ci": list(g.law.c_law_ci),
                            "dispersion": g.law.dispersion,
                            "n_points": g.law.n,
                            "rmse": g.law.rmse,
                        },
                        "slope_lnrstar_on_lnlnV": g.slope,
                        "slope_ci": list(g.slope_ci) if g.slope_ci else None,
                        "rmse_law_vs_free": list(g.law_rmse_vs_free) if g.law_rmse_vs_free else None,
                        "note": g.note,
                    }
                    for g in self.groups
                ],
                "points": self.points,
            }
        )

    def text(self) -> str:
        s = self.cfg
        floor = {"table": "1/Nf", "marginal": "1/(V - V//2)", "none": "0"}.get(
            s.floor if isinstance(s.floor, str) else "", f"{s.floor:g}" if not isinstance(s.floor, str) else s.floor
        )
        n_eff = f"{s.layers} x {s.N}" if s.layers else s.N
        out = [
            f"recall scaling: {self.metric} accuracy vs r = N_eff*D/Nf (N_eff = {n_eff}, "
            f"D = {s.D}, Nf = {s.Nf}, V = {s.V}); {s.seeds} over seeds per grid point; "
            f"floor c = {floor}",
            "free fit per V: acc = c + (1-c) Phi(a + b sqrt(r)), boundary r* = (a/b)^2 "
            "(95% CI); law: acc = c + (1-c) Phi(kappa sqrt(r) - sqrt(2 ln V)), boundary "
            "r* = c_law ln V, c_law = 2/kappa^2 (N*D = c_law Nf ln V)",
        ]
        for g in self.groups:
            out.append("")
            out.append(f"group {g.group}" + (f" ({g.note})" if g.note else ""))
            out.append(
                f"  {'V':>7} {'points':>6} {'r* fitted':>10} {'95% CI':>21} "
                f"{'r*/ln V':>8} {'law c_law ln V':>14} {'slope b':>8}  note"
            )
            for v in g.vocabs:
                law_r = 2 * math.log(v.V) / g.law.kappa**2 if g.law else float("nan")
                ci = f"[{v.r_star_ci[0]:.3g}, {v.r_star_ci[1]:.3g}]" if v.r_star_ci else "-"
                out.append(
                    f"  {int(v.V):>7} {v.n_points:>6} {_fmt(v.r_star):>10} {ci:>21} "
                    f"{_fmt(None if v.r_star is None else v.r_star / math.log(v.V)):>8}"
                    f" {_fmt(law_r):>14} {_fmt(v.beta):>8}  {v.note}"
                )
            if g.law:
                lw = g.law
                out.append(
                    f"  law: kappa = {lw.kappa:.4g} (se {lw.kappa_se:.2g}), c_law = "
                    f"{lw.c_law:.4g} [{lw.c_law_ci[0]:.3g}, {lw.c_law_ci[1]:.3g}] over "
                    f"{lw.n} points"
                    + (
                        f"; rmse law {g.law_rmse_vs_free[0]:.3f} vs free fits {g.law_rmse_vs_free[1]:.3f}"
                        if g.law_rmse_vs_free
                        else ""
                    )
                )
            if g.slope is not None:
                ci = f" [{g.slope_ci[0]:.3g}, {g.slope_ci[1]:.3g}]" if g.slope_ci else ""
                out.append(f"  slope of ln r* on ln ln V: {g.slope:.3g}{ci} (Omega(Nf log V) predicts 1)")
        return "\n".join(out)


def _nan(v) -> float:
    return float("nan") if v is None else float(v)


def _fmt(v) -> str:
    return "-" if v is None or v != v else f"{v:.4g}"


def _free_fit(pts: pd.DataFrame, V: float) -> VocabFit:
    n = len(pts)
    if n < 3 or pts["r"].nunique() < 2:
        return VocabFit(V, n, None, None, None, None, "too few grid points")
    u = (pts["acc"] - pts["floor"]) / (1 - pts["floor"])
    if (u < 0.5).all() or (u >= 0.5).all():
        side = "above the largest" if (u < 0.5).all() else "below the smallest"
        return VocabFit(V, n, None, None, None, None, f"boundary {side} r of the grid")
    f = fit_probit(np.sqrt(pts["r"].to_numpy()), pts["acc"].to_numpy(), pts["floor"].to_numpy())
    if f.x50 <= 0:
        return VocabFit(V, n, None, None, f.beta, f.rmse, "boundary below r = 0")
    ci = None
    if f.x50_se == f.x50_se:
        ci = (max(f.x50 - Z95 * f.x50_se, 0.0) ** 2, (f.x50 + Z95 * f.x50_se) ** 2)
    note = "step-like (slope at its cap)" if f.at_bound else ""
    return VocabFit(V, n, f.x50**2, ci, f.beta, f.rmse, note)


def analyze(trials: pd.DataFrame, cfg: AnalysisConfig) -> ScalingResult:
    """Every group's free fits per V, its law fit and the boundary slope (see the module
    docstring). ``trials`` carry their events (``metric_acc``)."""
    spec = cfg.scaling or ScalingConfig()
    pts = grid_points(trials, cfg)
    res = ScalingResult(cfg=spec, by=list(cfg.by), metric=cfg.metric, points=pts)
    for g in ordered(trials, cfg.by):
        gp = pts[pts["group"] == g]
        if gp.empty:
            continue
        vfits = [_free_fit(gp[gp["V"] == V], float(V)) for V in sorted(gp["V"].unique())]
        law, note, rm = None, "", None
        if len(gp) >= 2 and gp["r"].nunique() >= 2:
            law = fit_law(gp["r"].to_numpy(), gp["V"].to_numpy(), gp["acc"].to_numpy(), gp["floor"].to_numpy())
            free_sq, n_free = 0.0, 0
            for v in vfits:
                if v.rmse is not None:
                    free_sq += v.rmse**2 * v.n_points
                    n_free += v.n_points
            if n_free:
                sub = gp[gp["V"].isin([v.V for v in vfits if v.rmse is not None])]
                mu = sub["floor"] + (1 - sub["floor"]) * _Phi(
                    law.kappa * np.sqrt(sub["r"]) - np.sqrt(2 * np.log(sub["V"]))
                )
                rm = (float(np.sqrt(np.mean((sub["acc"] - mu) ** 2))), math.sqrt(free_sq / n_free))
        else:
            note = "too few grid points for the law fit"
        slope, slope_ci = _slope(vfits)
        res.groups.append(
            GroupFit(group=g, vocabs=vfits, law=law, slope=slope, slope_ci=slope_ci, law_rmse_vs_free=rm, note=note)
        )
    if not res.groups:
        raise UserError("scaling: no trials with an accuracy to fit")
    return res


def _slope(vfits: list[VocabFit]) -> tuple[float | None, tuple[float, float] | None]:
    """Inverse-variance weighted slope of ln r* on ln ln V over the fitted vocabularies."""
    ok = [(v, v.r_star) for v in vfits if v.r_star is not None and v.V > math.e]
    if len(ok) < 2:
        return None, None
    x = np.log(np.log([v.V for v, _ in ok]))
    y = np.log([r for _, r in ok])
    # ln r* = 2 ln sqrt(r*): its se is 2 se(sqrt r*) / sqrt r*, read back from the CI.
    se = np.array(
        [
            2 * (math.sqrt(v.r_star_ci[1]) - math.sqrt(v.r_star_ci[0])) / (2 * Z95) / math.sqrt(r)
            if v.r_star_ci
            else float("nan")
            for v, r in ok
        ]
    )
    w = 1 / se**2 if np.all(np.isfinite(se)) and np.all(se > 0) else np.ones(len(ok))
    xm = np.sum(w * x) / w.sum()
    ym = np.sum(w * y) / w.sum()
    sxx = float(np.sum(w * (x - xm) ** 2))
    if sxx == 0:
        return None, None
    b = float(np.sum(w * (x - xm) * (y - ym)) / sxx)
    if not (np.all(np.isfinite(se)) and np.all(se > 0)):
        return b, None
    s = math.sqrt(1 / sxx)
    return b, (b - Z95 * s, b + Z95 * s)
