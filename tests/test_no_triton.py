"""Without triton (no wheels off Linux): every arm builds and trains a step, impl="auto" never
routes to Triton, impl="triton" is refused in one line, and the CLI validates a spec. Run in a
subprocess whose import system refuses ``triton``, as on a Mac laptop."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import importlib.abc, json, sys
class NoTriton(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, NoTriton())

import torch
import cells
from kernels.dispatch import available_impls, resolve_impl

out = {"triton_importable": True}
try:
    import triton  # noqa: F401
except ModuleNotFoundError:
    out["triton_importable"] = False
out["impls"] = list(available_impls("delta_rule"))
out["auto_cuda"] = resolve_impl("delta_rule", "auto", torch.device("cuda"))
try:
    resolve_impl("delta_rule", "triton", torch.device("cpu"))
    out["triton_refused"] = None
except ValueError as exc:
    out["triton_refused"] = str(exc)
stepped = {}
for arm in cells.ARMS:
    torch.manual_seed(0)
    model = cells.build(arm, vocab_size=11, d_model=16 if arm != "mlstm" else 64)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 11, (2, 12))
    loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 11), x.reshape(-1))
    loss.backward()
    opt.step()
    stepped[arm] = bool(torch.isfinite(loss).item())
out["stepped"] = stepped
out["triton_loaded"] = any(m == "triton" or m.startswith("triton.") for m in sys.modules)

from orchestrator.cli import main
out["dry_run"] = main(["submit", sys.argv[1], "--dry-run", "--json"])
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
def test_everything_works_without_triton():
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(ROOT / "sweeps" / "quickstart.yaml")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    assert res["triton_importable"] is False and res["triton_loaded"] is False
    assert res["impls"] == ["naive", "chunk", "auto"]
    assert res["auto_cuda"] == "chunk"
    assert res["triton_refused"].startswith('impl="triton" is unavailable for delta_rule')
    assert len(res["stepped"]) >= 10 and all(res["stepped"].values()), res["stepped"]
    assert res["dry_run"] == 0


def test_triton_is_an_extra_and_only_where_it_installs():
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # A plain install has no Triton (nothing can run it without a CUDA device) ...
    assert not [d for d in project["dependencies"] if Requirement(d).name == "triton"]
    # ... the gpu extra has it, and the test extras (its interpreter tests), Linux only.
    for extra in ("gpu", "test"):
        (triton,) = [Requirement(d) for d in project["optional-dependencies"][extra] if Requirement(d).name == "triton"]
        assert triton.marker is not None
        assert triton.marker.evaluate({"sys_platform": "linux"})
        for other in ("darwin", "win32"):
            assert not triton.marker.evaluate({"sys_platform": other})
