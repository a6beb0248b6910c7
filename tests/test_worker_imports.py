"""What a process pays to import before it works: the run's checkpoint Loader starts in a
fresh worker at every driver's start and only passes stored bytes on, so it must not pay
for torch (about 1.3 CPU-s) or the analysis stack; and no driver pays for scipy unless its
sweep has a sequential design."""

from __future__ import annotations

import subprocess
import sys


def _printed(*lines: str) -> list[str]:
    """The first two lines a fresh interpreter prints running ``lines``."""
    code = "import sys\n" + "".join(f"{line}\n" for line in lines)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.split("\n")[:2]


def test_the_loaders_worker_imports_neither_torch_nor_pandas():
    printed = _printed(
        "from orchestrator.runner import checkpoints",
        "from orchestrator.store.sweep_store import SweepStore",
        "from orchestrator.store import attempts",
        "assert checkpoints.Loader and SweepStore and attempts.load_checkpoint",
        "print(sorted(m for m in ('torch', 'pandas', 'numpy', 'ray.tune') if m in sys.modules))",
        "checkpoints.serialize({'step': 3})",
        "print('torch' in sys.modules)",
    )
    # torch comes in only once a state is serialized, where it is needed.
    assert printed == ["[]", "True"]


def test_a_driver_imports_scipy_only_for_a_sequential_design():
    """scipy (about a CPU-second to import) serves the group-sequential boundaries alone: a
    driver of any other sweep, and each trial worker, go without it."""
    design = "{'compare': {'by': 'arm', 'groups': ['a', 'b']}, 'test': 'fisher', 'looks': [4, 8]}"
    printed = _printed(
        "import orchestrator.cli, orchestrator.runner.sweep, orchestrator.runner.tune_runner",
        "import orchestrator.runner.trainable, orchestrator.runner.sequential",
        "print('scipy' in sys.modules)",
        "from orchestrator.design.sequential import SequentialSpec, design_boundaries",
        f"print(len(design_boundaries(SequentialSpec.model_validate({design})).z), 'scipy' in sys.modules)",
    )
    assert printed == ["False", "2 True"]
