"""A trial whose node died mid-task fails as a trial, not as the driver (Ray 2.60's Tune).

When a node dies, the result of the actor task Tune was waiting on (a trial's next report)
can be lost with it. Ray then raises ``ObjectLostError`` (``ObjectReconstructionFailedError``:
an actor task is never re-executed) instead of ``RayActorError``, and Tune's actor manager
turns anything but those two into a ``RuntimeError`` that ends ``tuner.fit()`` and with it
the driver ("Caught unexpected exception: Failed to retrieve object ..."; seen in
tests/test_cluster.py's node kill, about one run in five on a loaded machine). The actor is
gone with its node either way, so the lost result is passed on as the actor's death: Tune
then fails the trial and retries it, and the retry resumes from the trial's stored
checkpoint, as after any dead actor. Installed on import of the Tune runner."""

from __future__ import annotations

from typing import Any

from ray.air.execution._internal import actor_manager
from ray.exceptions import ObjectLostError, RayActorError

_MARK = "_orchestrator_lost_results"


def as_actor_death(exception: Exception) -> Exception:
    """``exception`` as Tune's actor manager should see it: a lost task result is the death
    of the actor that was to produce it (the original kept as its cause); anything else is
    unchanged."""
    if isinstance(exception, ObjectLostError) and not isinstance(exception, RayActorError):
        died = RayActorError(error_msg=f"the trial's result was lost with its node: {exception}")
        died.__cause__ = exception
        return died
    return exception


def install() -> None:
    """Route actor task failures through :func:`as_actor_death` (once per process)."""
    manager = actor_manager.RayActorManager
    if getattr(manager._actor_task_failed, _MARK, False):
        return
    original = manager._actor_task_failed

    def _actor_task_failed(self: Any, tracked_actor_task: Any, exception: Exception) -> Any:
        return original(self, tracked_actor_task, as_actor_death(exception))

    setattr(_actor_task_failed, _MARK, True)
    manager._actor_task_failed = _actor_task_failed  # type: ignore[method-assign]
