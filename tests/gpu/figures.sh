#!/usr/bin/env bash
# Issue figures on a lent GPU, run right after tests/gpu/check.sh (under 5 minutes):
#
#   1. tests/gpu/study_step.py: the basin map's mLSTM step (d 94, 4 heads, T 768, batch 16)
#      for the raw and ns5 reads, fp32 and bf16, peak memory, and the projected wall time
#      of sweeps/basin_map.yaml on this GPU
#   2. orchestrator.bench.cells on the GPU: the factorial arms and the mLSTM reads, naive
#      loop vs default path, side by side (the rows of `orchestrator bench cells --json`)
#   3. tests/gpu/placement_check.py: `resources: {gpu: auto}` on the card (the GPU memory
#      estimate against each trial's real footprint; a 4-trial auto sweep's stored fractions);
#      placement.json (not in a dry run: it needs CUDA and Ray)
#
# Outputs go to $OUT (default ./gpu_check_out): study_step.json, bench_cells.json,
# figures.txt, figures.log. Python as in check.sh (.venv when its torch sees CUDA, else
# python3); only torch, cells and pyyaml are imported. DRY_RUN=1 rehearses both on a CPU
# at tiny sizes. Exit status 0 when every step passed.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/gpu/common.sh
SUMMARY="$OUT/figures.txt"
LOG="$OUT/figures.log"
: >"$SUMMARY"
: >"$LOG"
FAILED=0

DEV=cuda
STUDY_ARGS=()
CELLS='dict(seq_len=256, d_model=32, batch=8, repeats=5)'
MLSTM='dict(seq_len=128, d_model=32, batch=16, repeats=3)'
NEED_CUDA='import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'
if [[ ${DRY_RUN:-0} == 1 ]]; then
    DEV=cpu
    STUDY_ARGS=(--d-model 16 --heads 2 --seq-len 32 --batch 2 --warmup 1 --timed 2 --eval-size 8)
    CELLS='dict(seq_len=16, d_model=8, batch=2, repeats=1)'
    MLSTM='dict(seq_len=16, d_model=8, batch=2, repeats=1)'
    NEED_CUDA='import torch'
    echo "DRY RUN on CPU: rehearses the steps, measures nothing worth quoting" | tee -a "$SUMMARY"
fi
if ! find_python "$NEED_CUDA"; then
    echo "no python with CUDA torch found; nothing to measure" | tee -a "$SUMMARY"
    exit 1
fi

step() {  # step NAME SECONDS CMD...: stderr to the log, one verdict line in the summary
    local name=$1 limit=$2 t0=$SECONDS
    shift 2
    echo "== $name (limit ${limit}s): $*" >>"$LOG"
    timeout --kill-after=10 "$limit" "$@" 2>>"$LOG"
    local rc=$?
    ((rc == 0)) || FAILED=1
    echo "$(printf '%-12s rc=%-4s %4ds' "$name" "$rc" $((SECONDS - t0)))" >>"$SUMMARY"
}

step study_step 150 "$PY" tests/gpu/study_step.py --device "$DEV" "${STUDY_ARGS[@]}" --out "$OUT/study_step.json" >/dev/null
step bench_cells 120 "$PY" - "$OUT/bench_cells.json" "$DEV" "$CELLS" "$MLSTM" <<'PYEOF'
import json, sys
from orchestrator.bench.cells import run_bench
out, dev, cells, mlstm = sys.argv[1], sys.argv[2], eval(sys.argv[3]), eval(sys.argv[4])
arms = ["gated_deltanet", "armed_gdn", "dg_rank", "mamba2_ref"]
reads = [f"mlstm:heads=2:read={r}" for r in ("raw", "ns5", "polar", "rls")]
result = {
    "factorial": {"rows": run_bench(arms, device=dev, **cells), **cells},
    "mlstm_slice": {"rows": run_bench(reads, device=dev, **mlstm), **mlstm},
}
json.dump(result, open(out, "w"), indent=2)
PYEOF
"$PY" - "$OUT" <<'PYEOF' 2>>"$LOG" | tee -a "$SUMMARY"
import json, sys
out = sys.argv[1]
try:
    s = json.load(open(f"{out}/study_step.json"))
    print("study step on", s["device"], s["size"])
    for r in s["rows"]:
        peak = "n/a" if r["peak_mib"] is None else f"{r['peak_mib']:,.0f} MiB"
        print(f"  {r['read']:<4} {r['precision']}  step {r['step_ms']:8.1f} ms  eval pass {r['eval_ms']:8.1f} ms  "
              f"peak {peak}  -> {r['basin_map_hours_one_at_a_time']:.2f} h for its 72 trials")
    print("  basin_map, one GPU, one trial at a time, unpacked (h):", {k: round(v, 2) for k, v in s["basin_map_hours_one_gpu_unpacked"].items()})
except Exception as exc:
    print("study_step.json unreadable:", exc)
try:
    b = json.load(open(f"{out}/bench_cells.json"))
    for part, d in b.items():
        print("bench cells", part, {k: v for k, v in d.items() if k != "rows"})
        for r in d["rows"]:
            print(f"  {r['arm']:<24} naive {r['naive_tok_s']:>12,.0f}  default {r['default_tok_s']:>12,.0f} tok/s  "
                  f"speedup {r['speedup_vs_naive']:6.1f}x  ceiling {r['ceiling_vs_naive']:6.1f}x")
except Exception as exc:
    print("bench_cells.json unreadable:", exc)
PYEOF
if [[ ${DRY_RUN:-0} != 1 ]]; then
    step placement 150 "$PY" tests/gpu/placement_check.py --out "$OUT/placement.json" >/dev/null
fi
echo "figures: $([[ $FAILED == 0 ]] && echo 'every step passed' || echo 'A STEP FAILED (see figures.log)')" | tee -a "$SUMMARY"
exit "$FAILED"
