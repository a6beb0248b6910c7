"""Launch trials on Ray Tune (embedded local Ray, or a running cluster via ``address``).

Identity is ours, not Tune's: every Tune trial carries our trial id, stable key and checkpoint
path in its config, so a fresh launch after a crash picks each trial up where its checkpoint
left it.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine

from orchestrator.errors import UserError
from orchestrator.runner import checkpoints
from orchestrator.runner.writer import StoreWriter

# Tune's own JSON/CSV/TensorBoard loggers would duplicate every result on disk; the
# database is our log. The new console output engine would print tables over our bar.
os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
os.environ.setdefault("TUNE_RESULT_BUFFER_LENGTH", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


def init_ray(address: str | None, *, num_cpus: int | None = None) -> bool:
    """Connect to ``address`` (``auto`` or ``HOST:PORT``) or start an embedded local Ray.
    Returns True when this call started Ray (so the caller shuts it down)."""
    import ray

    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False,
                                  logging_level=logging.ERROR, configure_logging=True)
    if address:
        try:
            ray.init(address=address, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise UserError(f"--address {address}: cannot join the Ray cluster: "
                            f"{str(exc).splitlines()[0]}") from None
    else:
        ray.init(num_cpus=num_cpus, **kwargs)
    return True


def check_resources(cpu: float, gpu: float) -> None:
    """Refuse a per-trial request that no node of the cluster can ever satisfy."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    max_cpu = max((n["Resources"].get("CPU", 0.0) for n in nodes), default=0.0)
    max_gpu = max((n["Resources"].get("GPU", 0.0) for n in nodes), default=0.0)
    if cpu > max_cpu:
        raise UserError(f"impossible resources: resources.cpu={cpu:g} per trial but the largest "
                        f"node has {max_cpu:g} CPUs")
    if gpu > max_gpu:
        raise UserError(f"impossible resources: resources.gpu={gpu:g} per trial but the largest "
                        f"node has {max_gpu:g} GPUs")


def run_trials(sweep: str, trials: Sequence[tuple[int, str, dict[str, Any]]], *,
               engine: Engine, checkpoint_root: Path, cpu: float, gpu: float,
               max_concurrent: int | None, retries: int,
               on_event: Callable[..., None] | None = None) -> dict[int, str]:
    """Run (trial_id, key, params) trials to their end; returns trial_id -> final status."""
    from ray import tune

    if not trials:
        return {}
    configs = [{
        "trial_id": tid, "key": key, "params": params,
        "checkpoint": str(checkpoints.trial_path(checkpoint_root, sweep, key)),
        "threads": max(1, int(params.get("threads") or cpu)),
    } for tid, key, params in trials]
    writer = StoreWriter(engine, on_event=on_event)
    resources: dict[str, float] = {"cpu": cpu}
    if gpu:
        resources["gpu"] = gpu
    storage = tempfile.mkdtemp(prefix="orchestrator-tune-")
    try:
        from orchestrator.runner.trainable import run_trial

        tuner = tune.Tuner(
            tune.with_resources(run_trial, resources),
            param_space={"trial": tune.grid_search(configs)},
            tune_config=tune.TuneConfig(
                max_concurrent_trials=max_concurrent, reuse_actors=True),
            run_config=tune.RunConfig(
                name=f"{sweep}-{int(time.time())}", storage_path=storage, verbose=0,
                callbacks=[writer], failure_config=tune.FailureConfig(max_failures=retries),
                log_to_file=False),
        )
        tuner.fit()
    finally:
        writer.flush()
        shutil.rmtree(storage, ignore_errors=True)
    return writer.outcomes
