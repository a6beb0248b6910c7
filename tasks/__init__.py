"""Synthetic recall and state-tracking tasks with their floors, controls and curricula.

Python API::

    import tasks
    task = tasks.build("mqar", K=32)                  # ValueError on unknown/ill-typed params
    gen = tasks.train_generator(data_seed=0, device="cuda")
    cur = task.curriculum(total_steps)                # None unless the params ask for one
    x, y = task.train_batch(64, gen, cur.state() if cur else None)   # y = -100 off-loss
    evals = task.eval_batches(seed=0, device="cuda")  # fixed held-out set, scored positions only
    rebind = task.rebinding_batches(seed=0)           # None where the control does not apply
    task.floors()                                     # {"value_marginal": ..., ...}

See :mod:`tasks.base` for the conventions shared by all tasks and each task module for its
layout and token ranges.
"""

from tasks.base import IGNORE, Task
from tasks.curriculum import Curriculum, GatedGap, RampGap, UniformGap
from tasks.registry import NAMES, REGISTRY, build, params, register_task, validate
from tasks.seeding import train_generator

__all__ = [
    "IGNORE",
    "NAMES",
    "REGISTRY",
    "Curriculum",
    "GatedGap",
    "RampGap",
    "Task",
    "UniformGap",
    "build",
    "params",
    "register_task",
    "train_generator",
    "validate",
]
