"""The terminal view of a running sweep: an overall bar in training steps and a table of the
running trials (label, step/steps, last accuracy, elapsed).

``submit``/``resume`` feed it from the runner's events (:class:`TrialBoard`);
``orchestrator status SWEEP --watch`` fills the same view from the database
(:func:`board_from_db`), so a second terminal, or another machine pointed at PostgreSQL,
sees what the submitting terminal sees. The ETA is steps left over the rate of steps so far
(:func:`eta_seconds`), so it moves from the first eval on instead of waiting for a trial to
finish.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from orchestrator.status import ENDED, Status

LABEL_PARAMS = ("arm", "lr", "seed")
MAX_ROWS = 20


def eta_seconds(done: float, total: float, elapsed_s: float) -> float | None:
    """Seconds left at the mean rate so far (done steps in elapsed_s); None before any."""
    if done <= 0 or elapsed_s <= 0 or total <= 0:
        return None
    return max(0.0, (total - done) * elapsed_s / done)


def fmt_eta(s: float | None) -> str:
    if s is None:
        return "-:--:--"
    s = int(round(s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def short_label(key: str, params: dict[str, Any] | None) -> str:
    p = params or {}
    bits = [f"{n}={p[n]}" for n in LABEL_PARAMS if p.get(n) is not None]
    return f"{key[:8]} " + " ".join(bits)


@dataclass
class Running:
    label: str
    steps: int | None
    step: int = 0
    acc: float | None = None
    started: float = field(default_factory=time.monotonic)


@dataclass
class TrialBoard:
    """What the terminal shows, fed by events (submit/resume) or read from the database."""

    total_steps: int = 0
    base_steps: int = 0  # steps of trials finished before this view started counting
    finished_steps: int = 0
    running: dict[str, Running] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    t0: float | None = None
    elapsed_override: float | None = None  # from the database clock (status --watch)
    eta_override: float | None = None

    def start(self, key: str, params: dict[str, Any] | None) -> None:
        steps = (params or {}).get("steps")
        self.running[key] = Running(short_label(key, params), int(steps) if steps else None)
        if self.t0 is None:
            self.t0 = time.monotonic()

    def result(self, key: str, step: int, acc: float | None) -> None:
        r = self.running.get(key)
        if r is not None and step >= r.step:
            r.step, r.acc = int(step), acc

    def finish(self, key: str) -> None:
        r = self.running.pop(key, None)
        if r is not None:
            self.finished_steps += r.steps or r.step

    @property
    def done_steps(self) -> int:
        return self.finished_steps + sum(min(r.step, r.steps or r.step) for r in self.running.values())

    def elapsed(self) -> float:
        if self.elapsed_override is not None:
            return self.elapsed_override
        return time.monotonic() - self.t0 if self.t0 is not None else 0.0

    def eta(self) -> float | None:
        if self.eta_override is not None:
            return self.eta_override
        return eta_seconds(self.done_steps, self.total_steps, self.elapsed())

    def table(self) -> Table:
        t = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        t.add_column("running trial", justify="left")
        for col in ("step", "acc", "elapsed"):
            t.add_column(col, justify="right")
        now = time.monotonic()
        rows = sorted(self.running.values(), key=lambda r: r.started)
        for r in rows[:MAX_ROWS]:
            t.add_row(
                r.label, f"{r.step}/{r.steps or '?'}", "" if r.acc is None else f"{r.acc:.3f}", fmt_eta(now - r.started)
            )
        if len(rows) > MAX_ROWS:
            t.add_row(f"... {len(rows) - MAX_ROWS} more", "", "", "")
        return t


class BoardProgress(Progress):
    """A rich Progress whose display is the overall bar plus the board's trial table."""

    def __init__(self, board: TrialBoard, **kwargs: Any):
        self.board = board  # before Progress.__init__, which renders once
        super().__init__(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed:,.0f}/{task.total:,.0f} steps"),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            TextColumn("ETA {task.fields[eta]}"),
            **kwargs,
        )
        self.task = self.add_task("steps", total=max(board.total_steps, 1), detail="", eta=fmt_eta(None))

    def sync(self, detail: str) -> None:
        b = self.board
        self.update(self.task, total=max(b.total_steps, 1), completed=b.done_steps, detail=detail, eta=fmt_eta(b.eta()))

    def get_renderables(self):
        yield self.make_tasks_table(self.tasks)
        if self.board.running:
            yield self.board.table()


def board_from_db(engine, sweep: str) -> tuple[TrialBoard, dict[str, Any]]:
    """The board of a sweep as the database has it now, and its ``progress_report`` entry."""
    from orchestrator.store import reader
    from orchestrator.store.progress import progress_report

    st = progress_report(engine, sweep)["sweeps"][0]
    with engine.connect() as conn:
        now = reader.db_now(conn)
        rows = reader.live_rows(conn, sweep)
    board = TrialBoard(counts=st["counts"])
    mono = time.monotonic()
    starts = []
    for r in rows:
        steps = int(r.steps or 0)
        board.total_steps += steps
        started = reader.aware(r.started_at)
        if started is not None:
            starts.append(started)
        if r.status == Status.running:
            params = r.params if isinstance(r.params, dict) else json.loads(r.params or "{}")
            run = Running(short_label(r.key, params), steps or None, int(r.final_step or 0), r.final_acc)
            if started is not None and now is not None:
                run.started = mono - (now - started).total_seconds()
            board.running[r.key] = run
        elif r.status in ENDED:
            board.finished_steps += steps  # as `orchestrator status` counts them
    if starts and now is not None:
        board.elapsed_override = (now - min(starts)).total_seconds()
    board.eta_override = st.get("eta_s")
    return board, st


# How the bar's detail names each count (a status, or the runner's "retry").
SHORT = {
    Status.pending: "wait",
    Status.running: "run",
    Status.completed: "ok",
    Status.diverged: "div",
    Status.failed: "fail",
    "retry": "retry",
}


def counts_detail(counts: dict[str, int]) -> str:
    return " ".join(f"{SHORT.get(k, k)} {v}" for k, v in counts.items() if v or k in (Status.running, Status.completed))


def watch(engine, sweep: str, interval: float, console) -> dict[str, Any]:
    """Redraw the sweep's board from the database every ``interval`` seconds until no trial
    is pending or running (or Ctrl-C); returns the last status entry."""
    board, st = board_from_db(engine, sweep)
    with BoardProgress(board, console=console, auto_refresh=False, transient=False) as prog:
        try:
            while True:
                prog.board = board
                prog.sync(counts_detail(st["counts"]))
                prog.refresh()
                if not (st["counts"].get(Status.running) or st["counts"].get(Status.pending)):
                    return st
                time.sleep(interval)
                board, st = board_from_db(engine, sweep)
        except KeyboardInterrupt:
            return st
