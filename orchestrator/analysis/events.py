"""The analysis's events are the shared ones: :mod:`orchestrator.events` defines every event
(escape, collapse, divergence, censoring, outcome class, lock-in) once, for the analysis,
the training loop's stop rule and a sequential design's looks alike."""

from orchestrator.events import (
    EVENT_COLUMNS,
    OUTCOMES,
    events,
    n_stopped,
    trace_events,
    trial_events,
    with_events,
)

__all__ = ["EVENT_COLUMNS", "OUTCOMES", "events", "n_stopped", "trace_events", "trial_events", "with_events"]
