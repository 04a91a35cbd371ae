#!/usr/bin/env bash
# Mixed precision against f32 on the same steps: ResNet-20 on Fashion-MNIST, 400 optimizer steps of
# 128 (most of an epoch), the whole 10,000-image test set, once per --amp mode. Prints a table of
# test accuracy and its difference from the f32 run in points (the target: within 0.5), the final
# loss scale, skipped steps and seconds, and writes JSON. The CPU kernel set and threads named are
# those each run reported (its summary.json: KILN_CPU_ISA or the CPU's best), not /proc/cpuinfo's.
# This is the long statistical check; the e2e_amp test runs a short version of it in CI.
# Usage: bench/amp_accuracy.sh [--kiln PATH] [--steps N] [--json FILE] [--python PATH]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
kiln="$root/build/kiln"
steps=400
json=""
python=python3
usage="usage: bench/amp_accuracy.sh [--kiln PATH] [--steps N] [--json FILE] [--python PATH]"
while [ $# -gt 0 ]; do
  case "$1" in
    --kiln | --steps | --json | --python)
      [ $# -ge 2 ] || { echo "bench/amp_accuracy.sh: $1 needs a value; $usage" >&2; exit 2; }
      case "$1" in
        --kiln) kiln="$2" ;;
        --steps) steps="$2" ;;
        --json) json="$2" ;;
        --python) python="$2" ;;
      esac
      shift 2 ;;
    *) echo "bench/amp_accuracy.sh: unknown argument '$1'; $usage" >&2; exit 2 ;;
  esac
done
[ -x "$kiln" ] || { echo "bench/amp_accuracy.sh: no kiln binary at $kiln (build first, or --kiln PATH)" >&2; exit 2; }
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || { echo "bench/amp_accuracy.sh: --steps $steps: want a positive whole number" >&2; exit 2; }
"$python" -c "import json" 2>/dev/null || { echo "bench/amp_accuracy.sh: --python $python cannot run (it reads the runs' summary.json)" >&2; exit 2; }
# --json checked before hours of training, as the bench_* programs do: an existing directory we can write.
if [ -n "$json" ]; then
  [ ! -d "$json" ] || { echo "bench/amp_accuracy.sh: --json $json is a directory: name the JSON file to write" >&2; exit 2; }
  jdir=$(dirname "$json")
  [ -d "$jdir" ] || { echo "bench/amp_accuracy.sh: --json $json: the directory $jdir does not exist" >&2; exit 2; }
  [ -w "$jdir" ] || { echo "bench/amp_accuracy.sh: --json $json: the directory $jdir is not writable" >&2; exit 2; }
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)
[ -n "$cpu" ] || cpu="unknown CPU"
rows="$work/rows.tsv"
: > "$rows"
header=0
for mode in off fp16 bf16; do
  start=$(date +%s%N)
  "$kiln" train --model resnet20 --epochs 1 --max-steps "$steps" --batch 128 --log-every 50 --no-save-epochs \
    --progress lines --seed 3 --amp "$mode" --out "$work/$mode" > "$work/$mode.log" 2>&1 ||
    { cat "$work/$mode.log"; exit 1; }
  ms=$((($(date +%s%N) - start) / 1000000))
  # One tab-separated row from the run's own summary: mode, accuracy %, loss scale, skipped, seconds,
  # kernel set, threads.
  "$python" - "$work/$mode/summary.json" "$mode" "$ms" >> "$rows" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
threads = s.get("config", {}).get("threads", "")
print("\t".join(str(v) for v in (sys.argv[2], 100 * s["test_accuracy"], s["loss_scale"], s["skipped_steps"],
                                 int(sys.argv[3]) / 1000, s.get("cpu_isa", "unknown"), threads)))
PY
  if [ "$header" = 0 ]; then
    IFS=$'\t' read -r _ _ _ _ _ isa threads < "$rows"
    echo "ResNet-20 on Fashion-MNIST, $steps steps of 128, seed 3; $cpu, CPU kernels $isa, $threads threads"
    printf '%-6s %14s %16s %11s %8s %9s\n' amp "test acc (%)" "vs f32 (points)" "loss scale" skipped seconds
    header=1
  fi
  IFS=$'\t' read -r m acc scale skipped secs _ _ < <(tail -n 1 "$rows")
  IFS=$'\t' read -r _ f32 _ < "$rows"
  delta=$("$python" -c "import sys; print(f'{float(sys.argv[1]) - float(sys.argv[2]):+.2f}')" "$acc" "$f32")
  printf '%-6s %14.2f %16s %11g %8d %9.1f\n' "$m" "$acc" "$delta" "$scale" "$skipped" "$secs"
done
if [ -n "$json" ]; then
  # Written by json.dumps: numbers as numbers (a difference of +0.00 is 0.0), strings quoted.
  "$python" - "$rows" "$cpu" "$steps" "$json" <<'PY' || { echo "bench/amp_accuracy.sh: cannot write $json" >&2; exit 1; }
import json, sys
rows_path, cpu, steps, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rows = [line.rstrip("\n").split("\t") for line in open(rows_path) if line.strip()]
f32 = float(rows[0][1])
doc = {"benchmark": "amp_accuracy", "cpu": cpu, "cpu_kernels": rows[0][5],
       "threads": int(rows[0][6]) if rows[0][6] else None, "steps": steps,
       "rows": [{"amp": r[0], "test_accuracy_pct": float(r[1]), "vs_f32_points": round(float(r[1]) - f32, 4),
                 "loss_scale": float(r[2]), "skipped_steps": int(r[3]), "seconds": float(r[4]),
                 "cpu_kernels": r[5]} for r in rows]}
with open(out, "w") as f:
    f.write(json.dumps(doc, indent=2) + "\n")
PY
  echo "wrote $json"
fi
