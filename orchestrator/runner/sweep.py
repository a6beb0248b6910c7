"""Submit, resume and join: spec -> store rows -> Ray Tune -> store. The CLI is a thin shell
over these functions.

Any number of drivers run one sweep (runner/lifecycle.py, store/claims.py): each runs one
Ray Tune run on its own Ray, fed by claims (runner/feed.py: a batch of trials claimed each
time its queue runs dry), until no trial is left to claim and none is held by another live driver (a dead driver's trials come free after the
lease TTL and are taken over). ``submit`` and ``resume`` write what needs the sweep alone
(the design, an amendment, failed trials given another go) under the sweep's lease first,
then share it; a design change is refused while other drivers run it, unless
``--takeover``. A ``sequential:`` design is claimed look by look: the driver that first
finds a look complete decides it, once, in its claim transaction (runner/sequential.py).
"""

from __future__ import annotations

import gc
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from orchestrator.errors import UserError
from orchestrator.runner import checkpoints
from orchestrator.runner.context import RunContext
from orchestrator.runner.lifecycle import DriverSession
from orchestrator.spec import Sweep, SweepSpec, load
from orchestrator.status import Status
from orchestrator.store import attempts, reader, repo
from orchestrator.store.engine import describe
from orchestrator.store.sweep_store import SweepStore
from orchestrator.store.outage import DatabaseGone, DatabaseUnavailable

if TYPE_CHECKING:  # Ray Tune is imported only when a run starts
    from orchestrator.runner.tune_runner import FeedRun
    from orchestrator.runner.feed import ClaimSource


@dataclass(frozen=True)
class RunOptions:
    """How a driver runs a sweep: what ``orchestrator submit``/``resume`` and the Python API's
    ``submit``/``resume`` take besides the sweep.

    ``db``: a URL or SQLite path (default: the spec's ``storage:``, else ``$ORCH_DB``, else
    ``runs/orchestrator.db``); ``address``: a Ray cluster to join (default: an embedded Ray);
    ``max_concurrent``: trials at once (default: the spec's); ``checkpoint_dir``: keep
    checkpoints as files there instead of in the database (default: the spec's
    ``checkpoint_dir:``, else the database); ``takeover``: run even if another driver holds the
    sweep's lease; ``allow_code_change``: continue a sweep whose attempts ran other code or
    another torch minor version (recorded with the spec versions)."""

    db: str | None = None
    address: str | None = None
    max_concurrent: int | None = None
    checkpoint_dir: str | None = None
    takeover: bool = False
    allow_code_change: bool = False


@dataclass
class RunSummary:
    sweep: str
    db: str
    total: int
    already_done: int
    ran: int
    outcomes: dict[str, int] = field(default_factory=dict)  # status -> trials
    skipped: int = 0  # sequential designs: seeds a decided contrast never ran
    looks: list[Any] = field(default_factory=list)  # design.sequential.LookRecord, this run's
    # Why the run stopped early (SIGINT, SIGTERM, a cancel, a lost lease); None: it ran out.
    stopped: str | None = None
    db_arg: str | None = None
    # A stopped run: each interrupted trial's key and the step it continues from (None: from
    # the start, no checkpoint yet), and how many were still running past the stop's grace.
    resume_from: list[tuple[str, int | None]] = field(default_factory=list)
    late: int = 0
    # The whole sweep's trials per status when this driver ended, every driver's work
    # together (``outcomes`` is this driver's alone).
    sweep_counts: dict[str, int] = field(default_factory=dict)
    # Ray Tune runs this driver went through: one, plus one each time the feed went idle
    # (waiting for other drivers) or had taken its share of trials (feed.trials_per_tune_run).
    tune_runs: int = 0
    # Ray Tune trials those runs started: one per trial, seed pack, or chain of short trials
    # (runner/feed.ChainPolicy), its retries included.
    tune_trials: int = 0

    @property
    def failed(self) -> int:
        return self.outcomes.get(Status.failed.value, 0)

    @property
    def interrupted(self) -> int:
        return self.outcomes.get(Status.interrupted.value, 0)


def checkpoint_folder(spec: SweepSpec, override: str | None) -> Path | None:
    """The folder the run keeps checkpoint files in, or None: in the database."""
    chosen = override or spec.checkpoint_dir
    return Path(chosen).expanduser().resolve() if chosen else None


def checkpoint_folders(url: str, spec: SweepSpec, override: str | None) -> list[Path]:
    """Every folder a sweep's checkpoint files may be in: the chosen one, and the default
    beside the database where runs before revision 0007 kept them."""
    chosen = checkpoint_folder(spec, override)
    return [f for f in (chosen, checkpoints.default_root(url)) if f is not None]


def code_guard(conn: Any, sid: int, name: str, allow: bool) -> str | None:
    """The code this driver runs against the code and torch versions of the sweep's stored
    attempts. Returns the difference in one line (None: the same); refuses it (UserError,
    exit 2) unless ``allow``."""
    from orchestrator.runner import provenance

    version, digest = provenance.code_fingerprint()
    torch_here = provenance.torch_minor(torch_version())
    others = [
        e
        for e in reader.environments(conn, sid)
        if (e.code_hash and e.code_hash != digest) or provenance.torch_minor(e.torch_version) != torch_here
    ]
    if not others:
        return None
    ran = "; ".join(f"{e.code_version} with torch {e.torch_version} ({e.trials} trial(s))" for e in others)
    line = f"sweep {name!r} ran {ran}; this is {version} with torch {torch_version()}"
    if not allow:
        raise UserError(
            f"{line}: finishing it here would mix code versions in one sweep; "
            "pass --allow-code-change to continue anyway (it is recorded; nothing was run)"
        )
    return line


def _before_continuing(store: SweepStore, sid: int, name: str, spec: SweepSpec, options: RunOptions) -> str | None:
    """What `resume` and `join` check before Ray starts: a checkpoint folder they can write,
    and the code-change guard when trials are left to run (its accepted difference, or None)."""
    folder = checkpoint_folder(spec, options.checkpoint_dir)
    if folder is not None:
        checkpoints.check_writable(folder / spec.name)

    def guard(conn) -> str | None:
        if not repo.unfinished_trials(conn, sid):
            return None
        return code_guard(conn, sid, name, options.allow_code_change)

    return store.read(guard)


def torch_version() -> str:
    import torch

    return str(torch.__version__)


def check_devices(trials: list[tuple[str, dict[str, Any]]], gpus: float, where: str) -> None:
    """A trial asking for ``device: cuda`` where there is no GPU fails at once, every
    time: refuse it before anything is written (``where``: "this machine" or "the cluster")."""
    cuda = [k for k, p in trials if str(p.get("device", "")).startswith("cuda")]
    if cuda and gpus <= 0:
        raise UserError(f"{len(cuda)} trial(s) ask for device: cuda but {where} has no GPU (use device: cpu or auto)")


def _check_design(diff: repo.DesignDiff, name: str, amend: bool, looked: bool = False) -> None:
    refusal = diff.refusal()
    if refusal is not None:
        raise UserError(f"sweep {name!r}: {refusal} (nothing was written)")
    if looked and diff.extended:
        raise UserError(
            f"sweep {name!r}: its sequential looks were decided at the old budget; a longer budget would change "
            "what they tested (submit the longer design under a new name; nothing was written)"
        )
    if diff.changed and not amend:
        raise UserError(
            f"sweep {name!r} exists with another design: {diff.summary()}; "
            "pass --amend (or --yes) to apply it (nothing was written)"
        )


def _unwrap_outage(exc: BaseException) -> DatabaseUnavailable | DatabaseGone | None:
    seen = 0
    cur: BaseException | None = exc
    while cur is not None and seen < 10:
        if isinstance(cur, (DatabaseUnavailable, DatabaseGone)):
            return cur
        cur = cur.__cause__ or cur.__context__
        seen += 1
    return None


@contextmanager
def _on_ray(address: str | None) -> Iterator[None]:
    """Ray for the run: the cluster at ``address``, or an embedded one shut down after (in a
    SLURM job, sized to its allocation: runner/slurm.py)."""
    import os

    from orchestrator.runner import slurm
    from orchestrator.runner.tune_runner import init_ray

    size = slurm.ray_size(os.environ) if address is None else None
    if size is None:
        started = init_ray(address)
    else:
        started = init_ray(
            None,
            num_cpus=size.num_cpus,
            num_gpus=size.num_gpus,
            memory=size.memory,
            object_store_memory=size.object_store_memory,
        )
    try:
        yield
    finally:
        if started:
            import ray

            ray.shutdown()


def _context(
    session: DriverSession,
    spec: SweepSpec,
    url: str,
    options: RunOptions,
    on_start: Callable[..., None] | None,
    on_event: Callable[..., None] | None,
) -> RunContext:
    """The run's context, once the lease is held; checkpoint files named by pre-0005 keys
    are renamed here."""
    folders = checkpoint_folders(url, spec, options.checkpoint_dir)
    renames = session.store.read(lambda conn: repo.key_renames(conn, session.sid))
    if renames:
        for folder in folders:
            checkpoints.adopt_renamed(folder, spec.name, renames)
    return RunContext(
        spec=spec,
        sweep_id=session.sid,
        session=session,
        url=url,
        db_arg=options.db,
        checkpoint_folder=checkpoint_folder(spec, options.checkpoint_dir),
        checkpoint_reads=folders,
        max_concurrent=options.max_concurrent or spec.max_concurrent,
        on_start=on_start,
        on_event=on_event,
    )


def submit(
    sweep: Sweep,
    options: RunOptions = RunOptions(),
    *,
    amend: bool = False,
    on_start: Callable[..., None] | None = None,
    on_event: Callable[..., None] | None = None,
    note: Callable[[str], None] | None = None,
) -> RunSummary:
    """Record the sweep and its trials, then run every trial that is not finished.

    Re-submitting a sweep whose design changed (trials added or dropped, budgets, settings or
    tags changed) needs ``amend``: without it nothing is written and a UserError names the
    difference. With it the dropped trials become ``superseded``, trials given more steps
    continue from their checkpoints, and the spec is kept as a new version. A budget below
    what a trial has run is refused either way."""
    from orchestrator.runner.tune_runner import check_resources, cluster_limits

    spec = sweep.spec
    # Before Ray starts or the database is made: every trial would fail at its first checkpoint.
    folder = checkpoint_folder(spec, options.checkpoint_dir)
    if folder is not None:
        checkpoints.check_writable(folder / spec.name)
    # What `--db` reaches this database again (the spec's storage: is not read by `sql`/`resume`).
    options = replace(options, db=options.db or spec.storage or None)
    # Before Ray starts (checked again below, and by ensure_sweep).
    done = _refuse_imported(options.db, spec, sweep)
    if done is not None:  # nothing to run: said without starting Ray (seconds, not ten)
        if on_start:
            on_start(done.db, done.total, 0, steps=0)
        return done
    with _on_ray(options.address):
        check_resources(spec.resources, [p for _, p in sweep.trials])
        check_devices(sweep.trials, cluster_limits()[1], "the Ray cluster")
        store = SweepStore.open(options.db, spec.storage)
        url = store.url

        def check(conn) -> str | None:
            """Refused before the lease: nothing written at all. The accepted code change."""
            found = reader.find_sweep(conn, spec.name)
            if found is not None and reader.sweep_origin(conn, spec.name) == reader.ORIGIN_IMPORT:
                raise UserError(repo.imported_refusal(spec.name))
            if found is None:
                return None
            looked = bool(repo.sequential_looks(conn, found[0]))
            before = repo.design_diff(conn, found[0], sweep.trials)
            _check_design(before, spec.name, amend, looked)
            if before.changed or repo.unfinished_trials(conn, found[0]):
                return code_guard(conn, found[0], spec.name, options.allow_code_change)
            return None

        code_change = store.read(check)
        sid = repo.ensure_sweep(store, spec.name, sweep.text, sweep.hash)
        with _session(store, sid, sweep, options, note, "submit") as session:

            def record(conn) -> tuple[repo.DesignDiff, int, dict[str, int], set[int]]:
                diff = repo.design_diff(conn, sid, sweep.trials)
                # again, now that we hold the sweep
                _check_design(diff, spec.name, amend, bool(repo.sequential_looks(conn, sid)))
                if diff.changed:
                    _alone(conn, session, spec.name)
                version = repo.record_spec_version(conn, sid, sweep.text, sweep.hash, code_change=code_change)
                repo.upsert_sweep(conn, spec.name, sweep.text, sweep.hash)
                repo.apply_design(conn, sid, diff)
                ids = repo.add_trials(conn, sid, sweep.trials, spec_version=version)
                repo.release_unfinished(conn, sid)
                pending = {tid for tid, _, _ in repo.unfinished_trials(conn, sid)}
                return diff, version, ids, pending

            diff, version, ids, pending = session.write(record)
            session.share()
            if diff.changed and note is not None:
                note(f"sweep {spec.name}: amended to spec version {version}: {diff.summary()}")
            ctx = _context(session, spec, url, options, on_start, on_event)
            to_run = [(ids[k], k, p) for k, p in sweep.trials if ids[k] in pending]
            return _run_design(ctx, sweep, to_run, len(sweep.trials))


def _refuse_imported(db: str | None, spec: SweepSpec, sweep: Sweep | None = None) -> RunSummary | None:
    """UserError when the database already holds a sweep of the spec's name that
    ``orchestrator import`` made (no database yet, or one to upgrade first: nothing to say).
    With ``sweep``: the summary of a re-submit with nothing to do (the stored spec is this
    very text and every trial is settled), so it is said without starting Ray."""
    try:
        store = SweepStore.open(db, spec.storage, auto_create=False)
    except UserError:
        return None
    url = store.url

    def look(conn) -> tuple[str | None, bool, dict[str, int]]:
        origin = reader.sweep_origin(conn, spec.name)
        found = reader.find_sweep(conn, spec.name) if sweep is not None else None
        settled = (
            sweep is not None
            and found is not None
            and found[1] == sweep.text
            and not repo.unfinished_trials(conn, found[0])
        )
        return origin, settled, reader.status_counts(conn, spec.name) if settled else {}

    try:
        origin, settled, counts = store.read(look)
    finally:
        store.dispose()
    if origin == reader.ORIGIN_IMPORT:
        raise UserError(repo.imported_refusal(spec.name))
    if not settled:
        return None
    total = len(sweep.trials) if sweep is not None else 0
    return RunSummary(
        sweep=spec.name, db=describe(url), total=total, already_done=total, ran=0, db_arg=db, sweep_counts=counts
    )


def resume(
    name: str,
    options: RunOptions = RunOptions(),
    *,
    on_start: Callable[..., None] | None = None,
    on_event: Callable[..., None] | None = None,
    note: Callable[[str], None] | None = None,
) -> RunSummary:
    """Run every trial of a recorded sweep that is not completed (running, stale and
    interrupted ones resume from their checkpoints). The spec is the one stored with the
    sweep."""
    return _continue(name, options, "resume", on_start, on_event, note)


def join(
    name: str,
    options: RunOptions = RunOptions(),
    *,
    on_start: Callable[..., None] | None = None,
    on_event: Callable[..., None] | None = None,
    note: Callable[[str], None] | None = None,
) -> RunSummary:
    """One more driver on a recorded sweep, beside those running it (on its own Ray or
    cluster, anywhere that reaches the database): it claims unfinished trials in batches
    and runs them until none is left. It changes nothing else: failed trials are left to
    ``resume``, a changed design to ``submit --amend``."""
    return _continue(name, options, "join", on_start, on_event, note)


def _continue(
    name: str,
    options: RunOptions,
    command: Literal["resume", "join"],
    on_start: Callable[..., None] | None,
    on_event: Callable[..., None] | None,
    note: Callable[[str], None] | None,
) -> RunSummary:
    """``resume`` and ``join``: the recorded sweep and its stored spec, the code guard, then
    one driver session. They differ in one step: ``resume`` releases the unfinished trials
    (failed ones included) and takes a sequential design's looks; ``join`` only claims."""
    from orchestrator.runner.tune_runner import check_resources

    store = SweepStore.open(options.db, auto_create=False)
    url = store.url
    found, origin = store.read(lambda conn: (reader.find_sweep(conn, name), reader.sweep_origin(conn, name)))
    if found is None:
        raise UserError(f"no sweep named {name!r} in {describe(url)} (see `orchestrator ls`)")
    if origin == reader.ORIGIN_IMPORT:
        raise UserError(repo.imported_refusal(name))
    sid, spec_text = found
    # The design was accepted (and its size cap chosen) at submit: it is not re-capped here.
    sweep = load(f"<sweep {name}>", text=spec_text, max_trials=sys.maxsize)
    spec = sweep.spec
    code_change = _before_continuing(store, sid, name, spec, options)
    with _on_ray(options.address):
        check_resources(spec.resources)
        with _session(store, sid, sweep, options, note, command) as session:

            def start(conn) -> tuple[list[tuple[int, str, dict[str, Any]]], int]:
                if code_change is not None:
                    repo.record_spec_version(conn, sid, spec_text, sweep.hash, code_change=code_change)
                if command == "resume":
                    repo.release_unfinished(conn, sid)
                return repo.unfinished_trials(conn, sid), repo.count_trials(conn, sid)

            todo, total = session.write(start)
            if command == "join":
                ctx = _context(session, spec, url, options, on_start, on_event)
                return _run_claimed(ctx, sweep, len(todo), total)
            session.share()
            ctx = _context(session, spec, url, options, on_start, on_event)
            return _run_design(ctx, sweep, todo, total)


def _session(
    store: SweepStore, sid: int, sweep: Sweep, options: RunOptions, note: Callable[[str], None] | None, command: str
) -> DriverSession:
    """The driver's session: ``join`` never takes the sweep's lease; ``submit``/``resume``
    take it for their exclusive step only. A SLURM task's driver records its job id."""
    import os

    from orchestrator.runner import slurm

    return DriverSession(
        store,
        sid,
        sweep.spec.name,
        takeover=options.takeover,
        note=note,
        take_lease=command != "join",
        command=command,
        max_concurrent=options.max_concurrent or sweep.spec.max_concurrent,
        slurm_job=slurm.job_id(os.environ),
    )


def _alone(conn: Any, session: DriverSession, name: str) -> None:
    """A design change needs the sweep alone: refused while another live driver runs it
    (``--takeover`` ended those already)."""
    from orchestrator.store import claims

    others = [d for d in claims.drivers(conn, session.sid, ttl=session.ttl, live_only=True) if d.owner != session.owner]
    if others:
        raise UserError(
            f"sweep {name!r} is being run by {len(others)} other driver(s) ({others[0].summary()}); a changed "
            f"design needs the sweep alone: wait for them, `orchestrator cancel {name}`, or pass --takeover "
            "(nothing was written)"
        )


def _run_design(ctx: RunContext, sweep: Sweep, to_run: list[tuple[int, str, dict[str, Any]]], total: int) -> RunSummary:
    """Run the sweep's unfinished trials (``to_run`` of ``total``) as they are claimed."""
    return _run_claimed(ctx, sweep, len(to_run), total)


def batch_size(ctx: RunContext) -> int:
    """Trials a driver claims at once: twice the trials it runs at once (its
    ``max_concurrent``, else what its Ray cluster fits), so its slots stay busy while a batch
    ends, without holding what other drivers could run."""
    from orchestrator.runner.tune_runner import cluster_slots

    gpu = ctx.spec.resources.gpu
    # ``gpu: auto`` sizes each trial's share per node type (runner/fleet.py): count CPU slots.
    slots = ctx.max_concurrent or cluster_slots(ctx.spec.resources.cpu, gpu if isinstance(gpu, float | int) else 0.0)
    return 2 * max(1, int(slots or 1))


def _run_claimed(ctx: RunContext, sweep: Sweep, pending: int, total: int) -> RunSummary:
    """Run trials as they are claimed, in one Ray Tune run, until nothing is left to claim
    and no other live driver holds an unfinished trial (one that dies leaves its trials to
    be taken over here after the TTL). A ``sequential:`` design is claimed look by look
    (runner/sequential.LookGate), each look decided once by whichever driver first finds it
    complete, and runs until every look is decided."""
    from orchestrator.runner.feed import ClaimSource
    from orchestrator.runner.sequential import LookGate

    session = ctx.session
    if ctx.on_start:
        todo = ctx.store.read(lambda conn: repo.unfinished_trials(conn, ctx.sweep_id))
        _started(ctx, total, todo)
    seq = sweep.sequential
    gate = LookGate(seq, sweep.axes, sweep.analysis, ctx.sweep_id) if seq is not None else None
    res = ctx.spec.resources
    source = ClaimSource(
        session,
        pending=pending,
        slots=batch_size(ctx) // 2,
        packs=ctx.spec.pack_seeds != 1,
        gate=gate,
        # Not where each trial's GPU is sized and placed by itself (runner/fleet.py).
        chains=res.gpu != "auto" and not res.accelerator,
    )
    outcomes: Counter[str] = Counter()
    taken: list[int] = []
    late: list[int] = []
    runs = units = 0
    while True:
        run = _run_batch(ctx, source)
        # The run's objects (Tune's trials, their results, its controller) hold each other
        # in cycles that only a full collection frees, and CPython runs one rarely: each run's
        # garbage would stay resident and grow the driver with history.
        gc.collect()
        runs += 1
        units += run.units
        outcomes.update(run.outcomes.values())
        taken += run.taken
        late += run.late
        # A run that went idle (other drivers hold what is left, or a look waits for them)
        # freed its Ray resources; the next starts when there is work again.
        if not run.idle or session.stop_reason is not None or not source.wait():
            break
    looks = {} if gate is None else {"skipped": gate.skipped, "looks": gate.records}
    if session.stop_reason is not None:
        tally, resume_from = _stopped_tally(ctx, taken)
        return _summary(
            ctx,
            total,
            pending,
            tally,
            ran=len(taken),
            resume_from=resume_from,
            late=len(late),
            tune_runs=runs,
            tune_trials=units,
            **looks,
        )
    return _summary(ctx, total, pending, dict(outcomes), ran=len(taken), tune_runs=runs, tune_trials=units, **looks)


def _run_batch(ctx: RunContext, source: ClaimSource) -> FeedRun:
    """Run trials on Ray Tune under the driver session, as the claim source gives them
    (runner/feed.py). A database outage that outlasted the writer's retries stops the
    session and surfaces as DatabaseUnavailable, a database that is gone (file deleted or
    replaced, tables dropped) as DatabaseGone."""
    from orchestrator.runner.tune_runner import run_feed

    session = ctx.session
    try:
        run = run_feed(ctx, source)
    except Exception as exc:
        if session.fatal is not None:
            raise session.fatal from None
        outage = _unwrap_outage(exc)
        if outage is None:
            raise
        if isinstance(outage, DatabaseGone):
            session.fail(outage)
        else:
            session.stop("database unreachable")
        raise outage from None
    if session.fatal is not None:  # found by the lease thread: Tune stopped the trials
        raise session.fatal from None
    return run


def _started(ctx: RunContext, total: int, todo: list[tuple[int, str, dict[str, Any]]]) -> None:
    if ctx.on_start:
        ctx.on_start(describe(ctx.url), total, len(todo), steps=sum(int(p.get("steps") or 0) for _, _, p in todo))


def _stopped_tally(ctx: RunContext, tids: list[int]) -> tuple[dict[str, int], list[tuple[str, int | None]]]:
    """The outcomes of a run the session stopped, and each interrupted trial's key with the
    step it will continue from. Tune may end before telling the writer about every stopped
    trial: the database (after marking what is still running as interrupted) has the true
    tally."""

    def tally(conn) -> tuple[Counter[str], list[tuple[int, str]], dict[int, int]]:
        ctx.session.interrupt_running(conn)
        statuses = repo.statuses(conn, tids)
        stopped = [
            (tid, key)
            for tid, key, _, st in repo.sweep_trials(conn, ctx.sweep_id)
            if tid in set(tids) and st == Status.interrupted.value
        ]
        return Counter(statuses), stopped, attempts.checkpoint_steps(conn, [t for t, _ in stopped])

    counts, stopped, steps = ctx.session.write(tally)
    if ctx.checkpoint_folder is not None:  # files: the step is in each one
        for tid, key in stopped:
            state = checkpoints.read_checkpoint(checkpoints.trial_path(ctx.checkpoint_folder, ctx.name, key))
            if state is not None:
                steps[tid] = max(steps.get(tid, 0), int(state["step"]))
    return dict(counts), [(key, steps.get(tid)) for tid, key in stopped]


def _summary(
    ctx: RunContext, total: int, pending: int, outcomes: dict[str, int], ran: int | None = None, **more: Any
) -> RunSummary:
    try:
        sweep_counts = ctx.store.read(lambda conn: reader.status_counts(conn, ctx.name))
    except Exception:  # the totals are a courtesy line: a store that went away loses only them
        sweep_counts = {}
    return RunSummary(
        sweep=ctx.name,
        sweep_counts=sweep_counts,
        db=describe(ctx.url),
        total=total,
        already_done=total - pending,
        ran=pending if ran is None else ran,
        outcomes=outcomes,
        stopped=ctx.session.stop_reason,
        db_arg=ctx.db_arg,
        **more,
    )
