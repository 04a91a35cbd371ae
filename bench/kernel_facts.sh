#!/usr/bin/env bash
# Registers and spills of every handwritten CUDA kernel (kernels/cuda/*.cu), from ptxas -v, no GPU
# needed, and whether the kernel's body has run on the CPU under the CUDA emulator
# (kernels/cuda/emulator; tests/test_emulated.cpp writes that list).
# Usage: bench/kernel_facts.sh [--emulated FILE] [ARCH...] (default 75 90: the oldest and newest
# targets; FILE: "name launches threads" lines, default build/emulated_kernels.txt).
# Prints one line per kernel (instantiations, most registers per architecture, spills, emulated
# launches) and a summary; exit 1 if any kernel spills. tc_gemm.cu has its own, deeper report
# (tcgemm_facts.sh); its body is covered by its own emulator (tests/test_tcgemm.cpp).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
emulated="$root/build/emulated_kernels.txt"
if [ "${1:-}" = --emulated ]; then
  emulated=$2
  shift 2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
archs=("$@")
[ ${#archs[@]} -gt 0 ] || archs=(75 90)
# The build-info header the kernels include, in a fixed folder: with ccache (when installed) a second run
# finds every compile in the cache, which a fresh temporary folder in the command line would defeat.
info_dir="${XDG_CACHE_HOME:-$HOME/.cache}/kiln/kernel_facts_include"
mkdir -p "$info_dir"
printf '#pragma once\n#define KILN_CUDA_ARCHS "facts"\n' > "$info_dir/kiln_build_info.h"
launcher=$(command -v ccache || true)
# cudnn.h: CUDNN_ROOT's, else the system's or the CUDA toolkit's, else a pip wheel's.
site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null || true)
cudnn_inc=$(dirname "$(find ${CUDNN_ROOT:+"$CUDNN_ROOT/include"} /usr/include /usr/local/cuda/include \
  ${site:+"$site/nvidia/cudnn/include"} -name cudnn.h 2>/dev/null | head -1)")
flags=(-std=c++20 --expt-relaxed-constexpr -I"$root" -I"$info_dir" -I"$cudnn_inc" -DNDEBUG -O3)
# One nvcc per (file, architecture), as many at once as there are cores.
compile() {  # compile SRC ARCH
  local name
  name=$(basename "$1")
  $launcher "$nvcc" "${flags[@]}" -gencode "arch=compute_$2,code=sm_$2" -Xptxas -v -c "$1" -o "$work/${name%.cu}@$2.o" \
    2> "$work/${name%.cu}@$2.log" || { cat "$work/${name%.cu}@$2.log" >&2; return 1; }
}
export -f compile
export nvcc work launcher
export flags_string="${flags[*]}"
for src in "$root"/kernels/cuda/*.cu; do
  [ "$(basename "$src")" = tc_gemm.cu ] && continue
  for arch in "${archs[@]}"; do printf '%s %s\n' "$src" "$arch"; done
done | xargs -P "$(nproc)" -n 2 bash -c 'flags=($flags_string); compile "$0" "$1"' ||
  { echo "kernel_facts: a kernel file did not compile" >&2; exit 1; }
# ptxas -v prints, per kernel, "Compiling entry function 'MANGLED'", then its registers and spills.
python3 - "$work" "$emulated" "${archs[@]}" <<'PY'
import glob, os, re, subprocess, sys
work, emulated_file, archs = sys.argv[1], sys.argv[2], sys.argv[3:]
def base(demangled):
    s = demangled.replace('(anonymous namespace)', '')
    s = re.sub(r'\(.*$', '', s.split(' ', 1)[-1] if s.startswith('void ') else s)
    depth, out = 0, ''
    for ch in s:  # drop template arguments
        depth += ch == '<'
        if depth == 0: out += ch
        depth -= ch == '>'
    return out.split('::')[-1]
facts = {}  # name -> {'file', 'inst', arch -> most registers, 'spills'}
library = set()
mangled = sorted({m for log in glob.glob(os.path.join(work, '*.log'))
                  for m in re.findall(r"Compiling entry function '([^']+)'", open(log).read())})
demangled = dict(zip(mangled, subprocess.run(['c++filt'], input='\n'.join(mangled), capture_output=True,
                                             text=True).stdout.split('\n')))
for log in sorted(glob.glob(os.path.join(work, '*.log'))):
    src, arch = os.path.basename(log)[:-4].split('@')
    f = None
    for line in open(log):
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            k = m.group(1)
            dem = demangled.get(k, k)
            if 'kiln::' not in dem:  # a library's kernel (CUB's radix sort), not handwritten
                library.add(k)
                f = None
                continue
            f = facts.setdefault(base(dem), {'file': src + '.cu', 'inst': set()})
            f['inst'].add(k)
            continue
        if f is None: continue
        r = re.search(r'Used (\d+) registers', line)
        if r: f[arch] = max(f.get(arch, 0), int(r.group(1)))
        s = re.search(r'(\d+) bytes spill stores, (\d+) bytes spill loads', line)
        if s and (s.group(1) != '0' or s.group(2) != '0'): f['spills'] = True
runs = {}
if os.path.exists(emulated_file):
    for line in open(emulated_file):
        p = line.split()
        if len(p) == 3: runs[p[0]] = (int(p[1]), int(p[2]))
cols = ''.join('%9s' % ('sm_' + a) for a in archs)
print('%-32s %-18s %5s%s %7s  %s' % ('kernel', 'file', 'inst', cols, 'spills', 'emulated (launches, threads)'))
spilling = 0
for name in sorted(facts, key=lambda n: (facts[n]['file'], n)):
    f = facts[name]
    spilling += 'spills' in f
    regs = ''.join('%9s' % (str(f.get(a, '-')) + ' reg') for a in archs)
    emu = ('%d, %d' % runs[name]) if name in runs else ('no list' if not runs else 'NOT EMULATED')
    print('%-32s %-18s %5d%s %7s  %s' % (name, f['file'], len(f['inst']), regs, 'SPILLS' if 'spills' in f else 'none', emu))
covered = sum(1 for n in facts if n in runs)
print('%d handwritten kernels (%d instantiations) in %d files, %d library kernels; %d spill; %d emulated on the CPU%s' % (
    len(facts), sum(len(f['inst']) for f in facts.values()), len({f['file'] for f in facts.values()}), len(library),
    spilling, covered,
    '' if runs else ' (no list at %s: run the emulated test first)' % emulated_file))
sys.exit(1 if spilling else 0)
PY
