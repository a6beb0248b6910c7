"""What a Ray worker pays to import before it works: the run's checkpoint Loader starts in a
fresh worker at every driver's start and only passes stored bytes on, so it must not pay
for torch (about 1.3 CPU-s) or the analysis stack."""

from __future__ import annotations

import subprocess
import sys


def test_the_loaders_worker_imports_neither_torch_nor_pandas():
    code = (
        "import sys\n"
        "from orchestrator.runner import checkpoints\n"
        "from orchestrator.store.sweep_store import SweepStore\n"
        "from orchestrator.store import attempts\n"
        "assert checkpoints.Loader and SweepStore and attempts.load_checkpoint\n"
        "print(sorted(m for m in ('torch', 'pandas', 'numpy', 'ray.tune') if m in sys.modules))\n"
        "checkpoints.serialize({'step': 3})\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    # torch comes in only once a state is serialized, where it is needed.
    assert out.stdout.split("\n")[:2] == ["[]", "True"], out.stdout + out.stderr
