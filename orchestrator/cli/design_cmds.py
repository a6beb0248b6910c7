"""orchestrator design power | replay: seeds per group before the run (fixed and group-sequential),
and a sequential design decided on a finished sweep's traces."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from orchestrator.cli.app import DB_HELP, app
from orchestrator.errors import UserError, printable

design_app = typer.Typer(help="Study design: power and seeds per group before the run.", no_args_is_help=True)
app.add_typer(design_app, name="design")


def _pair(text: Optional[str], flag: str, *, lo: float, hi: float, closed: bool) -> tuple[float, float]:
    if text is None:
        raise UserError(f"{flag} is required for this test")
    parts = [p.strip() for p in text.split(",")]
    try:
        vals = [float(p) for p in parts]
    except ValueError:
        raise UserError(f"{flag} must be two numbers like 0.9,0.4, got {text!r}") from None
    if len(vals) != 2:
        raise UserError(f"{flag} needs exactly two values (group 1, group 2), got {len(vals)}")
    for v in vals:
        ok = (lo <= v <= hi) if closed else (lo < v < hi)
        if not ok:
            raise UserError(
                f"{flag} values must be in {'[' if closed else '('}{lo:g}, {hi:g}{']' if closed else ')'}, got {v:g}"
            )
    if vals[0] == vals[1]:
        raise UserError(f"{flag}: the two groups are equal ({vals[0]:g}); there is no effect to power")
    return vals[0], vals[1]


def _looks(text: Optional[str]) -> list[int] | None:
    if text is None:
        return None
    try:
        looks = [int(p) for p in text.split(",")]
    except ValueError:
        raise UserError(f"--looks must be whole seed counts like 8,16,24,40, got {text!r}") from None
    if any(n < 1 for n in looks) or any(b <= a for a, b in zip(looks, looks[1:])):
        raise UserError(f"--looks must be positive and strictly increasing, got {looks}")
    return looks


@design_app.command("power")
def power_cmd(
    test: str = typer.Option(..., "--test", help="fisher (lock-in at budget) or logrank (escape times)"),
    rates: Optional[str] = typer.Option(None, "--rates", help="fisher: lock-in rates of the two groups, e.g. 0.9,0.4"),
    medians: Optional[str] = typer.Option(None, "--medians", help="logrank: median escape steps, e.g. 600,2400"),
    hazards: Optional[str] = typer.Option(
        None, "--hazards", help="logrank: per-step escape hazards instead of medians"
    ),
    budget: Optional[int] = typer.Option(None, "--budget", help="logrank: training steps per seed (censoring)"),
    eval_every: int = typer.Option(100, "--eval-every", help="logrank: steps between evals"),
    alpha: float = typer.Option(0.05, "--alpha", help="type-I error rate"),
    power: float = typer.Option(0.8, "--power", help="target power"),
    sided: int = typer.Option(2, "--sided", help="2, or 1 (group 1 better than group 2 only)"),
    looks: Optional[str] = typer.Option(None, "--looks", help="seeds per group at each look, e.g. 8,16,24,40"),
    spending: str = typer.Option("obrien_fleming", "--spending", help="obrien_fleming or pocock"),
    sims: int = typer.Option(4000, "--sims", help="logrank: simulated sweeps per estimate"),
    seed: int = typer.Option(0, "--seed", help="logrank: RNG seed"),
    n_max: int = typer.Option(400, "--n-max", help="largest seeds per group searched"),
    as_json: bool = typer.Option(False, "--json"),
) -> int:
    """Seeds per group for a target power: fixed design, and the group-sequential one with --looks."""
    from orchestrator.design import power as pw

    if test not in ("fisher", "logrank"):
        raise UserError(f"--test must be fisher or logrank, got {test!r}")
    if not 0 < alpha < 0.5:
        raise UserError(f"--alpha must be in (0, 0.5), got {alpha:g}")
    if not 0 < power < 1:
        raise UserError(f"--power must be in (0, 1), got {power:g}")
    if sided not in (1, 2):
        raise UserError(f"--sided must be 1 or 2, got {sided}")
    if spending not in ("obrien_fleming", "pocock"):
        raise UserError(f"--spending must be obrien_fleming or pocock, got {spending!r}")
    if not 2 <= n_max <= 5000:
        raise UserError(f"--n-max must be in [2, 5000], got {n_max}")
    if sims < 100:
        raise UserError(f"--sims must be >= 100, got {sims}")
    sched = _looks(looks)
    out: dict = {"test": test, "alpha": alpha, "power_target": power, "sided": sided}

    if test == "fisher":
        if medians or hazards or budget:
            raise UserError("--medians/--hazards/--budget belong to --test logrank; fisher takes --rates")
        p0, p1 = _pair(rates, "--rates", lo=0.0, hi=1.0, closed=True)
        out["rates"] = [p0, p1]
        fixed = pw.fisher_sample_size(p0, p1, alpha, power, sided, n_max)
        out["fixed"] = {k: v for k, v in fixed.as_dict().items() if k != "curve"}
        out["fixed"]["method"] = "exact enumeration"

        def seq(s: list[int]):
            return pw.fisher_sequential(p0, p1, s, alpha, spending, sided)
    else:
        if rates:
            raise UserError("--rates belongs to --test fisher; logrank takes --medians or --hazards")
        if (medians is None) == (hazards is None):
            raise UserError("--test logrank needs exactly one of --medians or --hazards")
        if budget is None or budget < 1:
            raise UserError("--test logrank needs --budget (training steps per seed, >= 1)")
        if not 1 <= eval_every <= budget:
            raise UserError(f"--eval-every must be in [1, budget], got {eval_every}")
        if medians is not None:
            m0, m1 = _pair(medians, "--medians", lo=0.0, hi=float("inf"), closed=False)
            h0, h1 = pw.hazard_from_median(m0), pw.hazard_from_median(m1)
            out["medians"] = [m0, m1]
        else:
            h0, h1 = _pair(hazards, "--hazards", lo=0.0, hi=float("inf"), closed=False)
        out.update(hazards=[h0, h1], budget=budget, eval_every=eval_every, sims=sims, seed=seed)
        model = pw.EscapeModel(h0, h1, budget, eval_every)
        events, n_sch = pw.schoenfeld_n(h0, h1, budget, alpha, power, sided)
        fixed = pw.logrank_sample_size(model, alpha, power, sided, sims, seed, n_max)
        out["fixed"] = {k: v for k, v in fixed.as_dict().items() if k not in ("curve", "n_stays")}
        out["fixed"]["method"] = f"simulation ({sims} sweeps, seed {seed})"
        out["schoenfeld"] = {"events": events, "n_per_group": n_sch}

        def seq(s: list[int]):
            return pw.logrank_sequential(model, s, alpha, spending, sided, sims, seed)

    if sched is not None:
        out["sequential"] = seq(sched).as_dict()
        need = pw.sequential_sample_size(seq, sched, power, n_max, out["fixed"]["n"])
        out["sequential_needed"] = need.as_dict() if need else None

    if as_json:
        print(json.dumps(out, indent=2))
        return 0
    f = out["fixed"]
    if f["n"] is None:
        print(f"fixed design: target power {power:g} not reached within {n_max} seeds per group")
    else:
        line = f"fixed design: {f['n']} seeds per group (power {f['power']:.3f}, {f['method']})"
        if f.get("n_stays") is not None and f["n_stays"] != f["n"]:
            line += f"; power stays >= {power:g} from {f['n_stays']} on (checked to {f['n_scanned']})"
        print(line)
    if "schoenfeld" in out:
        s = out["schoenfeld"]
        print(f"  Schoenfeld: {s['events']:.1f} events, {s['n_per_group']:.1f} seeds per group")
    for key, title in (
        ("sequential", "sequential, looks as given"),
        ("sequential_needed", "sequential, smallest schedule with these fractions"),
    ):
        if key not in out:
            continue
        r = out[key]
        if r is None:
            print(f"{title}: target power not reached within {n_max} seeds per group")
            continue
        print(f"{title}: looks {r['looks']} ({spending}), boundaries {', '.join(f'{z:.3f}' for z in r['boundaries'])}")
        print(
            f"  power {r['power']:.3f}, type-I {r['size']:.4f}; expected seeds per group "
            f"H1 {r['expected_n_h1']:.1f}, H0 {r['expected_n_h0']:.1f} (max {r['looks'][-1]}; "
            f"{r['method']})"
        )
    return 0


@design_app.command("replay")
def replay_cmd(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="a spec with a sequential: block"),
    sweep: str = typer.Option(..., "--sweep", help="the stored (or imported) sweep whose traces the looks read"),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    as_json: bool = typer.Option(False, "--json", help="one object per look: statistic, p, boundary, decision"),
) -> int:
    """Decide every look of SPEC's sequential design on a finished sweep's traces, through the
    decision the runner's look gate makes (the analysis's events and log-rank), writing
    nothing: what the design would have concluded, and the seeds it would have left unrun."""
    from orchestrator.design.sequential import format_records
    from orchestrator.runner.sequential import replay
    from orchestrator.spec import load
    from orchestrator.store import reader, repo

    spec = load(spec_path)
    if spec.sequential is None:
        raise UserError(f"{spec_path}: no sequential: block to replay")
    engine, _ = reader.open_reader_engine(db)
    try:
        with engine.connect() as conn:
            sid = reader.sweep_id(conn, sweep)
            trials = repo.sweep_trials(conn, sid)
            results = repo.trial_outcomes(conn, [t[0] for t in trials])
    finally:
        engine.dispose()
    looks = replay(spec.sequential, spec.axes, spec.analysis, trials, results)
    if as_json:
        print(json.dumps([lk.as_dict() for lk in looks], indent=2, default=str))
        return 0
    print(
        f"{spec.name}'s design replayed on sweep {printable(sweep)} ({spec.sequential.test}, looks {spec.sequential.looks}):"
    )
    print(format_records([lk.record for lk in looks]))
    for lk in looks:
        if lk.unrun:
            where = " ".join(f"{k}={v}" for k, v in lk.record.stratum.items()) or "all"
            print(
                f"{where}: decided at look {lk.record.look} ({lk.record.decision}); seeds {lk.unrun} "
                f"({2 * len(lk.unrun)} trials) would not have run"
            )
    return 0
