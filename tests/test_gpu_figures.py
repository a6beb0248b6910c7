"""tests/gpu/figures.sh rehearsed on the CPU (DRY_RUN=1): the script a GPU session runs must
work before a GPU is ever lent, and its projection must be the arithmetic it claims."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_figures_dry_run_writes_both_results(tmp_path):
    env = {
        **os.environ,
        "DRY_RUN": "1",
        "OUT": str(tmp_path),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    proc = subprocess.run(["bash", str(ROOT / "tests/gpu/figures.sh")], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + (tmp_path / "figures.log").read_text()
    study = json.loads((tmp_path / "study_step.json").read_text())
    assert [(r["read"], r["precision"]) for r in study["rows"]] == [("raw", "fp32"), ("ns5", "fp32")]
    for r in study["rows"]:
        assert r["step_ms"] > 0 and r["eval_ms"] > 0 and r["peak_mib"] is None  # no CUDA memory on a CPU
        # 3,000 steps and 16 evals (step 1, then 200, 400, ..., 3,000) per trial, 72 trials per read.
        hours = 72 * (3000 * r["step_ms"] + 16 * r["eval_ms"]) / 1e3 / 3600
        assert r["basin_map_hours_one_at_a_time"] == pytest.approx(hours)
    assert study["basin_map_hours_one_gpu_unpacked"]["fp32"] == pytest.approx(
        sum(r["basin_map_hours_one_at_a_time"] for r in study["rows"])
    )
    cells = json.loads((tmp_path / "bench_cells.json").read_text())
    assert [r["arm"] for r in cells["factorial"]["rows"]] == ["gated_deltanet", "armed_gdn", "dg_rank", "mamba2_ref"]
    assert len(cells["mlstm_slice"]["rows"]) == 4
    assert "every step passed" in (tmp_path / "figures.txt").read_text()
