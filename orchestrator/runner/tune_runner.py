"""Launch trials on Ray Tune (embedded local Ray, or a running cluster via ``address``).

Identity is ours, not Tune's: every Tune trial carries our trial ids and stable keys in its
config, and asks the run's checkpoint loader for its members' checkpoints, so a fresh launch
after a crash (on any machine that reaches the database) picks each trial up where its
checkpoint left it.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TYPE_CHECKING


from orchestrator import plugins
from orchestrator.errors import UserError
from orchestrator.runner import checkpoints, feed, fleet, lost_results
from orchestrator.runner.writer import StoreWriter
from ray import tune

if TYPE_CHECKING:
    from orchestrator.runner.context import RunContext
    from orchestrator.spec import Resources

# Tune's own JSON/CSV/TensorBoard loggers would duplicate every result on disk; the
# database is our log. The new console output engine would print tables over our bar.
os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
os.environ.setdefault("TUNE_RESULT_BUFFER_LENGTH", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# SIGINT is ours (runner/lifecycle.py): it stops the trials, marks them interrupted and
# exits 130; Tune's own handler would end fit() without telling us which trials stopped.
os.environ.setdefault("TUNE_DISABLE_SIGINT_HANDLER", "1")
# Tune's experiment state (every trial's JSON, rewritten every few seconds, growing with the
# sweep) serves only Tune's own restore, which we never use: a restart resumes from our
# checkpoints. Saved once a day instead (and when the run ends).
os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "86400")
# A trial's report lost with its node fails the trial, not the driver (runner/lost_results.py).
lost_results.install()


def debug() -> bool:
    """``orchestrator --debug`` (or ORCH_DEBUG=1): Ray Tune's own error logs reach the console."""
    return os.environ.get("ORCH_DEBUG", "") not in ("", "0")


@contextmanager
def _tune_logs_quiet() -> Iterator[None]:
    """Silence Ray Tune's loggers while it runs. A failed trial is one line on the console
    (the writer's ``on_event``) with its traceback stored in ``trial_errors``; Tune would also
    log every failed attempt's traceback and "Trials did not complete" at ERROR."""
    if debug():
        yield
        return
    saved = {}
    for name in ("ray.tune", "ray.train", "ray.air"):
        lg = logging.getLogger(name)
        saved[name] = lg.level
        lg.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def init_ray(
    address: str | None,
    *,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    memory: int | None = None,
    object_store_memory: int | None = None,
) -> bool:
    """Connect to ``address`` (``auto`` or ``HOST:PORT``) or start an embedded local Ray
    (sized so where given: a SLURM task's allocation, runner/slurm.py). Returns True when
    this call started Ray (so the caller shuts it down)."""
    import ray

    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = dict(
        include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR, configure_logging=True
    )
    if address:
        _join_bounded(ray, address, kwargs)
    else:
        # "local": always a fresh embedded Ray, never the cluster a stale
        # ray_current_cluster file (or $RAY_ADDRESS) names; joining a dead one retries forever.
        if memory is not None:
            kwargs["_memory"] = memory
        ray.init(
            address="local", num_cpus=num_cpus, num_gpus=num_gpus, object_store_memory=object_store_memory, **kwargs
        )
    return True


def _join_bounded(ray, address: str, kwargs: dict[str, Any]) -> None:
    """``ray.init(address=...)`` that fails with one line within ``$ORCH_RAY_JOIN_TIMEOUT_S``
    (default 60 s) when the cluster does not answer (Ray itself retries a dead GCS for
    minutes)."""
    import socket
    import threading

    from ray._private.services import canonicalize_bootstrap_address

    timeout = float(os.environ.get("ORCH_RAY_JOIN_TIMEOUT_S", "60"))

    def fail(why: str) -> UserError:
        return UserError(f"--address {address}: cannot join the Ray cluster: {why}")

    if not address.startswith("ray://"):
        try:
            target = canonicalize_bootstrap_address(address)
        except (ConnectionError, ValueError) as exc:
            raise fail(str(exc).splitlines()[0]) from None
        if target:
            host, _, port = target.rpartition(":")
            try:
                socket.create_connection((host, int(port)), timeout=min(timeout, 10)).close()
            except (OSError, ValueError) as exc:
                why = getattr(exc, "strerror", None) or exc
                raise fail(f"nothing answers at {target} ({why})") from None
    box: dict[str, BaseException] = {}

    def join() -> None:
        try:
            ray.init(address=address, **kwargs)
        except BaseException as exc:  # handed to the caller's thread
            box["exc"] = exc

    t = threading.Thread(target=join, name="ray-join", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise fail(f"no answer within {timeout:g} s (ORCH_RAY_JOIN_TIMEOUT_S to change)")
    raised = box.get("exc")
    if isinstance(raised, (ConnectionError, RuntimeError, ValueError, TimeoutError, ray.exceptions.RayError)):
        from orchestrator.runner.cluster import join_hint

        first = str(raised).splitlines()[0] if str(raised) else type(raised).__name__
        hint = join_hint(str(raised))
        raise fail(first + (f"; {hint}" if hint else "")) from None
    if raised is not None:
        raise raised


def check_resources(resources: Resources, params: Sequence[Mapping[str, Any]] = ()) -> None:
    """Refuse a per-trial request that no node of the cluster can ever satisfy: more CPUs or
    GPUs than the largest node has, an accelerator type it lacks, or (``gpu: auto``) a trial
    of ``params`` larger than every GPU."""
    cpu, gpu = resources.cpu, resources.gpu
    max_cpu, max_gpu = cluster_limits()
    if cpu > max_cpu:
        raise UserError(
            f"impossible resources: resources.cpu={cpu:g} per trial but the largest node has {max_cpu:g} CPUs"
        )
    if isinstance(gpu, float) and gpu > max_gpu:
        raise UserError(
            f"impossible resources: resources.gpu={gpu:g} per trial but the largest node has {max_gpu:g} GPUs"
        )
    fleet.check(resources, params)


def cluster_limits() -> tuple[float, float]:
    """(CPUs, GPUs) of the largest node."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return (
        max((n["Resources"].get("CPU", 0.0) for n in nodes), default=0.0),
        max((n["Resources"].get("GPU", 0.0) for n in nodes), default=0.0),
    )


# ``pack_seeds: auto``: the most members one pack takes (a pack claims up to a whole node, so
# bigger packs only lengthen the slowest unit).
AUTO_PACK_SIZE = 32


def pack_size(pack_seeds: int | str, trials: int = 0, slots: int = 0) -> int:
    """Members per pack for a spec's ``pack_seeds`` (1: no packing). ``auto`` splits the
    ``trials`` over the cluster's ``slots`` (trials it runs at once): enough packs to keep
    every slot busy, each as large as that allows, at most AUTO_PACK_SIZE."""
    if pack_seeds != "auto":
        return int(pack_seeds)
    if trials <= 0 or slots <= 0:
        return AUTO_PACK_SIZE
    return max(1, min(AUTO_PACK_SIZE, math.ceil(trials / slots)))


def cluster_slots(cpu: float, gpu: float) -> int:
    """How many trials of ``cpu``/``gpu`` each the whole Ray cluster runs at once."""
    import ray

    total = ray.cluster_resources()
    if gpu:
        return int(total.get("GPU", 0.0) // gpu)
    return int(total.get("CPU", 0.0) // cpu) if cpu else 0


def make_units(
    sweep: str,
    trials: Sequence[tuple[int, str, dict[str, Any]]],
    *,
    cpu: float,
    gpu: float,
    pack_seeds: int | str,
    max_cpu: float,
    max_gpu: float,
    slots: int = 0,
    stop: dict[str, Any] | None = None,
    chain: int = 1,
) -> list[dict[str, Any]]:
    """Group trials into units of work: lone trials, seed packs of trials that differ
    only in seed, or (``chain`` > 1, no packing) chains of up to ``chain`` lone trials run
    one after another. A pack asks for its members' combined resources, capped at what the
    largest node has (a pack of ten 1-CPU trials on a 2-CPU machine takes both CPUs); a
    chain asks for one trial's."""
    from orchestrator.train.pack import can_pack, pack_signature

    def member(tid: int, key: str, params: dict[str, Any]) -> dict[str, Any]:
        m = {"trial_id": tid, "key": key, "params": params}
        if stop is not None:
            m["stop"] = stop  # the spec's stop rule (lone trials only; see spec.load)
        return m

    if chain > 1 and pack_seeds == 1:
        # As many chains as slots (or trials), the trials dealt out evenly in claim order.
        n = max(math.ceil(len(trials) / chain), min(len(trials), max(1, slots)))
        runs = [list(trials[i::n]) for i in range(n)]
        return [
            {
                "members": [member(tid, key, params) for tid, key, params in run],
                "cpu": cpu,
                "gpu": gpu,
                "threads": max(1, int(run[0][2].get("threads") or cpu)),
                **({"chain": True} if len(run) > 1 else {}),
            }
            for run in runs
        ]

    groups: dict[str, list[dict[str, Any]]] = {}
    order: list[str] = []
    for tid, key, params in trials:
        sig = pack_signature(params) if pack_seeds != 1 and can_pack(params) else f"lone:{key}"
        if sig not in groups:
            groups[sig] = []
            order.append(sig)
        groups[sig].append(member(tid, key, params))
    size = pack_size(pack_seeds, len(trials), slots)
    units = []
    for sig in order:
        g = groups[sig]
        for i in range(0, len(g), size):
            members = g[i : i + size]
            n = len(members)
            unit_cpu = min(n * cpu, max_cpu) if n > 1 else cpu
            unit_gpu = (min(n * gpu, max(max_gpu, gpu)) if n > 1 else gpu) if gpu else 0.0
            threads = members[0]["params"].get("threads") or unit_cpu
            units.append({"members": members, "cpu": unit_cpu, "gpu": unit_gpu, "threads": max(1, int(threads))})
    return units


def _unit_resources(config: dict[str, Any]):
    from ray.tune.execution.placement_groups import resource_dict_to_pg_factory

    unit = config["unit"]
    res = {"cpu": unit["cpu"], **fleet.resources_of(unit)}
    if unit["gpu"]:
        res["gpu"] = unit["gpu"]
    return resource_dict_to_pg_factory(res)


def stop_grace_s() -> float:
    """How long a stopping driver waits for its units to checkpoint where they are
    (``$ORCH_STOP_GRACE_S``, default 10 s); past it, Tune stops what is left."""
    try:
        return max(0.0, float(os.environ.get("ORCH_STOP_GRACE_S", "10")))
    except ValueError:
        return 10.0


class _StopWhenSet(tune.Stopper):
    """Stops every trial once the driver session asks to stop (signal, cancel, lost lease),
    after a grace: the units are told first (through the run's checkpoint loader) and each
    stores a checkpoint of its current step and ends; what has not ended when the grace is
    over (``late``) is stopped where it is and continues from its last checkpoint. A
    database that is gone gets no grace (nothing may be written to it)."""

    def __init__(self, session, loader: Any = None, grace: float | None = None) -> None:
        self.session, self.loader = session, loader
        self.grace = stop_grace_s() if grace is None else grace
        self.asked_at: float | None = None
        self.late: set[int] = set()

    def __call__(self, trial_id: str, result: dict) -> bool:
        return False

    def stop_all(self) -> bool:
        session = self.session
        if session is None or not session.stop_event.is_set():  # None: unpickled
            return False
        if session.fatal is not None or self.loader is None:
            return True
        if self.asked_at is None:
            self.asked_at = time.monotonic()
            checkpoints.request_stop(self.loader)
        if session.running and time.monotonic() - self.asked_at < self.grace:
            return False
        self.late = set(session.running)
        return True

    def __getstate__(self) -> dict[str, Any]:
        return {"session": None, "loader": None, "grace": 0.0, "asked_at": None, "late": set()}


@dataclass
class FeedRun:
    outcomes: dict[int, str]  # trial id -> final status, of what ended in this run
    taken: list[int]  # every trial id the run was handed
    idle: bool = False  # it ended with nothing to run now; more may come (runner/feed.py)
    late: list[int] = field(default_factory=list)  # stopping: units still running past the grace
    units: int = 0  # Tune trials started (their retries included)


def run_feed(ctx: RunContext, next_batch: feed.ClaimSource) -> FeedRun:
    """One Ray Tune run for the driver: units of the trials ``next_batch`` gives (claims:
    runner/feed.py), started as Tune has room, until it gives no more and every unit has
    ended. Short trials are chained (feed.ChainPolicy), sized by the trials that ended."""
    from ray import tune

    spec = ctx.spec
    # gpu: auto is sized per unit and node type below (runner/fleet.py)
    cpu, pack_seeds = spec.resources.cpu, spec.pack_seeds
    gpu = spec.resources.gpu if isinstance(spec.resources.gpu, float) else 0.0
    max_cpu, max_gpu = cluster_limits()
    slots = cluster_slots(cpu, gpu)
    session = ctx.session
    # Units (and Tune's retries of them) ask this for their members' checkpoints.
    loader, loader_handle = checkpoints.start_loader(ctx.url, ctx.name, ctx.checkpoint_reads)
    packing_told = False
    modules = plugins.loaded()

    def units_of(batch: feed.Trials) -> list[dict[str, Any]]:
        nonlocal packing_told
        units = make_units(
            ctx.name,
            batch,
            cpu=cpu,
            gpu=gpu,
            pack_seeds=pack_seeds,
            max_cpu=max_cpu,
            max_gpu=max_gpu,
            slots=slots,
            stop=ctx.stop_rule(),
            chain=next_batch.chain if next_batch.chains is not None else 1,
        )
        if spec.resources.gpu == "auto" or gpu or spec.resources.accelerator:
            units = fleet.place(units, spec.resources)
        for unit in units:
            unit["loader"] = loader
            if modules:
                unit["plugins"] = modules  # the spec's plugins, imported in the worker
            if unit.get("chain"):
                unit["owner"] = session.owner  # a retried chain runs only what is still held
        if ctx.on_event is not None and pack_seeds != 1 and not packing_told:
            packing_told = True
            packs = sum(len(u["members"]) > 1 for u in units)
            size = pack_size(pack_seeds, len(batch), slots)
            ctx.on_event("packing", None, pack_seeds=pack_seeds, size=size, packs=packs, units=len(units))
        return units

    writer = StoreWriter(
        session,
        on_event=ctx.on_event,
        checkpoint_folder=ctx.checkpoint_folder,
        sweep=ctx.name,
        keep_checkpoints=ctx.spec.keep_checkpoints,
        on_duration=next_batch.chains.observe if next_batch.chains is not None else None,
    )

    def claim_next() -> feed.Trials | None:
        # The ends waiting in the writer are stored (and their trials let go) before the
        # next claim, in its transaction: one commit for the trials that ended, the rows of
        # those still running and the claim, which sees the ends settled (a sequential look
        # counts them). What the writer holds is stored even when no claim is made.
        session.claim_through = writer.flush
        try:
            batch = next_batch()
        finally:
            session.claim_through = session.write_if
        if session.fatal is None:
            writer.flush()
        return batch

    source = feed.UnitFeed(
        claim_next, units_of, stopped=lambda: session.stop_reason is not None, max_trials=feed.trials_per_tune_run()
    )
    storage = tempfile.mkdtemp(prefix="orchestrator-tune-")
    stopper = _StopWhenSet(session, loader_handle)
    try:
        from orchestrator.runner.trainable import run_unit

        tuner = tune.Tuner(
            tune.with_resources(run_unit, _unit_resources),
            tune_config=tune.TuneConfig(
                search_alg=source,
                num_samples=-1,  # as many as the feed gives: it says when there are no more
                max_concurrent_trials=ctx.max_concurrent,
                reuse_actors=True,
            ),
            run_config=tune.RunConfig(
                name=f"{ctx.name}-{int(time.time())}",
                storage_path=storage,
                verbose=0,
                callbacks=[writer],
                failure_config=tune.FailureConfig(max_failures=spec.retries),
                stop=stopper,
                log_to_file=False,
            ),
        )
        # Tune starts as many trials as it has pending at once: one per free slot keeps every
        # slot's next trial ready (an actor reused the moment its trial ends).
        with _tune_logs_quiet(), _env("TUNE_MAX_PENDING_TRIALS_PG", str(max(1, ctx.max_concurrent or slots))):
            tuner.fit()
    finally:
        if session.fatal is None:
            writer.flush()  # a database that is gone gets nothing (the checkpoints hold the rows)
        shutil.rmtree(storage, ignore_errors=True)
        checkpoints.stop_loader(loader_handle)
        _forget_encoder_keys()
    # A chain's members that never began were let go: not run here.
    taken = [t for t in source.taken if t not in writer.released]
    return FeedRun(writer.outcomes, taken, source.idle, late=sorted(stopper.late), units=writer.units_started)


# The prefix of the keys Tune's JSON encoder adds to Ray's process-wide "log once" set.
_ENCODER_KEYS = "tune_func_encode:"


def _forget_encoder_keys() -> None:
    """Drop the keys Tune's JSON encoder left in Ray's "log once" set during a run. It adds
    one per object it cannot encode, keyed by the object's text, each trial's storage
    context, metric windows and checkpoint manager among them, and never removes them: about
    four keys (1 kB) a trial, a driver growing with every trial it has run. They only gate a
    debug line. (A private set: if a Ray release renames it, nothing is dropped.)"""
    from ray.util import debug

    logged = getattr(debug, "_logged", None)
    if isinstance(logged, set):
        logged.difference_update([k for k in logged if isinstance(k, str) and k.startswith(_ENCODER_KEYS)])


@contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    """``$name`` set to ``value`` while the block runs (Tune reads some settings only so)."""
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved
