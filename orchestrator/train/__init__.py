"""The training loop. Knows nothing of Ray or SQL: it yields eval points and can be
checkpointed and restored; the runner turns eval points into reports, the store into rows."""

from orchestrator.train.loop import EvalPoint, Trainer

__all__ = ["EvalPoint", "Trainer"]
