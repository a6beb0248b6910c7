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


def test_a_driver_imports_scipy_only_for_a_sequential_design():
    """scipy (about a CPU-second to import) serves the group-sequential boundaries alone: a
    driver of any other sweep, and each trial worker, go without it."""
    code = (
        "import sys\n"
        "import orchestrator.cli, orchestrator.runner.sweep, orchestrator.runner.tune_runner\n"
        "import orchestrator.runner.trainable, orchestrator.runner.sequential\n"
        "print('scipy' in sys.modules)\n"
        "from orchestrator.design.sequential import SequentialSpec, design_boundaries\n"
        "spec = SequentialSpec.model_validate({'compare': {'by': 'arm', 'groups': ['a', 'b']}, 'test': 'fisher', 'looks': [4, 8]})\n"
        "print(len(design_boundaries(spec).z), 'scipy' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split("\n")[:2] == ["False", "2 True"], out.stdout + out.stderr
