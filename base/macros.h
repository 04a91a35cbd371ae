// Portability macros for code shared by the CPU and CUDA backends.
// Functions marked KILN_HD compile for the host and, under nvcc, for the device too;
// KILN_DEVICE_CODE is 1 only in nvcc's device pass, where device intrinsics may be used.
#pragma once

#if defined(__CUDACC__)
#define KILN_HD __host__ __device__ __forceinline__
#else
#define KILN_HD inline
#endif

#if defined(__CUDA_ARCH__)
#define KILN_DEVICE_CODE 1
#else
#define KILN_DEVICE_CODE 0
#endif
