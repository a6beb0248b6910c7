"""The Ray Tune function trainable: one trial in one worker.

It resumes from the trial's own checkpoint file when there is one (first re-reporting the
trace the checkpoint holds, so eval rows the database missed are back-filled), then reports
each eval point as it comes. Reports carry lists of eval points; the driver-side callback
writes them.
"""
from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import torch
from ray import tune

from orchestrator.runner import checkpoints
from orchestrator.train import Trainer
from orchestrator.train.device import describe


def _placement(trainer: Trainer) -> dict[str, Any]:
    import ray

    try:
        node_id = ray.get_runtime_context().get_node_id()
    except Exception:  # pragma: no cover - outside Ray
        node_id = None
    return {"host": socket.gethostname(), "node_id": node_id,
            "device": describe(trainer.device, trainer.bf16)}


def run_trial(config: dict[str, Any]) -> None:
    spec = config["trial"]
    threads = spec.get("threads") or 1
    torch.set_num_threads(int(threads))
    trainer = Trainer(spec["params"])
    ckpt = Path(spec["checkpoint"])
    state = checkpoints.load(ckpt)
    if state is not None:
        trainer.load_state_dict(state)
    tune.report({"trial_id": spec["trial_id"], "evals": [e.to_dict() for e in trainer.trace],
                 "placement": _placement(trainer)})
    every = trainer.p.checkpoint_every_s
    last_save = time.monotonic()
    for point in trainer.run():
        if point.step == trainer.p.steps or time.monotonic() - last_save >= every:
            checkpoints.save(ckpt, trainer.state_dict())
            last_save = time.monotonic()
        tune.report({"trial_id": spec["trial_id"], "evals": [point.to_dict()]})
    # The final state (completed or diverged) is checkpointed too, so a driver that dies
    # before recording the outcome does not make the trial train again.
    checkpoints.save(ckpt, trainer.state_dict())
    tune.report({"trial_id": spec["trial_id"], "evals": [], "final_status": trainer.status,
                 "error": trainer.error})
