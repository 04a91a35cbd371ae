#!/usr/bin/env bash
# Mixed precision against f32 on the same steps: ResNet-20 on Fashion-MNIST, 400 optimizer steps of
# 128 (most of an epoch), the whole 10,000-image test set, once per --amp mode. Prints a table of
# test accuracy and its difference from the f32 run in points (the target: within 0.5), the final
# loss scale, skipped steps and seconds, and writes JSON. This is the long statistical check; the
# e2e_amp test runs a short version of it in CI.
# Usage: bench/amp_accuracy.sh [--kiln PATH] [--steps N] [--json FILE]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
kiln="$root/build/kiln"
steps=400
json=""
while [ $# -gt 0 ]; do
  case "$1" in
    --kiln) kiln="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --json) json="$2"; shift 2 ;;
    *) echo "usage: bench/amp_accuracy.sh [--kiln PATH] [--steps N] [--json FILE]" >&2; exit 2 ;;
  esac
done
[ -x "$kiln" ] || { echo "bench/amp_accuracy.sh: no kiln binary at $kiln (build first, or --kiln PATH)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
isa=$(grep -q avx512f /proc/cpuinfo && echo "AVX-512" || (grep -q avx2 /proc/cpuinfo && echo "AVX2" || echo "portable"))
echo "ResNet-20 on Fashion-MNIST, $steps steps of 128, seed 3; $cpu ($isa), $(nproc) threads"
printf '%-6s %14s %16s %11s %8s %9s\n' amp "test acc (%)" "vs f32 (points)" "loss scale" skipped seconds
rows=()
f32=""
for mode in off fp16 bf16; do
  start=$(date +%s%N)
  "$kiln" train --model resnet20 --epochs 1 --max-steps "$steps" --batch 128 --log-every 50 --no-save-epochs \
    --progress lines --seed 3 --amp "$mode" --out "$work/$mode" > "$work/$mode.log" 2>&1 ||
    { cat "$work/$mode.log"; exit 1; }
  ms=$((($(date +%s%N) - start) / 1000000))
  secs="$((ms / 1000)).$(printf '%03d' $((ms % 1000)))"
  read -r acc scale skipped < <(python3 -c "import json,sys; s=json.load(open('$work/$mode/summary.json')); print(100*s['test_accuracy'], s['loss_scale'], s['skipped_steps'])")
  [ -n "$f32" ] || f32=$acc
  delta=$(python3 -c "print(f'{$acc - $f32:+.2f}')")
  printf '%-6s %14.2f %16s %11g %8d %9.1f\n' "$mode" "$acc" "$delta" "$scale" "$skipped" "$secs"
  rows+=("{\"amp\": \"$mode\", \"test_accuracy_pct\": $acc, \"vs_f32_points\": $delta, \"loss_scale\": $scale, \"skipped_steps\": $skipped, \"seconds\": $secs}")
done
if [ -n "$json" ]; then
  (IFS=,; printf '{"bench": "amp_accuracy", "cpu": "%s", "isa": "%s", "steps": %s, "rows": [%s]}\n' "$cpu" "$isa" "$steps" "${rows[*]}") > "$json"
  echo "wrote $json"
fi
