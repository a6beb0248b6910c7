"""`resources: {gpu: auto}` on a real GPU (run by tests/gpu/figures.sh when a session is lent one).

1. The estimate against the card: for a few trials (factorial arms, d_model 32 to 256), each
   trained for ``--steps`` steps in a fresh process, the process's GPU footprint (CUDA
   context plus the caching allocator's peak) beside ``spec.gpu_memory_bytes``: the estimate
   must not be below it (a trial that outgrows its share would crash its neighbours).
2. A real ``gpu: auto`` sweep of 4 short trials on an embedded Ray: every trial completed on
   ``cuda``, with the stored ``gpu_fraction`` the one runner/fleet.py derives from this card's
   memory and the estimate, and the accelerator Ray detected.

Prints one JSON object; exit status 1 when a check failed.

    python tests/gpu/placement_check.py [--steps 30] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SPEC = """name: gpu_auto
fixed: {task: mqar, task.K: 16, arm: armed_gdn, d_model: 32, n_layers: 2, batch_size: 64}
axes: {seed: 0..3}
budget: {steps: 40, eval_every: 20}
resources: {cpu: 1, gpu: auto}
"""
SETTINGS = [
    {"arm": "armed_gdn", "d_model": 32, "n_layers": 2, "batch_size": 64},
    {"arm": "gated_deltanet", "d_model": 64, "n_layers": 2, "batch_size": 64},
    {"arm": "mlstm", "d_model": 128, "n_layers": 2, "batch_size": 64},
    {"arm": "armed_gdn", "d_model": 256, "n_layers": 4, "batch_size": 128},
]

MEASURE = """
import json, sys, torch
from orchestrator.train import Trainer
params = json.loads(sys.argv[1])
trainer = Trainer(params, device="cuda")
for _ in trainer.run():
    pass
torch.cuda.synchronize()
free, total = torch.cuda.mem_get_info()
# The process's footprint: what the card has in use beyond the allocator's current blocks is
# the context (a lent GPU runs nothing else); plus the allocator's peak.
context = (total - free) - torch.cuda.memory_reserved()
print(json.dumps({"status": trainer.status.value, "context": context,
                  "peak_reserved": torch.cuda.max_memory_reserved(), "total": total}))
"""


def measure(steps: int) -> list[dict]:
    from orchestrator.spec import gpu_memory_bytes, load

    rows = []
    for s in SETTINGS:
        fixed = ", ".join(f"{k}: {v}" for k, v in s.items())
        text = f"name: m\nfixed: {{task: mqar, task.K: 16, {fixed}}}\nbudget: {{steps: {steps}, eval_every: {steps}}}\n"
        params = load(text=text).trials[0][1]
        r = subprocess.run(
            [sys.executable, "-c", MEASURE, json.dumps(params)], capture_output=True, text=True, cwd=ROOT, timeout=300
        )
        if r.returncode != 0:
            rows.append({**s, "error": r.stderr.strip().splitlines()[-1:]})
            continue
        got = json.loads(r.stdout.strip().splitlines()[-1])
        footprint = got["context"] + got["peak_reserved"]
        estimate = gpu_memory_bytes(params)
        rows.append(
            {
                **s,
                "footprint_mib": footprint / 2**20,
                "estimate_mib": estimate / 2**20,
                "estimate_over_footprint": estimate / footprint,
                "ok": estimate >= footprint and got["status"] == "completed",
            }
        )
    return rows


def sweep() -> dict:
    import sqlalchemy as sa

    from orchestrator import spec as specs
    from orchestrator.runner.fleet import fraction, per_gpu
    from orchestrator.runner.sweep import RunOptions, submit
    from orchestrator.spec import gpu_memory_bytes
    from orchestrator.train.device import gpu_card

    card = gpu_card()
    assert card is not None, "no CUDA device"
    sw = specs.load(text=SPEC)
    want = fraction(per_gpu(gpu_memory_bytes(sw.trials[0][1]), card.memory))
    with tempfile.TemporaryDirectory() as d:
        url = f"sqlite:///{Path(d) / 'g.db'}"
        summary = submit(sw, RunOptions(db=url, checkpoint_dir=str(Path(d) / "ck")))
        engine = sa.create_engine(url)
        with engine.connect() as c:
            rows = c.execute(sa.text("SELECT status, device, gpu_fraction, accelerator FROM trials")).all()
        engine.dispose()
    ok = (
        [r[0] for r in rows] == ["completed"] * 4
        and all(r[1].startswith("cuda:") for r in rows)
        and all(r[2] == want for r in rows)
    )
    return {
        "card": card.name,
        "card_gib": card.memory / 2**30,
        "fraction_expected": want,
        "rows": [list(r) for r in rows],
        "outcomes": summary.outcomes,
        "ok": ok,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out")
    a = ap.parse_args()
    result: dict = {"estimate_vs_card": measure(a.steps)}
    try:
        result["gpu_auto_sweep"] = sweep()
    except Exception as exc:  # reported, and the check fails
        result["gpu_auto_sweep"] = {"error": f"{type(exc).__name__}: {exc}", "ok": False}
    result["ok"] = all(r.get("ok") for r in result["estimate_vs_card"]) and result["gpu_auto_sweep"]["ok"]
    text = json.dumps(result, indent=2)
    if a.out:
        Path(a.out).write_text(text)
    print(text)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
