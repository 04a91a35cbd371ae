# Cross-compiling Kiln's CPU-only configuration for 64-bit ARM (Linux, glibc) with Debian's
# aarch64-linux-gnu toolchain; scripts/arm64-check uses it. Target libraries (zlib) come from the
# arm64 multiarch packages, the header-only ones (Eigen, doctest, nlohmann-json, CLI11, stb) from
# the host's /usr/include and /usr/share. Test executables run under qemu-user, so ctest runs the
# suite as it does natively.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
# Libraries and headers from the target root or the host's multiarch tree (/usr/lib/aarch64-linux-gnu);
# package files (Eigen3Config.cmake, ...) from the host's /usr/share too: they describe headers only.
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
find_program(KILN_QEMU_AARCH64 NAMES qemu-aarch64-static qemu-aarch64)
if(KILN_QEMU_AARCH64)
  # The C library and its loader from one place, the cross sysroot: the loader there with the arm64
  # multiarch libc (/lib/aarch64-linux-gnu, pulled in by zlib1g-dev:arm64) hangs in pthread_create.
  set(CMAKE_CROSSCOMPILING_EMULATOR ${KILN_QEMU_AARCH64} -L /usr/aarch64-linux-gnu -E
                                    LD_LIBRARY_PATH=/usr/aarch64-linux-gnu/lib)
endif()
