#!/usr/bin/env bash
# Static facts of Kiln's Tensor Core GEMM (kernels/cuda/tc_gemm.cu) from its compiled code, no GPU
# needed: registers, spills and shared memory per kernel (ptxas -v), the PTX instructions it was
# written for (mma.sync m16n8k16, ldmatrix, cp.async) and the SASS they became (HMMA, LDSM, LDGSTS).
# Usage: bench/tcgemm_facts.sh [ARCH...] (default 80 90). Exit 1 if a kernel spills or an
# instruction is missing. cuobjdump comes from the toolkit, or from PyPI (nvidia-cuda-cuobjdump).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
archs=("$@")
[ ${#archs[@]} -gt 0 ] || archs=(80 90)

cuobjdump=$(command -v cuobjdump || true)
[ -n "$cuobjdump" ] || [ ! -x "$(dirname "$nvcc")/cuobjdump" ] || cuobjdump="$(dirname "$nvcc")/cuobjdump"
if [ -z "$cuobjdump" ] || ! command -v nvdisasm > /dev/null && [ ! -x "$(dirname "$cuobjdump")/nvdisasm" ]; then
  echo "cuobjdump/nvdisasm are not in this toolkit; installing nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm from PyPI"
  python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore --target "$work/pip" \
    nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm > /dev/null
  cuobjdump=$(find "$work/pip" -name cuobjdump -type f | head -1)
  export NVDISASM_PATH=$(dirname "$(find "$work/pip" -name nvdisasm -type f | head -1)")
  chmod +x "$cuobjdump" "$NVDISASM_PATH/nvdisasm"
fi

flags=(-std=c++20 --expt-relaxed-constexpr -I"$root" -DNDEBUG -O3)
launcher=$(command -v ccache || true)  # a second run takes the compiles (and ptxas -v's report) from the cache
status=0
for arch in "${archs[@]}"; do
  echo "== sm_$arch =="
  $launcher "$nvcc" "${flags[@]}" -gencode arch=compute_$arch,code=sm_$arch -Xptxas -v -c "$root/kernels/cuda/tc_gemm.cu" \
    -o "$work/tc_gemm_$arch.o" 2> "$work/ptxas_$arch.txt"
  $launcher "$nvcc" "${flags[@]}" -arch=compute_$arch -ptx "$root/kernels/cuda/tc_gemm.cu" -o "$work/tc_gemm_$arch.ptx"
  "$cuobjdump" --dump-sass "$work/tc_gemm_$arch.o" > "$work/sass_$arch.txt"
  # ptxas -v: per kernel a "Compiling entry function" line, its spill line, then "Used N registers".
  name=""
  while IFS= read -r line; do
    case "$line" in
      *"Compiling entry function"*tc_gemm_kernel*)
        f=$(sed -E 's/.*tc_gemm_kernelILb([01])ELb([01])ELb([01])E.*/\1 \2 \3/' <<< "$line")
        read -r bf ak bk <<< "$f"
        name="$([ "$bf" = 1 ] && echo bf16 || echo f16) A $([ "$ak" = 1 ] && echo row || echo col) B $([ "$bk" = 1 ] && echo col || echo row)"
        ;;
      *"spill stores"*) [ -n "$name" ] && spill=$(sed -E 's/^ *//' <<< "$line") ;;
      *"Used "*" registers"*)
        if [ -n "$name" ]; then
          regs=$(sed -E 's/.*Used ([0-9]+) registers.*/\1/' <<< "$line")
          printf "  %-16s %3s registers/thread (x 256 threads), 49152 B dynamic smem, %s\n" "$name" "$regs" "$spill"
          name=""
        fi
        ;;
    esac
  done < "$work/ptxas_$arch.txt"
  if grep "spill stores" "$work/ptxas_$arch.txt" | grep -qv " 0 bytes spill stores, 0 bytes spill loads"; then
    echo "  SPILLS: a kernel spills registers (see ptxas -v)"; status=1
  fi
  ptx_mma=$(grep -c "mma.sync.aligned.m16n8k16.row.col.f32" "$work/tc_gemm_$arch.ptx" || true)
  ptx_ldsm=$(grep -c "ldmatrix.sync.aligned.m8n8.x4" "$work/tc_gemm_$arch.ptx" || true)
  ptx_cp=$(grep -c "cp.async.cg.shared.global" "$work/tc_gemm_$arch.ptx" || true)
  sass_hmma=$(grep -c "HMMA.16816.F32" "$work/sass_$arch.txt" || true)
  sass_ldsm=$(grep -c "LDSM" "$work/sass_$arch.txt" || true)
  sass_ldgsts=$(grep -c "LDGSTS" "$work/sass_$arch.txt" || true)
  echo "  PTX:  mma.sync.aligned.m16n8k16 x$ptx_mma, ldmatrix.x4 x$ptx_ldsm, cp.async.cg x$ptx_cp"
  echo "  SASS: HMMA.16816.F32 x$sass_hmma, LDSM x$sass_ldsm, LDGSTS x$sass_ldgsts"
  for n in "$ptx_mma" "$ptx_ldsm" "$ptx_cp" "$sass_hmma" "$sass_ldsm" "$sass_ldgsts"; do
    [ "$n" -gt 0 ] || { echo "  MISSING: an expected instruction is absent"; status=1; }
  done
done
exit $status
