#!/usr/bin/env bash
# bench/amp_accuracy.sh against a stand-in kiln (no training): its JSON must parse (a difference of
# +0.00 once made it invalid), carry each run's numbers, and name the kernel set the runs reported
# (their summary.json), not /proc/cpuinfo's; a --json in a missing directory is refused first.
# Usage: tests/bench/amp_accuracy_check.sh SOURCE_DIR
set -euo pipefail
src="$1"
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
# The stand-in: writes OUT/summary.json as `kiln train` would; f32 and fp16 agree exactly.
cat > "$d/kiln" <<'STUB'
#!/usr/bin/env bash
out="" amp=""
while [ $# -gt 0 ]; do
  case "$1" in --out) out="$2"; shift ;; --amp) amp="$2"; shift ;; esac
  shift
done
acc=0.9012; [ "$amp" = bf16 ] && acc=0.8977
mkdir -p "$out"
printf '{"test_accuracy": %s, "loss_scale": 65536.0, "skipped_steps": 0, "cpu_isa": "stub-isa", "config": {"threads": 3}}\n' "$acc" > "$out/summary.json"
STUB
chmod +x "$d/kiln"
if bash "$src/bench/amp_accuracy.sh" --kiln "$d/kiln" --steps 2 --json "$d/missing/a.json" 2> "$d/err"; then
  echo "FAIL: a --json in a missing directory was accepted"; exit 1
fi
grep -q "the directory $d/missing does not exist" "$d/err" || { echo "FAIL: unclear refusal:"; cat "$d/err"; exit 1; }
bash "$src/bench/amp_accuracy.sh" --kiln "$d/kiln" --steps 2 --json "$d/a.json" | tee "$d/out"
grep -q "CPU kernels stub-isa, 3 threads" "$d/out" || { echo "FAIL: the table does not name the runs' kernel set"; exit 1; }
python3 - "$d/a.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc["benchmark"] == "amp_accuracy", doc
assert doc["cpu_kernels"] == "stub-isa" and doc["threads"] == 3, doc
rows = {r["amp"]: r for r in doc["rows"]}
assert list(rows) == ["off", "fp16", "bf16"], rows
assert rows["fp16"]["vs_f32_points"] == 0.0, rows["fp16"]
assert abs(rows["bf16"]["vs_f32_points"] - (-0.35)) < 1e-9, rows["bf16"]
assert abs(rows["off"]["test_accuracy_pct"] - 90.12) < 1e-9, rows["off"]
print("amp_accuracy JSON ok")
PY
