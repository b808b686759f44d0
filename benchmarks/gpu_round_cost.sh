#!/usr/bin/env bash
# benchmarks/round_cost.py on one GPU (written for an H200) at bf16, every part, in under 10 minutes.
#
#   bash benchmarks/gpu_round_cost.sh [OUT_DIR]                # default OUT_DIR: $OUT, else benchmarks/results/round_cost
#   WHEELS=.whl bash benchmarks/gpu_round_cost.sh "$OUT"       # a bare GPU machine: install the wheels in .whl first
#   DEVICE=cpu bash benchmarks/gpu_round_cost.sh /tmp/rc       # the same script, tiny settings, on CPU (a smoke test)
#   DRY_RUN=1 bash benchmarks/gpu_round_cost.sh /tmp/rc        # print each stage's command line, run nothing
#
# Needs the project's environment (pip install -e ".[dev]"; PYTHON=... to pick an interpreter, default python3), or,
# on a machine without network whose Python has torch but not the rest, WHEELS=DIR: DIR/*.whl (open_clip_torch,
# jsonargparse with docstring-parser and typeshed-client, ftfy, wcwidth; see benchmarks/gpu_first_light.py) are
# installed with `pip install --no-index --no-deps --target $SITE` (SITE default /tmp/site), and every command gets
# PYTHONPATH=$SITE:<repository root>. The imports are checked before any stage (torch, CUDA when DEVICE=cuda,
# lightning, open_clip, jsonargparse with its signatures extra, ftfy, fedur.main); a missing one stops the script
# (exit 1). Nothing is downloaded (random-init models, generated images). Each stage is bounded by `timeout` and
# writes its results as it goes (<OUT_DIR>/cuda.json and cuda.md, merged), so a stage cut short still leaves the
# earlier ones; the exit status is non-zero when a stage, or a part or run in it, failed.
# Stages and their budget on an H200 (seconds): micro ~120, whole rounds ~350, in all below 600. DRY_RUN=1 installs,
# checks and measures nothing: it prints the stages' command lines (tests/test_benchmarks.py parses them with
# round_cost.py's own parser, so a flag the script passes and the benchmark no longer takes is caught).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-benchmarks/results/round_cost}}"
DEVICE="${DEVICE:-cuda}"
PY="${PYTHON:-$(command -v python3 || command -v python)}"
SITE="${SITE:-/tmp/site}"
DRY_RUN="${DRY_RUN:-}"
mkdir -p "$OUT_DIR"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
LOG="$OUT_DIR/$DEVICE-log.txt"
: > "$LOG"
status=0

if [ -n "$DRY_RUN" ]; then
  echo "dry run: no wheels installed, no imports checked, nothing measured" | tee -a "$LOG"
elif [ -n "${WHEELS:-}" ]; then
  shopt -s nullglob
  wheels=("$WHEELS"/*.whl)
  shopt -u nullglob
  if [ ${#wheels[@]} -eq 0 ]; then
    echo "no *.whl in WHEELS=$WHEELS" | tee -a "$LOG"
    exit 1
  fi
  echo "+ $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE ${wheels[*]}" \
    | tee -a "$LOG"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "${wheels[@]}" 2>&1 \
    | tee -a "$LOG"
  if [ "${PIPESTATUS[0]}" -ne 0 ]; then
    echo "installing the wheels from $WHEELS failed" | tee -a "$LOG"
    exit 1
  fi
  export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi

# Every import the stages need, checked before any of them runs.
[ -n "$DRY_RUN" ] || "$PY" - "$DEVICE" 2>&1 <<'PYTHON' | tee -a "$LOG"
import importlib
import sys

device, missing = sys.argv[1], []
for name in ("torch", "lightning", "open_clip", "jsonargparse", "docstring_parser", "typeshed_client", "ftfy", "fedur.main"):
    try:
        importlib.import_module(name)
    except Exception as err:  # absent, or its own imports fail
        missing.append(f"{name} ({type(err).__name__}: {err})")
if not any(m.startswith("torch ") for m in missing):
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        missing.append("CUDA (torch.cuda.is_available() is False)")
if missing:
    hint = "" if missing[-1].startswith("CUDA") and len(missing) == 1 else " (WHEELS=DIR installs wheels first)"
    print("missing or broken: " + "; ".join(missing) + hint)
    sys.exit(1)
print(f"imports ok: torch {torch.__version__} on {torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}")
PYTHON
[ "${PIPESTATUS[0]}" -eq 0 ] || exit 1

stage() {  # stage <seconds> <args...>
  local limit=$1; shift
  echo "+ $PY benchmarks/round_cost.py $*" | tee -a "$LOG"
  [ -z "$DRY_RUN" ] || return 0
  timeout --kill-after=10 "$limit" "$PY" benchmarks/round_cost.py "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    echo "stage failed or timed out (exit $rc): $*" | tee -a "$LOG"
    status=1
  fi
}

if [ "$DEVICE" = cuda ] && [ -z "$DRY_RUN" ]; then
  { nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv || true; } >> "$LOG" 2>&1
fi
if [ "$DEVICE" = cuda ]; then
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
# 2. Whole rounds of the big model (ViT-B/32 on 500 and 5000 train images), the 10 clients one after another and
#    all 10 per step (run.clients_per_step), each with the global model's evaluation on and off (round_cost.py runs
#    both). Shared-prefix text on only (fedur's default; off against on was measured before): the on/off pairs
#    double the runs, and this keeps their number, and the stage's time, as it was.
stage "${LIMITS[1]}" --device "$DEVICE" --out "$OUT_DIR" "${EXTRA[@]}" --merge --parts round --round-models "$BIG" \
  --round-images "$BIG_IMAGES" --round-rounds 2 --round-clients-per-step 1,10 --round-shared on
# 3. Whole rounds of the tiny model: the round's overhead with next to no compute.
stage "${LIMITS[2]}" --device "$DEVICE" --out "$OUT_DIR" "${EXTRA[@]}" --merge --parts round --round-models fedur-tiny \
  --round-images "$SMALL_IMAGES" --round-rounds 2 --round-clients-per-step 1,10 --round-shared on
echo "results: $OUT_DIR/$DEVICE*.md" | tee -a "$LOG"
exit $status
