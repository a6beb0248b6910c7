"""`orchestrator bench overhead`: what the orchestration costs on top of the training itself.

N trials of a fixed duration S (the ``bench_sleep`` plugin cell of
``orchestrator/bench/fixed_duration.py``: a tiny real model whose every training step sleeps
S/steps) go through the whole product path: a spec, ``runner.sweep.submit`` (the lease, the
store rows), Ray Tune, the trainable, the driver's writer, the database, as
``orchestrator submit --quiet`` runs them (the progress bar is the CLI's, left out). The
ideal is N*S/slots. The same trials then run through plain Ray Tune at its best setting
(``reuse_actors=True``, everything else Tune's defaults) in a fresh interpreter: the same
Trainer, its eval points reported to Tune and dropped, no database and no checkpoints.

Figures: ``wall_s``, ``ideal_s``, ``overhead`` (wall/ideal - 1) for both, each wall from
before Ray starts to after it is shut down (plain Tune's up to ``fit()``'s return as
``tune_fit_s``); the driver's peak RSS (VmHWM of the process that ran the sweep, and of plain
Tune's); eval rows stored per second of wall time; the trials' own mean duration (from their
last eval's ``elapsed_s``), which splits the overhead into the trial's own (model setup,
eval) and the orchestration's; and the per-trial costs a capacity model scales
(docs/SCALING.md): the driver's CPU time, database transactions and statements per trial,
and the database's size.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

STEPS = 10  # training steps per trial; each sleeps S/STEPS
EVAL_EVERY = 5  # eval rows at steps 1, 5 and 10

# The trial's fixed part: a tiny MQAR model (d 8, one layer) whose steps sleep.
PARAMS: dict[str, Any] = {
    "arm": "bench_sleep",
    "task": "mqar",
    "task.K": 2,
    "task.eval_size": 16,
    "d_model": 8,
    "batch_size": 2,
    "eval_every": EVAL_EVERY,
    "steps": STEPS,
}
PLUGIN = "orchestrator.bench.fixed_duration"


RSS_POINTS = 10  # the RSS curve's points: the driver's memory at each tenth of the trials


NOT_COUNTED = "bench_overhead_not_counted"
_ENDED = sa.text(
    "SELECT COUNT(*) FROM trials t JOIN sweeps s ON s.id = t.sweep_id "
    "WHERE s.name = 'bench_overhead' AND t.status NOT IN ('pending', 'running')"
)


class _RssByTrials:
    """The driver's RSS as the sweep's trials finish: sampled every ``every_s`` with the
    count of ended trials, kept as the largest RSS seen while the count was in each tenth of
    the total. A driver whose memory grows with history shows a rising curve; a flat one,
    the state of finished trials let go (the peak alone cannot tell the two apart)."""

    def __init__(self, url: str, trials: int, every_s: float = 1.0) -> None:
        import threading

        self.url, self.trials, self.every_s = url, trials, every_s
        self.by_tenth: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _RssByTrials:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        from orchestrator.bench.ui import rss_mb
        from orchestrator.store.engine import make_engine, resolve_url

        engine = None
        while not self._stop.wait(self.every_s):
            try:
                if engine is None:
                    engine = make_engine(resolve_url(self.url, None))  # --db may be a bare path
                with engine.connect() as conn:
                    conn.info[NOT_COUNTED] = True  # the sampler's reads are not the driver's
                    done = conn.execute(_ENDED).scalar_one()
            except Exception:  # the schema is not made yet: sample later
                continue
            tenth = min(RSS_POINTS - 1, int(RSS_POINTS * done / max(1, self.trials)))
            self.by_tenth[tenth] = max(self.by_tenth.get(tenth, 0.0), rss_mb())
        if engine is not None:
            engine.dispose()

    def curve(self) -> list[float | None]:
        return [self.by_tenth.get(i) for i in range(RSS_POINTS)]


def _peak_rss_mb() -> float:
    """This process's peak resident memory. VmHWM, not ``ru_maxrss``: the latter survives
    fork and exec, so a fresh interpreter would report its parent's peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def spec_text(trials: int, trial_seconds: float, slots: int) -> str:
    fixed = {k: v for k, v in PARAMS.items() if k not in ("steps", "eval_every")}
    fixed["model.step_ms"] = 1000.0 * trial_seconds / STEPS
    return (
        "name: bench_overhead\n"
        f"plugins: [{PLUGIN}]\n"
        f"fixed: {json.dumps(fixed)}\n"
        f"axes: {{seed: 0..{trials - 1}}}\n"
        f"budget: {{steps: {STEPS}, eval_every: {EVAL_EVERY}}}\n"
        "resources: {cpu: 1}\n"
        "pack_seeds: 1\n"
        f"max_concurrent: {slots}\n"
    )


def _joiners(url: str, drivers: int, per_driver: int, started: list[subprocess.Popen]) -> None:
    """``drivers - 1`` ``orchestrator join`` processes (each with a local Ray of its own), started
    as soon as the submit has recorded the sweep."""
    import sqlalchemy as sa

    from orchestrator.store.engine import make_engine

    engine = make_engine(url)
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline:
            try:
                with engine.connect() as conn:
                    if conn.execute(sa.text("SELECT COUNT(*) FROM trials")).scalar():
                        break
            except sa.exc.DBAPIError:  # not made yet
                pass
            time.sleep(0.2)
    finally:
        engine.dispose()
    env = {**os.environ, "RAY_ADDRESS": "local"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH")]))
    for _ in range(drivers - 1):
        cmd = [sys.executable, "-m", "orchestrator.cli", "join", "bench_overhead", "--db", url, "-q"]
        # stdout (its outcome line) would mix with this command's --json
        started.append(
            subprocess.Popen([*cmd, "--max-concurrent", str(per_driver)], env=env, stdout=subprocess.DEVNULL)
        )


def product(trials: int, trial_seconds: float, slots: int, db: str | None = None, drivers: int = 1) -> dict[str, Any]:
    """The trials through ``runner.sweep.submit`` into ``db`` (default: a fresh SQLite file);
    with ``drivers`` > 1, that many drivers share the slots: the submit and ``drivers - 1``
    ``orchestrator join`` processes, each running ``slots // drivers`` trials at once."""
    import threading

    import sqlalchemy as sa

    from orchestrator import spec as specs
    from orchestrator.runner.sweep import RunOptions, submit
    from orchestrator.store import dialect
    from orchestrator.store.engine import open_store_engine

    # What the driver asks of the database: its transactions and statements (lease renewals
    # and every write of the run, the raw fast paths' included), counted on every engine of
    # this process.
    counts = {"commits": 0, "statements": 0}

    def on_commit(conn) -> None:
        if not conn.info.get(NOT_COUNTED):
            counts["commits"] += 1

    def on_statement(conn, cursor, statement, parameters, context, executemany) -> None:
        if not conn.info.get(NOT_COUNTED):
            counts["statements"] += 1

    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as d:
        url = db or f"sqlite:///{Path(d) / 'overhead.db'}"
        sweep = specs.load(text=spec_text(trials, trial_seconds, slots))
        sa.event.listen(sa.engine.Engine, "commit", on_commit)
        sa.event.listen(sa.engine.Engine, "before_cursor_execute", on_statement)
        raw0 = dialect.raw_statements.sent  # the fast paths' statements, which the events miss
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        per_driver = max(1, slots // drivers)
        joined: list[subprocess.Popen] = []
        spawner = threading.Thread(target=_joiners, args=(url, drivers, per_driver, joined), daemon=True)
        if drivers > 1:
            spawner.start()
        try:
            with _RssByTrials(url, trials) as rss:
                summary = submit(sweep, RunOptions(db=url, max_concurrent=per_driver))
            if drivers > 1:
                spawner.join()
                for p in joined:
                    p.wait(timeout=3600)
        finally:
            wall = time.perf_counter() - t0
            cpu1 = resource.getrusage(resource.RUSAGE_SELF)
            counts["statements"] += dialect.raw_statements.sent - raw0
            sa.event.remove(sa.engine.Engine, "commit", on_commit)
            sa.event.remove(sa.engine.Engine, "before_cursor_execute", on_statement)
        engine, _ = open_store_engine(url)
        with engine.connect() as conn:
            rows, own = conn.execute(
                sa.text(
                    "SELECT COUNT(*), SUM(CASE WHEN e.step = t.steps THEN e.elapsed_s END) "
                    "FROM evals e JOIN trials t ON t.id = e.trial_id "
                    "JOIN sweeps s ON s.id = t.sweep_id WHERE s.name = 'bench_overhead'"
                )
            ).one()
            size = dialect.for_connection(conn).database_bytes(conn)  # url may be a plain path
            by_driver = [
                int(n)
                for (n,) in conn.execute(
                    sa.text("SELECT COUNT(*) FROM attempts GROUP BY driver ORDER BY COUNT(*) DESC")
                ).all()
            ]
        engine.dispose()
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    curve = rss.curve()
    # VmHWM can read below an RSS sampled earlier: the kernel raises its high-water mark
    # only at some points (unmaps, exit), from per-CPU counters that may lag the exact
    # VmRSS (a CI run saw a curve point above it). The peak is the largest of them all.
    peak = max([_peak_rss_mb(), *(m for m in curve if m is not None)])
    return {
        "wall_s": wall,
        "outcomes": summary.outcomes,
        "tune_trials": summary.tune_trials,
        "eval_rows": int(rows),
        "rows_per_s": rows / wall,
        "trial_own_s": (own or 0.0) / trials,
        "peak_rss_mb": peak,
        "rss_by_tenth_mb": curve,
        "driver_cpu_s": cpu,
        "db_commits": counts["commits"],
        "db_statements": counts["statements"],
        "database_bytes": size,
        "attempts_per_driver": by_driver,
        "joined_exit_codes": [p.returncode for p in joined],
    }


def _plain_trainable(config: dict[str, Any]) -> None:
    from ray import tune

    import orchestrator.bench.fixed_duration  # noqa: F401  (registers the cell in the worker)
    from orchestrator.train import Trainer

    for point in Trainer(config["params"]).run():
        tune.report({"step": point.step, "acc": point.acc})


def plain_tune(trials: int, trial_seconds: float, slots: int) -> dict[str, Any]:
    """The same trials through plain Ray Tune (reuse_actors=True); run in a fresh interpreter
    (``python -m orchestrator.bench.overhead``) so that none of the product's settings apply."""
    import ray
    from ray import tune

    import orchestrator.bench.fixed_duration  # noqa: F401

    params = {**PARAMS, "model.step_ms": 1000.0 * trial_seconds / STEPS}
    with tempfile.TemporaryDirectory(prefix="bench-tune-") as d:
        t0 = time.perf_counter()
        ray.init(num_cpus=slots, include_dashboard=False, log_to_driver=False)
        tuner = tune.Tuner(
            tune.with_resources(_plain_trainable, {"cpu": 1}),
            param_space={"params": tune.grid_search([{**params, "seed": i} for i in range(trials)])},
            tune_config=tune.TuneConfig(reuse_actors=True, max_concurrent_trials=slots),
            run_config=tune.RunConfig(storage_path=d, name="plain", verbose=0),
        )
        grid = tuner.fit()
        errors = grid.num_errors
        fit = time.perf_counter() - t0
        # The product's wall ends once its embedded Ray is shut down (``submit`` returns
        # then): so does this one, or the side-by-side would credit Tune with the 1-2 s
        # every driver waits for Ray's processes to stop.
        ray.shutdown()
        wall = time.perf_counter() - t0
    return {"wall_s": wall, "fit_s": fit, "errors": errors, "peak_rss_mb": _peak_rss_mb()}


def _plain_in_subprocess(trials: int, trial_seconds: float, slots: int) -> dict[str, Any]:
    code = [sys.executable, "-m", "orchestrator.bench.overhead", str(trials), str(trial_seconds), str(slots)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TUNE_", "RAY_AIR"))}
    r = subprocess.run(code, capture_output=True, text=True, env=env, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"plain Ray Tune run failed: {r.stderr.strip().splitlines()[-1:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def run(
    trials: int,
    trial_seconds: float,
    slots: int | None = None,
    db: str | None = None,
    tune: bool = True,
    drivers: int = 1,
) -> dict[str, Any]:
    slots = slots or os.cpu_count() or 1
    ideal = trials * trial_seconds / min(slots, trials)

    def over(wall: float) -> float | None:  # none for trials of no training time
        return wall / ideal - 1 if ideal > 0 else None

    out: dict[str, Any] = {
        "trials": trials,
        "trial_seconds": trial_seconds,
        "slots": slots,
        "drivers": drivers,
        "ideal_s": ideal,
        "load_before": os.getloadavg()[0],
    }
    p = product(trials, trial_seconds, slots, db, drivers)
    out.update(
        wall_s=p["wall_s"],
        overhead=over(p["wall_s"]),
        driver_peak_rss_mb=p["peak_rss_mb"],
        # The driver's RSS at each tenth of the trials ended (None: no sample fell there).
        driver_rss_by_tenth_mb=p["rss_by_tenth_mb"],
        rows_per_s=p["rows_per_s"],
        eval_rows=p["eval_rows"],
        trial_own_s=p["trial_own_s"],
        outcomes=p["outcomes"],
        attempts_per_driver=p["attempts_per_driver"],
        # Ray Tune trials the (first) driver started: fewer than its trials once they chain.
        tune_trials=p["tune_trials"],
        joined_exit_codes=p["joined_exit_codes"],
        # Per-trial costs on the driver and the database (the capacity model's units).
        driver_cpu_s=p["driver_cpu_s"],
        driver_cpu_ms_per_trial=1e3 * p["driver_cpu_s"] / trials,
        db_commits_per_trial=p["db_commits"] / trials,
        db_statements_per_trial=p["db_statements"] / trials,
        database_bytes=p["database_bytes"],
    )
    if tune:
        t = _plain_in_subprocess(trials, trial_seconds, slots)
        out.update(
            tune_wall_s=t["wall_s"],
            # Up to fit()'s return, before Ray's shutdown (what tune_wall_s was before 2026-12).
            tune_fit_s=t["fit_s"],
            tune_overhead=over(t["wall_s"]),
            tune_driver_peak_rss_mb=t["peak_rss_mb"],
            tune_errors=t["errors"],
            vs_tune=p["wall_s"] / t["wall_s"] - 1,
        )
    out["load_after"] = os.getloadavg()[0]
    return out


if __name__ == "__main__":  # the plain-Tune half, in its own interpreter
    n, s, k = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    print(json.dumps(plain_tune(n, s, k)))
