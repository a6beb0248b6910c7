"""Load figures of a real `orchestrator ui` process (issue 30): N GETs of a sweep's trials
table from C client threads (keep-alive connections, 127.0.0.1 only), on SQLite and on
PostgreSQL; prints the status counts, p50/p99 latency and the server's peak RSS.

    .venv/bin/python tests/ui_load.py --requests 2000 --clients 50 [--backend sqlite|postgresql]

PostgreSQL needs ORCH_TEST_POSTGRES_URL (a schema and a reader role are made and dropped).
"""

from __future__ import annotations

import argparse
import http.client
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def run(url: str, requests: int, clients: int, trials: int, path: str) -> dict:
    from conftest import fill_sweep
    from orchestrator.store.engine import open_store_engine
    from ui_support import ui_process

    engine, _ = open_store_engine(url)
    fill_sweep(engine, "s1", n_trials=trials, n_steps=10)
    engine.dispose()
    with ui_process(url) as (base, proc, _banner):
        port = int(base.rpartition(":")[2])
        start_rss = rss_kb(proc.pid)
        peak = [start_rss]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], rss_kb(proc.pid))
                time.sleep(0.05)

        threading.Thread(target=sample, daemon=True).start()
        per_client = [requests // clients + (1 if i < requests % clients else 0) for i in range(clients)]

        def client(n: int) -> list[tuple[int, float]]:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            out = []
            for _ in range(n):
                t0 = time.perf_counter()
                try:
                    conn.request("GET", path)
                    r = conn.getresponse()
                    r.read()
                    out.append((r.status, time.perf_counter() - t0))
                except (OSError, http.client.HTTPException):
                    out.append((-1, time.perf_counter() - t0))
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            conn.close()
            return out

        t0 = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            results = [x for part in pool.map(client, per_client) for x in part]
        wall = time.perf_counter() - t0
        done.set()
        lat = sorted(t for _, t in results)
        return {
            "statuses": dict(Counter(s for s, _ in results)),
            "alive": proc.poll() is None,
            "p50_ms": 1000 * statistics.median(lat),
            "p99_ms": 1000 * lat[int(0.99 * (len(lat) - 1))],
            "req_per_s": len(results) / wall,
            "rss_start_mb": start_rss / 1024,
            "rss_peak_mb": peak[0] / 1024,
        }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--path", default="/api/sweeps/s1/trials")
    ap.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    a = ap.parse_args()
    backends = ["sqlite", "postgresql"] if a.backend == "both" else [a.backend]
    for b in backends:
        if b == "sqlite":
            with tempfile.TemporaryDirectory() as d:
                r = run(f"sqlite:///{d}/load.db", a.requests, a.clients, a.trials, a.path)
        else:
            if not os.environ.get("ORCH_TEST_POSTGRES_URL"):
                print("postgresql: skipped (ORCH_TEST_POSTGRES_URL not set)")
                continue
            from conftest import make_pg_schema_url

            url, drop = make_pg_schema_url()
            try:
                r = run(url, a.requests, a.clients, a.trials, a.path)
            finally:
                drop()
        print(
            f"{b}: {a.requests} GETs {a.path} from {a.clients} clients ({a.trials} trials): statuses {r['statuses']}, "
            f"server alive {r['alive']}, p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, "
            f"{r['req_per_s']:.0f} req/s, server RSS {r['rss_start_mb']:.0f} MB at start, "
            f"{r['rss_peak_mb']:.0f} MB peak",
            flush=True,
        )


if __name__ == "__main__":
    main()
