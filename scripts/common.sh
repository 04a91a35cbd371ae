# Shared by scripts/demo and scripts/test: install what is missing, then configure and build.
# Sourced, not run. Honours KILN_BUILD_DIR, KILN_CUDA (AUTO|ON|OFF), KILN_CUDA_ARCHS, KILN_JOBS.
set -euo pipefail

KILN_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KILN_JOBS="${KILN_JOBS:-$(nproc)}"
# ccache: paths under the checkout are hashed relative to it, so a second clone (CI's) reuses what
# an earlier one compiled.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$KILN_ROOT}"
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"

kiln_log() { printf '\033[1m==> %s\033[0m\n' "$*"; }

# Debian packages Kiln builds with; only the missing ones are installed.
KILN_DEBIAN_PACKAGES=(cmake ninja-build g++ pkg-config libeigen3-dev libstb-dev doctest-dev nlohmann-json3-dev
                      libcli11-dev zlib1g-dev ccache dataset-fashion-mnist fortunes libopenmpi-dev openmpi-bin)

kiln_install_deps() {
  local missing=()
  for p in "${KILN_DEBIAN_PACKAGES[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    kiln_log "installing Debian packages: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
  # The CUDA toolkit lives outside PATH on many machines.
  if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="/usr/local/cuda/bin:$PATH"
  fi
}

# kiln_configure BUILD_DIR [extra cmake args...]
kiln_configure() {
  local dir="$1"
  shift
  local args=(-S "$KILN_ROOT" -B "$dir" -G Ninja -DKILN_CUDA="${KILN_CUDA:-AUTO}")
  [ -n "${KILN_CUDA_ARCHS:-}" ] && args+=(-DCMAKE_CUDA_ARCHITECTURES="$KILN_CUDA_ARCHS")
  # KILN_MARCH: the CPU code's instruction set (CMakeLists.txt: portable by default, native, or an
  # -march= value); KILN_CPU_ISA at run time picks the hand-written kernels' set.
  [ -n "${KILN_MARCH:-}" ] && args+=(-DKILN_MARCH="$KILN_MARCH")
  if command -v ccache >/dev/null 2>&1; then
    args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  kiln_log "configuring $dir"
  cmake "${args[@]}" "$@" >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; return 1; }
  grep -E '^-- kiln:' "$dir.configure.log" || true
}

# kiln_build BUILD_DIR [targets...]
kiln_build() {
  local dir="$1"
  shift
  kiln_log "building $dir ${*:-(all)}"
  local t=()
  for x in "$@"; do t+=(--target "$x"); done
  cmake --build "$dir" -j "$KILN_JOBS" "${t[@]}"
}

# kiln_python_install: a venv (KILN_VENV, default .venv in the checkout) with the Python package
# built from this checkout by pip (scikit-build-core: pyproject.toml), its test requirements, and
# PyTorch (for the interop tests) unless KILN_PYTHON_TORCH=0. Prints nothing but progress; the venv's
# python is then "$KILN_VENV/bin/python".
kiln_python_install() {
  kiln_install_deps python3-venv python3-dev chromium  # chromium: the report pages rendered in tests
  export KILN_VENV="${KILN_VENV:-$KILN_ROOT/.venv}"
  if [ ! -x "$KILN_VENV/bin/python" ]; then
    kiln_log "creating the Python venv $KILN_VENV"
    python3 -m venv "$KILN_VENV"
  fi
  local pip=("$KILN_VENV/bin/python" -m pip install -q --disable-pip-version-check)
  local reqs=(scikit-build-core nanobind numpy pytest matplotlib nbclient nbformat ipykernel tensorboard)
  [ "${KILN_PYTHON_TORCH:-1}" = 1 ] && reqs+=(torch)
  kiln_log "Python packages: ${reqs[*]}"
  "${pip[@]}" "${reqs[@]}"
  # The same compiler, CUDA architectures and build type as the C++ build, so ccache serves the
  # library's objects from it (scikit-build-core would take Python's CXX, g++, rather than c++).
  local defs=()
  [ -n "${KILN_CUDA_ARCHS:-}" ] && defs+=(-C "cmake.define.CMAKE_CUDA_ARCHITECTURES=$KILN_CUDA_ARCHS")
  [ -n "${KILN_CUDA:-}" ] && defs+=(-C "cmake.define.KILN_CUDA=$KILN_CUDA")
  kiln_log "pip install $KILN_ROOT (the kiln package)"
  CXX="${CXX:-c++}" "${pip[@]}" --no-build-isolation "${defs[@]}" "$KILN_ROOT"
}
