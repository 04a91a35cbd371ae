#!/usr/bin/env bash
# Registers and spills of every handwritten CUDA kernel (kernels/cuda/*.cu), from ptxas -v, no GPU
# needed. Usage: bench/kernel_facts.sh [ARCH...] (default 75 90: the oldest and newest targets).
# Prints one line per source file and architecture (kernels, most registers, spills) and every
# kernel that spills; exit 1 if any does. tc_gemm.cu has its own, deeper report (tcgemm_facts.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
archs=("$@")
[ ${#archs[@]} -gt 0 ] || archs=(75 90)
printf '#pragma once\n#define KILN_CUDA_ARCHS "facts"\n' > "$work/kiln_build_info.h"
cudnn_inc=$(dirname "$(find /usr/include /usr/local/cuda/include -name cudnn.h 2>/dev/null | head -1)")
flags=(-std=c++20 --expt-relaxed-constexpr -I"$root" -I"$work" -I"$cudnn_inc" -DNDEBUG -O3)
status=0
for src in "$root"/kernels/cuda/*.cu; do
  name=$(basename "$src")
  [ "$name" = tc_gemm.cu ] && continue
  for arch in "${archs[@]}"; do
    log="$work/${name%.cu}_$arch.txt"
    "$nvcc" "${flags[@]}" -gencode arch=compute_$arch,code=sm_$arch -Xptxas -v -c "$src" -o "$work/k.o" 2> "$log"
    kernels=$(grep -c "Compiling entry function" "$log" || true)
    [ "$kernels" -gt 0 ] || continue  # host code only
    regs=$( (grep -oE "Used [0-9]+ registers" "$log" || true) | awk '{print $2}' | sort -n | tail -1)
    # ptxas -v prints, per kernel, "Compiling entry function 'NAME'" and later its spill line.
    spilling=$(awk '/Compiling entry function/ { match($0, /'"'"'[^'"'"']+'"'"'/); k = substr($0, RSTART + 1, RLENGTH - 2) }
                    /spill stores/ && !/ 0 bytes spill stores, 0 bytes spill loads/ { print k }' "$log" | sort -u)
    printf "  sm_%s %-18s %3s kernels, at most %3s registers/thread, %s\n" "$arch" "$name" "$kernels" "${regs:-0}" \
      "$([ -z "$spilling" ] && echo "no spills" || echo "SPILLS in: $(echo "$spilling" | c++filt | tr '\n' ' ')")"
    [ -z "$spilling" ] || status=1
  done
done
exit $status
