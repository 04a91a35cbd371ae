#!/usr/bin/env bash
# bench_gemm under each CPU kernel set this machine supports, OpenBLAS limited to the same instruction set
# in the same run (OPENBLAS_CORETYPE: SkylakeX for avx512, Haswell for avx2, Nehalem for generic; Debian's
# OpenBLAS picks its kernels at run time, so the variable applies). Prints each set's table, then a
# summary of Kiln / OpenBLAS per set (f32 rows: lowest, median, highest ratio, and 1024^3), and with
# --json FILE writes {"sets": {set: bench_gemm's JSON}}.
# Usage: bench/gemm_sets.sh [--build DIR] [--quick] [--json FILE]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build"
json=""
quick=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --quick) quick=(--quick); shift ;;
    --json) json="$2"; shift 2 ;;
    *) echo "usage: bench/gemm_sets.sh [--build DIR] [--quick] [--json FILE]" >&2; exit 2 ;;
  esac
done
# --json checked before the runs, as amp_accuracy.sh and the bench_* programs do: an existing directory
# we can write (the write came after every set's run, and failed there with a traceback).
if [ -n "$json" ]; then
  [ ! -d "$json" ] || { echo "bench/gemm_sets.sh: --json $json is a directory: name the JSON file to write" >&2; exit 2; }
  jdir=$(dirname "$json")
  [ -d "$jdir" ] || { echo "bench/gemm_sets.sh: --json $json: the directory $jdir does not exist" >&2; exit 2; }
  [ -w "$jdir" ] || { echo "bench/gemm_sets.sh: --json $json: the directory $jdir is not writable" >&2; exit 2; }
fi
bench="$build/bench/bench_gemm"
[ -x "$bench" ] || { echo "bench/gemm_sets.sh: no bench_gemm at $bench (build first, or --build DIR)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
declare -A core=([avx512]=SkylakeX [avx2]=Haswell [generic]=Nehalem)
sets=()
for set in avx512 avx2 generic; do
  # A set above what the CPU supports is refused (bench_gemm exits with KILN_CPU_ISA's error): skip it.
  if ! KILN_CPU_ISA=$set "$bench" --help > /dev/null 2>&1; then
    echo "== $set: not supported by this CPU, skipped"
    continue
  fi
  echo "== $set (OpenBLAS as ${core[$set]})"
  KILN_CPU_ISA=$set OPENBLAS_CORETYPE=${core[$set]} "$bench" ${quick[@]+"${quick[@]}"} --json "$work/$set.json"
  sets+=("$set")
done
python3 - "$work" "$json" "${sets[@]}" <<'PY'
import json, statistics, sys
work, out, sets = sys.argv[1], sys.argv[2], sys.argv[3:]
runs = {s: json.load(open(f"{work}/{s}.json")) for s in sets}
print("\nKiln / OpenBLAS, f32 rows:")
print(f"{'set':8} {'lowest':>8} {'median':>8} {'highest':>8} {'1024^3':>8}")
for s, r in runs.items():
    ratios = [(row["gflops"] / row["openblas_gflops"], row) for row in r["rows"]
              if row["dtype"] == "f32" and row.get("openblas_gflops")]
    if not ratios:
        print(f"{s:8} (no OpenBLAS in this build)")
        continue
    vals = [x for x, _ in ratios]
    sq = [x for x, row in ratios if row["m"] == row["n"] == row["k"] == 1024]
    print(f"{s:8} {min(vals):7.2f}x {statistics.median(vals):7.2f}x {max(vals):7.2f}x "
          + (f"{sq[0]:7.2f}x" if sq else "       -"))
if out:
    with open(out, "w") as f:
        json.dump({"benchmark": "gemm_sets", "sets": runs}, f, indent=2)
    print(f"\nwrote {out}")
PY
