"""orchestrator bench store | pack | ui | overhead | checkpoints: the benchmarks that print
the product's speed and memory figures."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import typer

from orchestrator.cli.app import bench_app


def _emit(result: dict, as_json: bool, show: Callable[[dict], None], **dumps: Any) -> int:
    """A benchmark's ``result`` as indented JSON (``--json``), else in the words ``show``
    prints; the exit code."""
    if as_json:
        print(json.dumps(result, indent=2, **dumps))
    else:
        show(result)
    return 0


@bench_app.command("store")
def bench_store(
    rows: int = typer.Option(200_000, help="eval rows to ingest per backend"),
    rounds: int = typer.Option(3, help="ingest rounds per backend, each on a fresh database (the fastest counts)"),
    postgres: Optional[str] = typer.Option(
        None, "--postgres", help="PostgreSQL URL to measure too (default $ORCH_TEST_POSTGRES_URL)"
    ),
    steps: int = typer.Option(300, help="steps of the streaming-slowdown trial"),
    sweep_trials: int = typer.Option(64, help="trials in the sweep-efficiency run (0 skips)"),
    sweep_steps: int = typer.Option(1000, help="steps per trial in the sweep-efficiency run"),
    as_json: bool = typer.Option(False, "--json"),
) -> int:
    """Rows/s into SQLite and PostgreSQL beside each backend's bulk load, streaming slowdown, sweep training share."""
    import tempfile

    from orchestrator.bench import store as b

    from orchestrator.errors import UserError

    if rounds < 1:
        raise UserError(f"--rounds {rounds}: expected at least 1")
    result: dict = {}
    done = []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as d:
            done.append(b.ingest(f"sqlite:///{Path(d) / 'ingest.db'}", rows))
    result["sqlite_ingest"] = b.best_of(done)
    pg = postgres or os.environ.get("ORCH_TEST_POSTGRES_URL")
    if pg:
        from orchestrator.bench.pg import scratch_schema

        done = []
        for _ in range(rounds):
            with scratch_schema(pg) as url:
                done.append(b.ingest(url, rows))
        result["postgres_ingest"] = b.best_of(done)
    result["streaming"] = b.streaming_slowdown(steps)
    if sweep_trials:
        result["sweep"] = b.sweep_efficiency(sweep_trials, sweep_steps)
    return _emit(result, as_json, _print_store, default=str)


def _print_store(result: dict) -> None:
    for key, label in (("sqlite_ingest", "SQLite ingest:    "), ("postgres_ingest", "PostgreSQL ingest:")):
        if key in result:
            g = result[key]
            print(
                f"{label} {g['rows_per_s']:>10,.0f} rows/s through the writer; the bulk load ({g['ceiling']}) "
                f"of the same {g['rows']:,} rows in its batches of {g['batch']:,}, foreign key kept, "
                f"{g['ceiling_rows_per_s']:,.0f} rows/s: {100 * g['share_of_ceiling']:.0f}% of it (goal >= 50%); "
                f"without the key {100 * g['share_of_ceiling_no_fk']:.0f}%, in one go "
                f"{100 * g['share_of_ceiling_one_go']:.0f}%, both {100 * g['share_of_ceiling_one_go_no_fk']:.0f}% "
                f"({g['ceiling_one_go_no_fk_rows_per_s']:,.0f} rows/s); fastest of {g['rounds']} round(s)"
            )
    s = result["streaming"]
    print(
        f"streaming slowdown at eval_every=10: {s['slowdown_pct']:+.2f}% "
        f"(plain {s['plain_s']:.2f} s vs streaming {s['streaming_s']:.2f} s, median of "
        f"{len(s['plain_runs'])}; goal < 1%)"
    )
    if "sweep" in result:
        w = result["sweep"]
        print(
            f"sweep of {w['trials']} short trials ({w['mean_trial_s']:.1f} s each, "
            f"{w['slots']} slots): {100 * w['training_share']:.1f}% of wall time training "
            f"(wall {w['wall_s']:.0f} s; goal >= 90%)"
        )


@bench_app.command("pack")
def bench_pack(
    seeds: int = typer.Option(10, min=2, help="seeds (trials) per arm (a pack needs at least 2)"),
    steps: int = typer.Option(200, min=1, help="training steps per trial"),
    as_json: bool = typer.Option(False, "--json"),
) -> int:
    """Trials/hour: one trial per process vs one seed pack (armed_gdn d=32, MQAR K=16)."""
    from orchestrator.bench import pack as b

    r = b.run(seeds=seeds, steps=steps)
    return _emit(r, as_json, _print_pack)


def _print_pack(r: dict) -> None:
    print(f"{r['seeds']} seeds x {r['steps']} steps on {r['cores']} cores:")
    print(f"  one trial per process: {r['lone_trials_per_hour']:8.0f} trials/h (wall {r['lone_wall_s']:.1f} s)")
    print(f"  one seed pack:         {r['pack_trials_per_hour']:8.0f} trials/h (wall {r['pack_wall_s']:.1f} s)")
    print(
        f"  speedup {r['speedup']:.2f}x (goal >= 5x on CPU, >= 20x on a GPU); "
        f"max final-accuracy difference {r['max_final_acc_diff']:.2e}"
    )


@bench_app.command("ui")
def bench_ui(
    trials: int = typer.Option(10_000, help="trials in the synthetic sweep"),
    evals: int = typer.Option(50, help="eval points per trial"),
    repeats: int = typer.Option(3, help="page loads (the first, cold one is the figure)"),
    browser: bool = typer.Option(False, "--browser", help="also time the page in headless Chromium (selenium)"),
    screenshot: Optional[Path] = typer.Option(
        None, help="with --browser: save the drawn page as this PNG", dir_okay=False, writable=True
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> int:
    """Server time for `orchestrator ui` to serve a big sweep's page and its JSON (and, with
    --browser, the time until headless Chromium has drawn it), and the server's memory
    before and after the loads (--repeats 100: after a hundred)."""
    from orchestrator.bench import ui as b
    from orchestrator.errors import UserError

    if repeats < 1:
        raise UserError(f"--repeats {repeats}: expected at least 1")
    if screenshot is not None and not browser:
        raise UserError("--screenshot needs --browser")
    r = b.run(n_trials=trials, n_evals=evals, repeats=repeats, browser=browser, screenshot=screenshot)
    return _emit(r, as_json, lambda r: _print_ui(r, repeats))


def _print_ui(r: dict, repeats: int) -> None:
    print(
        f"sweep of {r['n_trials']:,} trials x {r['n_evals']} evals ({r['eval_rows']:,} eval "
        f"rows; fixture built in {r['build_s']:.0f} s), first of {repeats} page loads:"
    )
    for path, v in r["requests"].items():
        print(f"  {path:<62} server {v['server_s']:6.3f} s  client {v['client_s']:6.3f} s  {v['bytes'] / 1e6:7.2f} MB")
    print(
        f"  sweep page + its JSON, first load: {r['first_total_s']:.2f} s of server time "
        f"(client wall {r['client_total_s']:.2f} s; goal < 3 s)"
    )
    print(
        "  every load (later ones reuse the prepared escape-time data): " + ", ".join(f"{x:.2f} s" for x in r["runs"])
    )
    if r["browser"]:
        p = r["browser"]
        print(
            f"  in Chromium, from navigation: traces and table drawn (interactive) {p['interactive_s']:.2f} s "
            f"(goal < 3 s), grid {p['grid_s']:.2f} s, escape-time curves {p['km_s']:.2f} s"
        )
    m = r["server_rss"]
    print(
        f"  server RSS: {m['before_mb']:.0f} MB before the loads, {m['after_first_mb']:.0f} MB after the first, "
        f"{m['after_last_mb']:.0f} MB after {repeats}; traces drawn as {r['traces_view']}"
    )
    e = r["eval_read"]
    print(
        f"  the sweep's evals read in-process: {e['columnar_s']:.2f} s through Arrow's driver (as the "
        f"page's child processes read), {e['tuples_s']:.2f} s as tuples (the reference)"
    )


@bench_app.command("overhead")
def bench_overhead(
    trials: int = typer.Option(1000, min=1, help="trials of the fixed-duration workload"),
    trial_seconds: float = typer.Option(1.0, min=0.0, max=3600.0, help="each trial's own training time (seconds)"),
    slots: Optional[int] = typer.Option(None, min=1, help="trials at once (default: this machine's CPUs)"),
    drivers: int = typer.Option(
        1, min=1, help="drivers sharing the slots: the submit and DRIVERS-1 `orchestrator join` processes"
    ),
    db: Optional[str] = typer.Option(None, "--db", help="database URL (default: a fresh SQLite file)"),
    tune: bool = typer.Option(True, "--tune/--no-tune", help="also run the workload through plain Ray Tune"),
    as_json: bool = typer.Option(False, "--json"),
) -> int:
    """Orchestration overhead: the whole product path vs the ideal N*S/slots and plain Ray Tune."""
    from orchestrator.bench import overhead as b

    r = b.run(trials, trial_seconds, slots=slots, db=db, tune=tune, drivers=drivers)
    return _emit(r, as_json, _print_overhead)


def _pct(x: float | None) -> str:
    return "n/a (no training time)" if x is None else f"{100 * x:+.1f}%"


def _print_overhead(r: dict) -> None:
    print(
        f"{r['trials']:,} trials x {r['trial_seconds']:g} s on {r['slots']} slots: ideal {r['ideal_s']:.1f} s, "
        f"wall {r['wall_s']:.1f} s, overhead {_pct(r['overhead'])} (goal <= 10%)"
    )
    print(
        f"  {r['drivers']} driver(s), attempts per driver {r['attempts_per_driver']}, "
        f"in {r['tune_trials']:,} Ray Tune trials (short trials run in chains); "
        f"driver peak RSS {r['driver_peak_rss_mb']:.0f} MB; {r['rows_per_s']:.1f} eval rows/s stored; "
        f"trials' own mean time {r['trial_own_s']:.3f} s"
    )
    curve = " ".join("-" if m is None else f"{m:.0f}" for m in r["driver_rss_by_tenth_mb"])
    print(f"  driver RSS (MB) at each tenth of the trials ended: {curve}")
    print(
        f"  per trial: {r['db_commits_per_trial']:.2f} commits, {r['db_statements_per_trial']:.1f} statements, "
        f"{r['driver_cpu_ms_per_trial']:.1f} ms of driver CPU"
    )
    if "tune_wall_s" in r:
        print(
            f"  plain Ray Tune (reuse_actors=True): wall {r['tune_wall_s']:.1f} s, overhead "
            f"{_pct(r['tune_overhead'])}; the product is {100 * r['vs_tune']:+.1f}% vs plain Tune (goal <= 0%)"
        )
    print(f"  load average {r['load_before']:.1f} before, {r['load_after']:.1f} after (2 cores: compare with care)")


@bench_app.command("checkpoints")
def bench_checkpoints(
    specs: list[str] = typer.Option(
        ["sweeps/factorial.yaml", "sweeps/basin_map.yaml"], "--spec", help="specs whose checkpoints to size"
    ),
    growth: str = typer.Option("sweeps/basin_map.yaml", "--growth", help="the sweep whose database growth to state"),
    postgres: Optional[str] = typer.Option(
        None, "--postgres", help="PostgreSQL URL to measure too (default $ORCH_TEST_POSTGRES_URL; '' for none)"
    ),
    steps: int = typer.Option(600, help="steps of the streaming trial (the quickstart's)"),
    repeats: int = typer.Option(3, min=1, help="side-by-side repeats (medians)"),
    rows: int = typer.Option(20_000, min=100, help="eval rows ingested to measure bytes per row"),
    as_json: bool = typer.Option(False, "--json"),
) -> int:
    """Checkpoint sizes, a sweep's database growth, and the streaming slowdown of storing
    checkpoints in the database vs as files (SQLite and PostgreSQL, side by side)."""
    import tempfile

    from orchestrator.bench import checkpoints as b

    result: dict = {"sizes": [b.sizes(s) for s in specs]}
    per_row = b.bytes_per_eval_row(rows)
    g = b.sizes(growth)
    result["growth"] = {
        "spec": growth,
        "trials": g["trials"],
        "bytes_per_eval_row": per_row,
        "checkpoint_bytes": g["trials"] * g["last_bytes"],
        "eval_bytes": g["trials"] * g["evals_per_trial"] * per_row,
    }
    result["growth"]["total_bytes"] = result["growth"]["checkpoint_bytes"] + result["growth"]["eval_bytes"]
    backends: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as d:
        backends["sqlite"] = f"sqlite:///{Path(d) / 'ckpt.db'}"
        # --postgres '' measures SQLite only
        pg = os.environ.get("ORCH_TEST_POSTGRES_URL") if postgres is None else (postgres or None)
        result["streaming"] = {}
        for cadence, every in (("quickstart", None), ("every_eval", 0.0)):
            result["streaming"][cadence] = {"sqlite": b.streaming(str(backends["sqlite"]), steps, repeats, every)}
            if pg:
                from orchestrator.bench.pg import scratch_schema

                with scratch_schema(pg) as url:
                    result["streaming"][cadence]["postgresql"] = b.streaming(url, steps, repeats, every)
        nbytes = result["sizes"][0]["last_bytes"]
        result["store_ms"] = {"file": b.store_cost(None, nbytes)["ms"]}
        result["store_ms"]["sqlite"] = b.store_cost(f"sqlite:///{Path(d) / 'cost.db'}", nbytes)["ms"]
        if pg:
            from orchestrator.bench.pg import scratch_schema

            with scratch_schema(pg) as url:
                result["store_ms"]["postgresql"] = b.store_cost(url, nbytes)["ms"]
    return _emit(result, as_json, _print_checkpoints, default=str)


def _print_checkpoints(result: dict) -> None:
    for s in result["sizes"]:
        print(
            f"{s['spec']}: {s['arm']} d {s['d_model']}: checkpoint {s['first_bytes'] / 1e3:,.0f} kB "
            f"after one step, {s['last_bytes'] / 1e3:,.0f} kB at the last ({s['evals_per_trial']} evals)"
        )
    w = result["growth"]
    print(
        f"{w['spec']} ({w['trials']} trials): database grows {w['total_bytes'] / 1e6:,.1f} MB "
        f"({w['checkpoint_bytes'] / 1e6:,.1f} MB checkpoints, {w['eval_bytes'] / 1e6:,.1f} MB eval rows "
        f"at {w['bytes_per_eval_row']:.0f} B a row)"
    )
    cost = ", ".join(f"{k} {v:.2f} ms" for k, v in result["store_ms"].items())
    print(f"storing one {result['sizes'][0]['last_bytes'] / 1e3:,.0f} kB checkpoint (median of 30): {cost}")
    for cadence, by in result["streaming"].items():
        for backend, r in by.items():
            print(
                f"streaming with database checkpoints ({cadence}, every {r['checkpoint_every_s']:g} s, {backend}): "
                f"{r['slowdown_pct']:+.2f}% vs file checkpoints ({r['file_s']:.2f} s vs {r['database_s']:.2f} s, "
                f"median of {len(r['file_runs'])}; goal < 2%)"
            )
