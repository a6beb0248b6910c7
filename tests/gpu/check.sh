#!/usr/bin/env bash
# GPU check, for a session that is lent a GPU: one prepared run, inside 8 minutes.
#
#   1. the Triton tests on real hardware (no TRITON_INTERPRET): tests/test_triton_kernels.py
#   2. orchestrator bench kernels --json   (naive vs chunk vs triton, side by side)
#   3. orchestrator bench pack --json      (tolerated when that command does not exist yet)
#   4. short fp32 and bf16 training runs through the kernels: tests/gpu/train_smoke.py
#
# Outputs go to $OUT (default ./gpu_check_out): summary.txt, env.txt, pytest.log,
# bench_kernels.json, bench_pack.json, train_smoke.json, steps.log (7 files).
# Python: the repo's .venv when its torch sees CUDA, else python3 (GPU images ship torch and
# triton; nothing is installed). RUN_SETUP=1 runs ./setup.sh first (needs the network).
# Exit status: 0 when every step passed (bench pack missing counts as passed), else 1.
# DRY_RUN=1 rehearses every step on a CPU with tiny settings (checks this script, not speed).
# Then run tests/gpu/figures.sh (the issues' GPU figures: the study step, bench cells).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/gpu/common.sh
START=$SECONDS
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
: >"$OUT/steps.log"
FAILED=0

note() { echo "$*" | tee -a "$SUMMARY"; }

if [[ "${RUN_SETUP:-0}" == 1 ]]; then
    ./setup.sh >>"$OUT/steps.log" 2>&1 || note "setup.sh failed (see steps.log); carrying on"
fi

DRY=${DRY_RUN:-0}
DEV=cuda
BENCH_ARGS=()
PACK_ARGS=()
TRAIN_ARGS=(--steps 50)
NEED_CUDA='import torch, triton, sys; sys.exit(0 if torch.cuda.is_available() else 1)'
if [[ $DRY == 1 ]]; then
    DEV=cpu
    BENCH_ARGS=(--quick)
    PACK_ARGS=(--seeds 2 --steps 5)
    TRAIN_ARGS=(--impl naive --steps 10 --seq-len 16 --batch 4)
    NEED_CUDA='import torch, triton'
    note "DRY RUN on CPU: rehearses the steps, measures nothing worth quoting"
fi

if ! find_python "$NEED_CUDA"; then
    note "no python with CUDA torch and triton found (.venv/bin/python, python3, python); nothing to check"
    exit 1
fi

{
    echo "python: $(command -v "$PY")"
    "$PY" -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "| triton", triton.__version__)'
    [[ $DRY == 1 ]] || "$PY" -c 'import torch; print("gpu", torch.cuda.get_device_name(), "capability", torch.cuda.get_device_capability())'
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 || true
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# run_step NAME SECONDS STDOUT_FILE CMD...: stdout to STDOUT_FILE, stderr to steps.log; one
# verdict line in the summary. The redirections live here so the verdict never lands in a
# step's output file.
run_step() {
    local name=$1 limit=$2 dest=$3
    shift 3
    local t0=$SECONDS
    echo "== $name (limit ${limit}s): $*" >>"$OUT/steps.log"
    timeout --kill-after=10 "$limit" "$@" >"$dest" 2>>"$OUT/steps.log"
    local rc=$?
    local verdict=ok
    if ((rc == 124 || rc == 137)); then verdict="TIMED OUT"; elif ((rc != 0)); then verdict="FAILED rc=$rc"; fi
    [[ $verdict == ok ]] || FAILED=1
    note "$(printf '%-14s %-12s %4ds' "$name" "$verdict" $((SECONDS - t0)))"
    return 0
}

# summarize JSON_FILE: runs the Python read from stdin with d, JSON_FILE's contents (one line
# instead when the file does not parse); what it prints goes to the summary, its errors to
# steps.log.
summarize() {
    local body
    body=$(cat)
    "$PY" - "$1" <<EOF 2>>"$OUT/steps.log" | tee -a "$SUMMARY"
import json, os, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as exc:
    print(f"{os.path.basename(sys.argv[1])} unreadable: {exc}"); sys.exit(0)
$body
EOF
}

# Budget: 120 + 100 + 100 + 100 s of step limits, under 8 minutes with start-up.
# 1. Triton tests on the GPU: same cases as CI plus GPU-sized ones, and the sm_61 build check.
run_step pytest 120 "$OUT/pytest.log" "$PY" -m pytest -q -p no:cacheprovider -o addopts="" -k triton \
    -rfE tests/test_triton_kernels.py
tail -n 5 "$OUT/pytest.log" | tee -a "$SUMMARY"

# The CLI imports every command module; on a bare image one may miss a dependency, so fall
# back to the benchmark module itself rather than lose the figures.
CLI=("$PY" -m orchestrator.cli)
if ! "${CLI[@]}" bench --help >>"$OUT/steps.log" 2>&1; then
    note "orchestrator CLI does not import here (see steps.log); using module entry points"
    CLI=()
fi

# 2. bench kernels
if ((${#CLI[@]})); then
    run_step bench_kernels 100 "$OUT/bench_kernels.json" \
        "${CLI[@]}" bench kernels --json --device "$DEV" "${BENCH_ARGS[@]}"
else
    run_step bench_kernels 100 "$OUT/bench_kernels.json" \
        "$PY" -m orchestrator.bench.kernels --device "$DEV" "${BENCH_ARGS[@]}"
fi
summarize "$OUT/bench_kernels.json" <<'EOF'
print("bench kernels on", d["device"])
for r in d["rows"]:
    tok = "n/a" if r["tok_s"] is None else f"{r['tok_s']:,.0f}"
    print(f"  {r['op']:<11} {r['config']:<24} {r['impl']:<7} {tok:>14} tok/s")
for k, v in d["speedup"].items():
    print("  speedup", k, {a: (None if b is None else round(b, 1)) for a, b in v.items()})
EOF

# 3. bench pack (another part of issue 6; may not exist yet)
BENCH_HELP=""
((${#CLI[@]})) && BENCH_HELP=$("${CLI[@]}" bench --help 2>/dev/null)
if grep -qw pack <<<"$BENCH_HELP"; then
    run_step bench_pack 100 "$OUT/bench_pack.json" "${CLI[@]}" bench pack --json "${PACK_ARGS[@]}"
    tail -c 600 "$OUT/bench_pack.json" | tee -a "$SUMMARY"
    echo | tee -a "$SUMMARY"
else
    note "bench_pack     skipped: 'orchestrator bench pack' is not available in this checkout"
    echo '{"skipped": "orchestrator bench pack not available"}' >"$OUT/bench_pack.json"
fi

# 4. short training runs, fp32 and bf16, triton vs chunk traces
run_step train_smoke 100 /dev/null \
    "$PY" tests/gpu/train_smoke.py --device "$DEV" --impl triton "${TRAIN_ARGS[@]}" --out "$OUT/train_smoke.json"
summarize "$OUT/train_smoke.json" <<'EOF'
print("train smoke ok:", d["ok"])
for arm, c in d["checks"].items():
    print(" ", arm, c)
for r in d["runs"]:
    print(f"  {r['arm']:<14} {r['impl']:<7} {r['precision']:<5} loss {r['first_loss']:.3f} -> "
          f"{r['last_loss']:.3f}  {r['ms_per_step']:.1f} ms/step  ({r['model'][:40]})")
EOF

note "total $((SECONDS - START))s; $([[ $FAILED == 0 ]] && echo 'all steps passed' || echo 'SOME STEPS FAILED')"
exit "$FAILED"
