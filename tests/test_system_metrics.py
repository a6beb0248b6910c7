"""Per-trial system metrics (issue 32 item 3): the worker's sampler against psutil, the wire
form, the writer's flush (idempotent, the ownership check, the attempt), SQL through
`orchestrator sql`, sweep delete, `status --trial`, the trial page, and real sweeps (lone
trials and a seed pack) on SQLite and PostgreSQL."""

from __future__ import annotations

import html as html_lib
import json
import os
import re
from types import SimpleNamespace

import psutil
import pytest
import sqlalchemy as sa
import torch

from conftest import BACKENDS, TINY_FIXED, backend_url, claimed_writer, fill_sweep, query
from orchestrator.cli import main
from orchestrator.store import attempts, repo
from orchestrator.store.engine import open_store_engine
from orchestrator.train.sysmetrics import SAMPLE_FIELDS, Sampler, SystemSample

ENV = {"host": "h1", "device": "cpu", "precision": "fp32", "code_version": "git:abc"}


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


# ---- the sampler, against psutil itself ---------------------------------------------------------


def test_rss_follows_what_the_process_allocates():
    sampler = Sampler(torch.device("cpu"))
    before = sampler.sample(1)
    held = bytearray(100 * 2**20)
    held[::4096] = b"x" * len(held[::4096])  # touch every page: resident, not just reserved
    after = sampler.sample(2)
    own = psutil.Process().memory_info().rss
    assert before.rss_bytes is not None and after.rss_bytes is not None
    assert after.rss_bytes - before.rss_bytes >= 90 * 2**20
    assert abs(after.rss_bytes - own) < 20 * 2**20  # the same process psutil sees
    del held


def test_cpu_percent_is_the_process_cpu_time_over_the_wall_time():
    clock = _Clock()
    sampler = Sampler(torch.device("cpu"), clock=clock)
    t0 = psutil.Process().cpu_times()
    x = 0
    for i in range(3_000_000):  # busy: CPU time the sample must see
        x += i * i
    t1 = psutil.Process().cpu_times()
    used = (t1.user + t1.system) - (t0.user + t0.system)
    clock.t += 2.0  # the sample's wall time: what the CPU time is a share of
    s = sampler.sample(10)
    assert used > 0 and s.cpu_pct is not None
    assert s.cpu_pct == pytest.approx(100 * used / 2.0, abs=100 * 0.05 / 2.0)
    clock.t += 1.0
    assert sampler.sample(20).cpu_pct >= 0


def test_steps_per_second_since_the_previous_sample_and_from_the_resumed_step():
    clock = _Clock()
    sampler = Sampler(torch.device("cpu"), start_step=100, clock=clock)
    clock.t += 4.0
    first = sampler.sample(120)
    clock.t += 0.5
    second = sampler.sample(130)
    assert first.steps_per_s == pytest.approx(5.0) and second.steps_per_s == pytest.approx(20.0)
    assert first.elapsed_s == pytest.approx(4.0) and second.elapsed_s == pytest.approx(4.5)
    # The same step again (nothing trained in between): no rate rather than zero or inf.
    assert sampler.sample(130).steps_per_s is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU case")
def test_gpu_columns_are_none_on_the_cpu_and_a_missing_gpu_is_quiet():
    assert Sampler(torch.device("cpu")).sample(1).gpu_util_pct is None
    # A CUDA device on a machine without one (no driver, NVML absent or failing): Nones, no error.
    s = Sampler(torch.device("cuda", 0)).sample(1)
    assert (s.gpu_util_pct, s.gpu_mem_bytes) == (None, None) and s.rss_bytes and s.rss_bytes > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_columns_on_cuda():  # pragma: no cover - runs where there is a GPU
    x = torch.ones(64 * 2**20, device="cuda")
    s = Sampler(torch.device("cuda", 0)).sample(1)
    assert s.gpu_mem_bytes is not None and s.gpu_mem_bytes >= x.numel() * 4
    assert s.gpu_util_pct is not None and 0 <= s.gpu_util_pct <= 100


# ---- the wire form and the writer --------------------------------------------------------------


def _point(step: int):
    from orchestrator.train.loop import EvalPoint

    return EvalPoint(step, 0.5, 1.0, 1.0, 1e-3, float(step))


def test_a_pack_report_carries_one_sample_for_every_member_through_json():
    from orchestrator.runner.messages import EvalRow, Report

    sample = SystemSample(20, 3.5, 150.0, 123_456_789, None, None, 12.5)
    report = Report(evals=(EvalRow(7, _point(20)), EvalRow(8, _point(20))), system=sample)
    back = Report.from_wire(json.loads(json.dumps(report.to_wire())))  # Tune may pass it through JSON
    assert back.system == sample
    rows = back.system_rows()
    assert [r["trial_id"] for r in rows] == [7, 8]
    assert rows[0] == {"trial_id": 7, "step": 20, **{f: getattr(sample, f) for f in SAMPLE_FIELDS}}
    assert Report(evals=report.evals).system_rows() == [] and "system" not in Report().to_wire()


def _trial(tids):
    """What the writer reads of a Tune trial: its unit's members."""
    return SimpleNamespace(
        trial_id="tune" + "_".join(map(str, tids)),
        config={"unit": {"members": [{"trial_id": t, "key": f"k{t}"} for t in tids]}},
    )


def test_the_writer_stores_samples_with_their_rows_once_and_not_for_a_trial_taken_over(db_url):
    from orchestrator.runner.messages import EvalRow, Report

    with claimed_writer(db_url, 2, n_steps=1) as (engine, (mine, taken), session, writer):
        with engine.begin() as conn:
            for t in (mine, taken):
                attempts.begin_attempt(conn, t, None, ENV, session.owner)
            attempts.begin_attempt(conn, mine, None, ENV, session.owner)  # mine is on attempt 2
        for cpu in (50.0, 75.0):  # the same step reported twice (a re-report): one row, the last
            sample = SystemSample(50, 2.0, cpu, 200 * 2**20, None, None, 25.0)
            report = Report(evals=(EvalRow(mine, _point(50)),), system=sample)
            writer.on_trial_result(0, [], _trial([mine]), report.to_wire())
        writer.flush()
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE trials SET claimed_by = 'other' WHERE id = :t"), {"t": taken})
        report = Report(evals=(EvalRow(taken, _point(60)),), system=SystemSample(60, 3.0, 1.0, 1, None, None, 1.0))
        writer.on_trial_result(0, [], _trial([taken]), report.to_wire())
        writer.flush()
        assert not writer._system
    rows = query(db_url, "SELECT trial_id, step, attempt, cpu_pct, rss_bytes, steps_per_s FROM system_metrics")
    assert [tuple(r) for r in rows] == [(mine, 50, 2, 75.0, 200 * 2**20, 25.0)]


def test_a_new_attempt_drops_the_samples_past_its_step_and_delete_takes_them(db_url):
    engine, _ = open_store_engine(db_url)
    sid, ids = fill_sweep(engine, n_trials=1, n_steps=3)
    (tid,) = ids.values()
    with engine.begin() as conn:
        attempts.begin_attempt(conn, tid, None, ENV, "d")
        n = repo.upsert_system_metrics(
            conn,
            [
                {"trial_id": tid, "step": s, "cpu_pct": float("nan"), "rss_bytes": 10.0, "steps_per_s": 1.0}
                for s in (10, 20, 30)
            ],
        )
        assert n == 3
        attempts.begin_attempt(conn, tid, 20, ENV, "d")  # resumed from step 20
    assert [
        tuple(r) for r in query(db_url, "SELECT step, attempt, cpu_pct, rss_bytes FROM system_metrics ORDER BY step")
    ] == [
        (10, 1, None, 10),
        (20, 1, None, 10),
    ]
    with engine.begin() as conn:
        counts = repo.delete_sweep(conn, sid)
    assert counts["system_metrics"] == 2 and query(db_url, "SELECT COUNT(*) FROM system_metrics")[0][0] == 0
    engine.dispose()


# ---- reading: orchestrator sql, status --trial, the trial page ----------------------------------


def _sampled(db_url: str) -> tuple[str, int]:
    """A sweep ``s1`` with one trial that has an attempt and three samples; (key, trial id)."""
    engine, _ = open_store_engine(db_url)
    sid, ids = fill_sweep(engine, n_trials=1, n_steps=3)
    ((key, tid),) = ids.items()
    with engine.begin() as conn:
        repo.set_placement(conn, tid, "h1", "ab" * 28, "cpu (fp32)")
        attempts.begin_attempt(conn, tid, None, {**ENV, "code_version": "git:" + "f" * 60}, "drv:1")
        repo.upsert_system_metrics(
            conn,
            [
                {
                    "trial_id": tid,
                    "step": 10 * s,
                    "elapsed_s": float(s),
                    "cpu_pct": 90.0 + s,
                    "rss_bytes": s * 2**20 * 100,
                    "steps_per_s": 10.0 * s,
                }
                for s in (1, 2, 3)
            ],
        )
    engine.dispose()
    return key, tid


def test_sql_reads_system_metrics_on_both_backends(db_url, capsys):
    _, tid = _sampled(db_url)
    capsys.readouterr()
    assert main(["sql", "SELECT * FROM system_metrics ORDER BY step", "--db", db_url, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["step"] for r in rows] == [10, 20, 30] and {r["trial_id"] for r in rows} == {tid}
    assert set(rows[0]) == {
        "trial_id",
        "step",
        "attempt",
        "elapsed_s",
        "cpu_pct",
        "rss_bytes",
        "gpu_util_pct",
        "gpu_mem_bytes",
        "steps_per_s",
    }
    q = "SELECT t.key, AVG(m.steps_per_s) AS r FROM system_metrics m JOIN trials t ON t.id = m.trial_id GROUP BY t.key"
    assert main(["sql", q, "--db", db_url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["r"] == pytest.approx(20.0)


def test_status_trial_shows_the_last_sample_and_the_mean_rate(tmp_path, capsys):
    db = f"sqlite:///{tmp_path / 's.db'}"
    key, _ = _sampled(db)
    capsys.readouterr()
    assert main(["status", "s1", "--trial", key, "--db", db]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "system at step 30: CPU 93%, RSS 300 MiB; mean 20.0 steps/s over 3 sample(s)" in out
    assert main(["status", "s1", "--trial", key, "--db", db, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["system"]
    assert got["last"]["step"] == 30 and got["mean_steps_per_s"] == pytest.approx(20.0)


def test_the_trial_page_carries_the_system_chart_and_labels_the_ray_node(tmp_path):
    from orchestrator.store.reader import open_reader_engine
    from orchestrator.ui.app import create_app
    from ui_support import asgi_get

    db = f"sqlite:///{tmp_path / 'p.db'}"
    key, _ = _sampled(db)
    engine, shown = open_reader_engine(db)
    app = create_app(engine, shown)
    try:
        code, _, body = asgi_get(app, f"/sweeps/s1/trials/{key}")
        code2, _, api = asgi_get(app, f"/api/sweeps/s1/trials/{key}/system")
        code3, _, missing = asgi_get(app, "/api/sweeps/s1/trials/nope/system")
    finally:
        engine.dispose()
    page = body.decode()
    assert code == 200 and code2 == 200 and code3 == 404
    attr = re.search(r"<div id=\"system\" class=\"plot\" data-series='([^']*)'>", page)
    assert attr is not None
    data = json.loads(html_lib.unescape(attr.group(1)))
    assert data == json.loads(api)
    assert data["step"] == [10, 20, 30] and data["cpu_pct"] == [91.0, 92.0, 93.0]
    assert data["rss_mb"] == [100.0, 200.0, 300.0] and data["steps_per_s"] == [10.0, 20.0, 30.0]
    assert "gpu_util_pct" not in data  # a CPU trial draws no GPU series
    assert 'id="system-none" class="note" hidden' in page
    # The node id: labelled, shortened on the page, whole in the title.
    assert "<th>Ray node</th>" in page and f'title="{"ab" * 28}">{"ab" * 6}…</span>' in page
    assert 'id="attempts" class="grid"' in page


def test_the_attempts_table_stays_inside_the_page():
    css = open(os.path.join(os.path.dirname(__file__), "..", "orchestrator", "ui", "static", "style.css")).read()
    assert "div.wide { overflow-x: auto; max-width: 100%; }" in css and "#attempts td { overflow-wrap: anywhere;" in css


# ---- real sweeps ---------------------------------------------------------------------------------

SPEC = (
    "\nname: sysm\n"
    + TINY_FIXED
    + "axes:\n  arm: [gated_deltanet, armed_gdn]\n  seed: 0..1\n"
    + "budget: {steps: 30, eval_every: 10}\nresources: {cpu: 1}\nmax_concurrent: 2\n"
)


def _check_sweep(url: str) -> int:
    trials = query(url, "SELECT id, status FROM trials")
    assert trials and {t.status for t in trials} == {"completed"}
    evals = {(r.trial_id, r.step) for r in query(url, "SELECT trial_id, step FROM evals")}
    rows = query(url, "SELECT * FROM system_metrics")
    assert {(r.trial_id, r.step) for r in rows} == evals and len(rows) == len(evals) == 4 * len(trials)
    newest = dict(query(url, "SELECT trial_id, MAX(attempt) FROM attempts GROUP BY trial_id"))
    for r in rows:
        assert r.cpu_pct is not None and r.cpu_pct >= 0
        assert r.rss_bytes > 50 * 2**20  # a worker with torch loaded
        assert r.steps_per_s is not None and r.steps_per_s > 0
        assert r.elapsed_s > 0 and r.attempt == newest[r.trial_id] == 1
        assert r.gpu_util_pct is None and r.gpu_mem_bytes is None
    return len(trials)


@pytest.mark.slow
@pytest.mark.usefixtures("shared_ray")
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sweep_stores_one_sample_per_eval_step_of_every_trial(tmp_path, backend):
    url, drop = backend_url(tmp_path, backend)
    try:
        spec = tmp_path / "spec.yaml"
        spec.write_text(SPEC)
        assert main(["submit", str(spec), "--db", url, "--quiet"]) == 0
        assert _check_sweep(url) == 4
    finally:
        drop()


@pytest.mark.slow
@pytest.mark.usefixtures("shared_ray")
def test_a_seed_pack_shares_its_process_sample_among_its_members(tmp_path):
    url = f"sqlite:///{tmp_path / 'p.db'}"
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC + "pack_seeds: 2\n")
    assert main(["submit", str(spec), "--db", url, "--quiet"]) == 0
    assert _check_sweep(url) == 4
    # Each pack's two members got the same sample at every step.
    shared = query(
        url,
        "SELECT t.arm, m.step, COUNT(*) AS n, COUNT(DISTINCT m.rss_bytes) AS d FROM system_metrics m "
        "JOIN trials t ON t.id = m.trial_id GROUP BY t.arm, m.step",
    )
    assert len(shared) == 8 and {(r.n, r.d) for r in shared} == {(2, 1)}


@pytest.mark.slow
@pytest.mark.skipif(__import__("shutil").which("chromium") is None, reason="Debian's chromium is not installed")
def test_the_trial_page_draws_the_system_chart_in_a_browser_and_keeps_its_tables_in_the_page(tmp_path):
    from ui_support import chromium, ui_server, wait_for

    db = f"sqlite:///{tmp_path / 'b.db'}"
    key, tid = _sampled(db)
    engine, _ = open_store_engine(db)
    with engine.begin() as conn:  # more attempts, with long unbroken values, to widen the table
        for i in range(3):
            attempts.begin_attempt(conn, tid, 30, {**ENV, "code_version": f"git:{i}" + "e" * 70}, "d" * 60)
    engine.dispose()
    with ui_server(db) as base:
        driver = chromium()
        try:
            driver.set_window_size(900, 1200)
            driver.get(f"{base}/sweeps/s1/trials/{key}")
            xs = wait_for(
                lambda: driver.execute_script(
                    "const d = document.getElementById('system'); return d.data && d.data.map(t => [t.name, t.x]);"
                ),
                30,
                "the system chart",
            )
            assert xs == [["CPU %", [10, 20, 30]], ["RSS (MiB)", [10, 20, 30]], ["steps/s", [10, 20, 30]]]
            assert not driver.find_element("id", "system-none").is_displayed()
            node = driver.find_element("id", "node-id")
            assert node.text == "ab" * 6 + "…" and node.get_attribute("title") == "ab" * 28
            width, page, box = driver.execute_script(
                "const b = document.querySelector('div.wide').getBoundingClientRect();"
                "return [document.documentElement.clientWidth, document.documentElement.scrollWidth, b.right];"
            )
            assert page <= width and box <= width
        finally:
            driver.quit()
