"""A task result lost with its node is passed to Tune's actor manager as the actor's death
(runner/lost_results.py), so Tune retries the trial instead of ending the driver; anything
else reaches Tune unchanged, and Tune still refuses what it does not know."""

from __future__ import annotations

import pytest
from ray.air.execution._internal.actor_manager import RayActorManager
from ray.air.execution._internal.tracked_actor import TrackedActor
from ray.air.execution._internal.tracked_actor_task import TrackedActorTask
from ray.air.execution.resources import FixedResourceManager
from ray.exceptions import ObjectReconstructionFailedError, RayActorError, RayTaskError

import orchestrator.runner.tune_runner  # noqa: F401  (installs the translation)
from orchestrator.runner.lost_results import as_actor_death, install


def _lost() -> ObjectReconstructionFailedError:
    return ObjectReconstructionFailedError("b0edf95058", reason_message="the task was created with max_retries=0")


def test_a_lost_result_becomes_the_actors_death_with_its_cause():
    lost = _lost()
    died = as_actor_death(lost)
    assert isinstance(died, RayActorError) and died.__cause__ is lost
    assert "lost with its node" in str(died) and "b0edf95058" in str(died)
    other = ValueError("x")
    assert as_actor_death(other) is other
    actor_error = RayActorError()
    assert as_actor_death(actor_error) is actor_error


def test_tunes_actor_manager_gets_the_translation_once(monkeypatch):
    install()  # a second install changes nothing
    # No Ray: asked for its runtime context, cluster or placement group, Ray would start one in
    # this process just to answer (a dashboard, every core), left running for the tests after
    # it on this worker. The manager is given its resources, and told it is in no placement
    # group (as a driver outside Ray is): the translation under test needs no cluster.
    monkeypatch.setattr("ray._private.auto_init_hook.enable_auto_connect", False)
    monkeypatch.setattr("ray.util.get_current_placement_group", lambda: None)
    manager = RayActorManager(FixedResourceManager({"CPU": 1}))
    seen: list[BaseException] = []
    actor = TrackedActor(1)
    task = TrackedActorTask(actor, on_error=lambda _a, e: seen.append(e))
    # Tune's task-error branch (no actor bookkeeping) still runs as before ...
    task_error = RayTaskError("f", "traceback", ValueError("boom"))
    manager._actor_task_failed(task, task_error)
    assert seen == [task_error]
    # ... and what it does not know is still refused, so nothing else is swallowed.
    with pytest.raises(RuntimeError, match="Caught unexpected exception"):
        manager._actor_task_failed(task, ValueError("x"))
    # A lost result reaches the actor-death branch: the actor it names is cleaned up (this
    # bare one is unknown to the manager, so the cleanup's lookup is what fails here).
    with pytest.raises(KeyError):
        manager._actor_task_failed(task, _lost())
    assert manager._failed_actor_ids == {actor.actor_id}
