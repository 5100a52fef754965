#!/usr/bin/env bash
# Calibrate this machine's GPUs (and, once `dtsim validate` exists, validate the simulator against a real
# run). Needs nothing from the network. Writes the profile, its fit report/plot and a log to one folder:
#   $OUT if set, else results/gpu_check/.
# Usage: calibrate/gpu_check.sh [extra `dtsim calibrate` arguments, e.g. --quick or --gpus 2]
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
OUT_DIR="${OUT:-$ROOT/results/gpu_check}"
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gpu_check.log"
PROFILE="$OUT_DIR/profile-cuda.json"
cd "$ROOT"

PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY="$(command -v python3 || command -v python)"; fi
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

# `dtsim <cmd>` when the console script is installed and knows the command; the module otherwise.
dtsim_cmd() {
  local cmd="$1"
  if command -v dtsim >/dev/null 2>&1 && dtsim "$cmd" --help >/dev/null 2>&1; then
    echo "dtsim $cmd"
  elif [ "$cmd" = calibrate ]; then
    echo "$PY -m calibrate.cli"
  elif "$PY" -m sim "$cmd" --help >/dev/null 2>&1; then
    echo "$PY -m sim $cmd"
  fi
}

log() { echo "[gpu_check $(date -u +%H:%M:%S)] $*" | tee -a "$LOG"; }

: > "$LOG"
log "output folder: $OUT_DIR"
log "python: $PY"
{ nvidia-smi || echo "nvidia-smi not available"; } >> "$LOG" 2>&1
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())" \
  2>&1 | tee -a "$LOG"

status=0  # the first failing step decides the exit code
CAL="$(dtsim_cmd calibrate)"
log "calibrate: $CAL --device cuda --out $PROFILE --resume $*"
# --resume: rerunning after an interruption continues where the last run stopped.
$CAL --device cuda --out "$PROFILE" --resume "$@" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
log "calibrate exit code: $rc"
[ "$rc" -eq 0 ] || [ "$status" -ne 0 ] || status=$rc

if [ -f "$PROFILE" ]; then
  $CAL --report "$PROFILE" --out "$OUT_DIR/profile-cuda.png" 2>&1 | tee "$OUT_DIR/fit_report.txt" | tee -a "$LOG"
fi

if "$PY" -c "import pytest" >/dev/null 2>&1; then
  log "GPU tests: pytest -m gpu tests/test_calibrate*.py"
  "$PY" -m pytest -q -m gpu tests/test_calibrate*.py 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  log "GPU tests exit code: $rc"
  [ "$rc" -eq 0 ] || [ "$rc" -eq 5 ] || [ "$status" -ne 0 ] || status=$rc  # 5: none collected
fi

VAL="$(dtsim_cmd validate)"
if [ -n "$VAL" ]; then
  extra=()
  if $VAL --help 2>/dev/null | grep -q -- "--out"; then extra=(--out "$OUT_DIR/validate"); fi
  if $VAL --help 2>/dev/null | grep -q -- "--profile"; then extra+=(--profile "$PROFILE"); fi
  for a in "$@"; do [ "$a" = --quick ] && extra+=(--quick); done
  log "validate: $VAL --device cuda ${extra[*]}"
  $VAL --device cuda "${extra[@]}" 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  log "validate exit code: $rc"
  [ "$rc" -eq 0 ] || [ "$status" -ne 0 ] || status=$rc
else
  log "validate: not available in this dtsim yet, skipped"
fi

log "done, exit code $status; files:"
ls -l "$OUT_DIR" | tee -a "$LOG"
exit "$status"
