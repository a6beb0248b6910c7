"""What the database keeps about a sweep besides its traces: the spec it was submitted with
(whose ``analysis:`` block is the sweep's design for the report) and how far it has run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Engine

from orchestrator.status import FINISHED
from orchestrator.store import reader


@dataclass
class Completion:
    """Trials of a sweep by status; ``finished`` counts completed and diverged ones."""

    total: int
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def finished(self) -> int:
        return sum(self.counts.get(s.value, 0) for s in FINISHED)

    @property
    def complete(self) -> bool:
        return self.finished == self.total

    def warning(self) -> str | None:
        """One line when the sweep is unfinished, else None."""
        if self.complete:
            return None
        st = ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))
        return (
            f"unfinished sweep: {self.finished} of {self.total} trials finished ({st}); "
            "the tables cover the finished trials only"
        )


def stored_spec(engine: Engine, sweep: str) -> dict[str, Any] | None:
    """The spec stored with ``sweep`` as a mapping (None when the sweep or its text is absent
    or not a mapping, e.g. an imported sweep)."""
    from orchestrator.yaml_load import load_strict

    with engine.connect() as conn:
        text = reader.spec_text(conn, sweep)
    if not text:
        return None
    try:
        spec = load_strict(text)
    except Exception:  # an imported sweep's placeholder text: no design to reuse
        return None
    return spec if isinstance(spec, dict) else None


def completion(engine: Engine, sweep: str) -> Completion:
    with engine.connect() as conn:
        counts = reader.status_counts(conn, sweep)
    return Completion(total=sum(counts.values()), counts=counts)
