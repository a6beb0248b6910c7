"""A simulated mixed fleet on this CPU machine: a Ray head and two GPU nodes of different types
(``ray start --num-gpus 1 --resources '{"accelerator_type:X": 1}'``), each raylet's workers
seeing a fake card through the device layer's test switch ``$ORCH_FAKE_GPU`` while they train
on the CPU. A ``resources: {gpu: auto}`` sweep of fixed-duration trials (the bench's
``bench_sleep`` cell) is sized by each trial's estimated GPU memory: the fake cards are
scaled down (1 GiB and 2 GiB) so that one trial fits the "GTX 1070" and three share the
"A100", and the database must show exactly that: each trial's node, accelerator and GPU
fraction, and at most (and at some moment exactly) that many trials at once on each card.
A spec asking for an accelerator the fleet lacks is refused before anything is written.
The driver (this test's subprocess) has no fake card: only the raylets' workers do."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections import defaultdict
from pathlib import Path

import pytest
import sqlalchemy as sa

from conftest import POSTGRES_URL, make_pg_schema_url
from test_cluster import ORCH, _node, _stop, _wait_for_nodes, free_port

# PostgreSQL: its clock has the sub-second resolution the overlap count needs.
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not POSTGRES_URL, reason="needs ORCH_TEST_POSTGRES_URL")]

ROOT = Path(__file__).resolve().parents[1]
SPEC = """name: fleet
plugins: [orchestrator.bench.fixed_duration]
fixed: {arm: bench_sleep, model.step_ms: 250, task: mqar, task.K: 2, task.eval_size: 16,
        d_model: 8, batch_size: 2}
axes: {seed: 0..7}
budget: {steps: 10, eval_every: 5}
resources: {cpu: 1, gpu: auto%s}
"""
# Scaled-down fake cards: one trial's estimate (~0.5 GiB, mostly the CUDA context) fits a
# 1 GiB card once and a 2 GiB card three times (90% usable).
NODES = {"G1070": ("GTX 1070", 1, 1), "A100": ("A100", 2, 3)}  # card, GiB, trials per card


def _max_overlap(spans: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    best = cur = 0
    for _, step in events:
        cur += step
        best = max(best, cur)
    return best


def test_gpu_auto_places_by_memory_on_a_simulated_mixed_fleet():
    from orchestrator.runner.fleet import fraction
    from orchestrator.spec import gpu_memory_bytes, load

    tmp = Path(tempfile.mkdtemp(prefix="orf", dir="/tmp"))  # short: Ray's socket paths
    token = tmp / "token"  # the cluster's auth token, as the README's recipe has it
    token.write_text(uuid.uuid4().hex)
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env.pop("RAY_ADDRESS", None)
    env.pop("ORCH_FAKE_GPU", None)
    port = free_port()
    address = f"127.0.0.1:{port}"
    url, drop = make_pg_schema_url(reader=False)
    nodes = []
    try:
        head = ["--head", f"--port={port}", "--node-ip-address=127.0.0.1", "--include-dashboard=false"]
        head.append(f"--temp-dir={tmp / 'ray'}")
        for acc, (card, gib, per_gpu) in NODES.items():  # the head is the first GPU node
            args = head if not nodes else [f"--address={address}"]
            args = [*args, f"--num-cpus={per_gpu}", "--num-gpus=1", "--object-store-memory=100000000"]
            args.append(f'--resources={{"accelerator_type:{acc}": 1}}')
            nodes.append(_node(args, {**env, "ORCH_FAKE_GPU": f"{card}:{gib}GiB"}, tmp / f"{acc}.log"))
            # One at a time: two raylets starting at once on one machine can both stall.
            _wait_for_nodes(address, env, len(nodes))

        def submit(extra: str) -> subprocess.CompletedProcess:
            spec = tmp / "fleet.yaml"
            spec.write_text(SPEC % extra)
            argv = ORCH + ["submit", str(spec), "--address", address, "--db", url, "--quiet"]
            return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)

        # An accelerator the fleet lacks: one line, nothing written.
        r = submit(", accelerator: H100")
        assert r.returncode == 2, r.stderr[-2000:]
        assert r.stderr.strip().splitlines() == [
            "error: resources.accelerator: no GPU node of the cluster is H100 (its types: A100, G1070)"
        ]
        engine = sa.create_engine(url)
        with engine.connect() as c:
            assert not sa.inspect(c).has_table("trials")

        r = submit("")
        assert r.returncode == 0, r.stderr[-3000:]
        with engine.connect() as c:
            rows = c.execute(
                sa.text(
                    "SELECT status, node_id, device, accelerator, gpu_fraction, "
                    "EXTRACT(EPOCH FROM started_at), EXTRACT(EPOCH FROM finished_at) FROM trials"
                )
            ).all()
        engine.dispose()
    finally:
        for p in reversed(nodes):
            _stop(p)
        drop()
        shutil.rmtree(tmp, ignore_errors=True)

    assert [r[0] for r in rows] == ["completed"] * 8
    estimate = gpu_memory_bytes(load(text=SPEC % "").trials[0][1])
    spans: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    node_of: dict[str, set[str]] = defaultdict(set)
    for _, node_id, device, acc, frac, start, end in rows:
        card, gib, per_gpu = NODES[acc]
        # The fraction is what the card's memory over the estimate gives (runner/fleet.py).
        assert int(0.9 * gib * 2**30 // estimate) == per_gpu
        assert frac == pytest.approx(fraction(per_gpu))
        # The fake card the trial's worker saw is its node type's, on the GPU Ray gave it.
        assert device == f"fake-gpu:0 {card} (cpu, fp32)"
        node_of[acc].add(node_id)
        spans[acc].append((float(start), float(end)))
    assert {a: len(n) for a, n in node_of.items()} == {"G1070": 1, "A100": 1}
    assert node_of["G1070"] != node_of["A100"]
    # The types share the trials by how many each runs at once (1 : 3 of 8 trials), and
    # each card runs at most, and at some moment exactly, its number at once.
    assert {a: len(s) for a, s in spans.items()} == {"G1070": 2, "A100": 6}
    for acc, (_, _, per_gpu) in NODES.items():
        assert _max_overlap(spans[acc]) == per_gpu, (acc, spans[acc])
