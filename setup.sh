#!/usr/bin/env bash
# One setup command: creates .venv in the repo and installs the package with its test and docs
# extras (and the gpu extra where a CUDA driver is present).
# Safe to re-run: an existing .venv is reused and pip skips what is already satisfied.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
    "$PY" -m venv .venv
fi
VPY=.venv/bin/python
echo "setup: .venv ready; updating pip"
"$VPY" -m pip install -q --upgrade pip setuptools wheel
# torch first: the CPU build where no CUDA driver is present, so an unpinned torch never
# drags in a multi-GB CUDA build on a laptop. Override with TORCH_SPEC / TORCH_INDEX_URL.
if ! "$VPY" -c "import torch" 2>/dev/null; then
    TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
        echo "setup: CUDA driver found, installing $TORCH_SPEC (CUDA build)"
        "$VPY" -m pip install "$TORCH_SPEC"
    elif [[ -n "${TORCH_INDEX_URL:-}" ]]; then
        echo "setup: installing $TORCH_SPEC from $TORCH_INDEX_URL"
        "$VPY" -m pip install "$TORCH_SPEC" --index-url "$TORCH_INDEX_URL"
    else
        echo "setup: no CUDA driver, installing $TORCH_SPEC (CPU build where the index offers one)"
        "$VPY" -m pip install "$TORCH_SPEC"
    fi
fi
# The test and docs extras always (the test extras hold Triton for its CPU interpreter tests);
# `gpu` (Triton) where a CUDA driver is. A plain `pip install .` has neither.
EXTRAS=test,docs
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
    EXTRAS=$EXTRAS,gpu
fi
echo "setup: installing orchestrator with its $EXTRAS extras (ray, sqlalchemy, lifelines, ...: about a minute the first time)"
"$VPY" -m pip install -q -e ".[$EXTRAS]"
# The package's own modules compiled once: an editable install leaves them as source, and
# where PYTHONDONTWRITEBYTECODE is set (some machines set it for everything) each process (every
# Ray worker, every driver) would compile them again on import. A module edited later is
# compiled in memory, as Python does for any stale .pyc.
"$VPY" -m compileall -q -j 0 orchestrator cells tasks kernels >/dev/null
# The report test renders the HTML report in headless Chromium (Debian's package).
if ! command -v chromium >/dev/null 2>&1; then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "setup: installing chromium (for the report test)"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) \
            >/dev/null || echo "setup: warning: chromium install failed; the report test needs it"
    else
        echo "setup: note: install chromium (e.g. apt-get install chromium) to run the report test"
    fi
fi
# The dashboard's browser tests drive that Chromium through Selenium's chromedriver.
if ! command -v chromedriver >/dev/null 2>&1; then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "setup: installing chromium-driver (for the dashboard browser tests)"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium-driver) \
            >/dev/null || echo "setup: warning: chromium-driver install failed; the ui browser tests need it"
    else
        echo "setup: note: install chromium-driver (apt-get install chromium-driver) to run the ui browser tests"
    fi
fi
# The real-SLURM test (tests/test_slurm.py) starts a one-node SLURM of its own: Debian's
# slurm-wlm and munge. Without them (or without root) that test skips, saying why.
if ! command -v slurmctld >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "setup: installing slurm-wlm and munge (for the real-SLURM test)"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge) \
            >/dev/null || echo "setup: warning: slurm-wlm/munge install failed; the real-SLURM test will skip"
    else
        echo "setup: note: install slurm-wlm and munge (apt-get, as root) to run the real-SLURM test"
    fi
fi
echo "setup: done. Try: .venv/bin/orchestrator submit sweeps/quickstart.yaml"
echo "setup: (or 'source .venv/bin/activate' once per shell, and then plain 'orchestrator ...')"
