#!/usr/bin/env bash
# benchmarks/round_cost.py on one GPU (written for an H200) at bf16, every part, in under 10 minutes.
#
#   bash benchmarks/gpu_round_cost.sh [OUT_DIR]                # default OUT_DIR: $OUT, else benchmarks/results/round_cost
#   DEVICE=cpu bash benchmarks/gpu_round_cost.sh /tmp/rc       # the same script, tiny settings, on CPU (a smoke test)
#
# Needs the project's environment (pip install -e ".[dev]"; PYTHON=... to pick an interpreter); nothing is
# downloaded (random-init models, generated images). Each stage is bounded by `timeout` and writes its results
# as it goes (<OUT_DIR>/cuda.json and cuda.md, merged), so a stage cut short still leaves the earlier ones.
# Stages and their budget on an H200 (seconds): micro ~120, whole rounds ~350, in all below 600.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-benchmarks/results/round_cost}}"
DEVICE="${DEVICE:-cuda}"
PY="${PYTHON:-python}"
mkdir -p "$OUT_DIR"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
LOG="$OUT_DIR/$DEVICE-log.txt"
: > "$LOG"
status=0

stage() {  # stage <seconds> <args...>
  local limit=$1; shift
  echo "+ $PY benchmarks/round_cost.py $*" | tee -a "$LOG"
  timeout --kill-after=10 "$limit" "$PY" benchmarks/round_cost.py "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    echo "stage failed or timed out (exit $rc): $*" | tee -a "$LOG"
    status=1
  fi
}

if [ "$DEVICE" = cuda ]; then
  { nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv || true; } >> "$LOG" 2>&1
  "$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())" \
    | tee -a "$LOG" || exit 1
  MODELS=ViT-B-32,fedur-tiny,fedur-demo; CLASSES=10,100,200; BIG=ViT-B-32; BIG_IMAGES=500,5000; SMALL_IMAGES=500
  LIMITS=(180 300 90); EXTRA=(--precision bf16 --min-seconds 1)
else
  # The same stages on CPU with tiny settings (fedur-tiny, 10 classes, small runs, still bf16 autocast): a smoke
  # test of this script and of the benchmark's code paths, not a measurement.
  MODELS=fedur-tiny; CLASSES=10; BIG=fedur-tiny; BIG_IMAGES=100; SMALL_IMAGES=100
  LIMITS=(300 300 300); EXTRA=(--precision bf16 --quick --round-rounds 1)
fi
# 1. Micro: text tower, training step (batch 64), eval forward (batch 256), bytes; the models x class counts.
stage "${LIMITS[0]}" --device "$DEVICE" --out "$OUT_DIR" "${EXTRA[@]}" --models "$MODELS" --classes "$CLASSES" \
  --parts text,train,eval,bytes
# 2. Whole rounds of the big model (ViT-B/32 on 500 and 5000 train images), shared-prefix text off and on, the
#    10 clients one after another and all 10 per step (run.clients_per_step).
stage "${LIMITS[1]}" --device "$DEVICE" --out "$OUT_DIR" "${EXTRA[@]}" --merge --parts round --round-models "$BIG" \
  --round-images "$BIG_IMAGES" --round-rounds 2 --round-clients-per-step 1,10
# 3. Whole rounds of the tiny model: the round's overhead with next to no compute.
stage "${LIMITS[2]}" --device "$DEVICE" --out "$OUT_DIR" "${EXTRA[@]}" --merge --parts round --round-models fedur-tiny \
  --round-images "$SMALL_IMAGES" --round-rounds 2 --round-clients-per-step 1,10
echo "results: $OUT_DIR/$DEVICE*.md" | tee -a "$LOG"
exit $status
