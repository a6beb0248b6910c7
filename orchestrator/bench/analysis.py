"""``orchestrator bench analysis``: the hazard fit timed straight from a database.

A synthetic sweep (trials x eval points drawn from a known discrete-time hazard model, a
basin-map-like grid of lr x vocab_size x variant) is written into a SQLite file through
the store's own repo functions, then the fit is timed the way a user runs it: load from
SQL, extract events, expand to person-periods, fit the GLM.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np

BENCH_FORMULA = "np.log(t) + C(lr) + C(vocab_size) + C(variant)"
LRS = (1e-3, 3e-3, 1e-2)
VOCABS = (80, 88, 96)
VARIANTS = ("baseline", "ns5")


class _Effects(TypedDict):
    intercept: float
    log_t: float
    lr: dict[float, float]
    vocab: dict[int, float]
    ns5: float


# log hazard-odds effects of the simulated model (intercept at t = 1000 steps).
TRUE_EFFECTS: _Effects = {
    "intercept": -4.4,
    "log_t": 0.5,
    "lr": {1e-3: 0.0, 3e-3: 1.0, 1e-2: -0.8},
    "vocab": {80: 0.0, 88: -0.7, 96: -1.5},
    "ns5": math.log(6.0),
}


def simulate_trials(
    n_trials: int, n_evals: int, eval_every: int = 200, seed: int = 0
) -> tuple[list[dict[str, Any]], list[list[tuple[int, float, float]]]]:
    """``(params, traces)``: each trace is ``[(step, acc, loss), ...]`` at steps 1,
    eval_every, 2*eval_every, ...; escapes follow the logit hazard of TRUE_EFFECTS, and a
    share of the hottest-lr baseline trials collapse to zero accuracy instead."""
    rng = np.random.default_rng(seed)
    steps = [1] + [eval_every * k for k in range(1, n_evals)]
    params, traces = [], []
    for i in range(n_trials):
        lr = LRS[i % 3]
        vocab = VOCABS[(i // 3) % 3]
        variant = VARIANTS[(i // 9) % 2]
        p = {
            "arm": "mlstm",
            "task": "mad_recall",
            "seed": i // 18,
            "lr": lr,
            "batch_size": 16,
            "steps": steps[-1],
            "eval_every": eval_every,
            "schedule": "constant",
            "model.read": "ns5" if variant == "ns5" else "raw",
            "task.vocab_size": vocab,
            "task.seq_len": 768,
            "tag.variant": variant,
        }
        base = (
            TRUE_EFFECTS["intercept"]
            + TRUE_EFFECTS["lr"][lr]
            + TRUE_EFFECTS["vocab"][vocab]
            + (TRUE_EFFECTS["ns5"] if variant == "ns5" else 0.0)
        )
        collapse_at = None
        if lr == 1e-2 and variant == "baseline" and rng.random() < 0.5:
            collapse_at = int(rng.integers(2, max(3, n_evals)))
        trace, escaped = [], False
        chance = 1.0 / vocab
        for k, s in enumerate(steps):
            if k >= 1 and not escaped and (collapse_at is None or k <= collapse_at):
                eta = base + TRUE_EFFECTS["log_t"] * math.log(s / 1000)
                escaped = rng.random() < 1.0 / (1.0 + math.exp(-eta))
            if escaped:
                acc = min(0.999, 0.85 + 0.1 * rng.random())
            elif collapse_at is not None and k >= collapse_at:
                acc = 0.0
            else:
                acc = chance * (0.8 + 0.4 * rng.random())
            trace.append((s, acc, -math.log(max(acc, 1e-3))))
        params.append(p)
        traces.append(trace)
    return params, traces


def build_db(url: str, n_trials: int, n_evals: int, sweep: str = "bench_analysis", seed: int = 0) -> float:
    """Write the synthetic sweep into ``url`` through the repo; returns seconds taken."""
    from orchestrator.store import repo
    from orchestrator.store.engine import open_store_engine

    from orchestrator.keys import trial_key
    from orchestrator.status import Status

    t0 = time.perf_counter()
    params, traces = simulate_trials(n_trials, n_evals, seed=seed)
    engine, _ = open_store_engine(url)
    keyed = [(trial_key(p), p) for p in params]
    with engine.begin() as conn:
        sid = repo.upsert_sweep(conn, sweep, "# synthetic: orchestrator bench analysis\n", "bench")
        ids = repo.add_trials(conn, sid, keyed)
        rows = [
            {"trial_id": ids[k], "step": s, "acc": a, "loss": loss}
            for (k, _), tr in zip(keyed, traces)
            for s, a, loss in tr
        ]
        repo.upsert_evals(conn, rows)
        for k, _ in keyed:
            repo.finish_trial(conn, ids[k], Status.completed.value)
    engine.dispose()
    return time.perf_counter() - t0


@dataclass
class BenchResult:
    n_trials: int
    n_evals: int
    n_eval_rows: int
    n_intervals: int
    n_events: int
    build_s: float
    load_s: float
    expand_s: float
    fit_s: float
    ns5_hr: float
    ns5_ci: tuple[float, float]

    @property
    def total_s(self) -> float:
        return self.load_s + self.expand_s + self.fit_s

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.__dict__,
            "ns5_ci": list(self.ns5_ci),
            "total_s": self.total_s,
            "goal_s": 10.0,
            "true_ns5_hr": math.exp(TRUE_EFFECTS["ns5"]),
        }


def time_hazard(url: str, sweep: str = "bench_analysis") -> BenchResult:
    """Time load + events, person-period expansion and the GLM fit from ``url``."""
    from orchestrator.analysis.pipeline import prepare
    from orchestrator.analysis.hazard import fit_hazard
    from orchestrator.analysis.person_period import person_period

    t0 = time.perf_counter()
    prep = prepare(url, sweep)
    t1 = time.perf_counter()
    pp = person_period(prep.data.evals, prep.trials)
    t2 = time.perf_counter()
    res = fit_hazard(pp, BENCH_FORMULA, "logit")
    t3 = time.perf_counter()
    row = res.summary.loc["C(variant)[T.ns5]"]
    return BenchResult(
        n_trials=len(prep.trials),
        n_evals=int(prep.trials["n_evals"].max()),
        n_eval_rows=len(prep.data.evals),
        n_intervals=res.n_intervals,
        n_events=res.n_events,
        build_s=float("nan"),
        load_s=t1 - t0,
        expand_s=t2 - t1,
        fit_s=t3 - t2,
        ns5_hr=float(row["hr"]),
        ns5_ci=(float(row["ci_low"]), float(row["ci_high"])),
    )
