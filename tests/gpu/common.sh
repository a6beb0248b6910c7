# Sourced by check.sh and figures.sh from the repo root: the output folder ($OUT, default
# ./gpu_check_out), the environment every step runs in, and find_python CHECK, which sets PY
# to the first of the repo's .venv python, python3 and python that runs the Python snippet
# CHECK (e.g. "torch sees CUDA"); PY stays empty when none does.
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET

find_python() {
    PY=""
    local cand
    for cand in .venv/bin/python python3 python; do
        if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "$1" 2>/dev/null; then
            PY=$cand
            return 0
        fi
    done
    return 1
}
