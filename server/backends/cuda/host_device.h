// Qualifiers for code that compiles for host and device alike (the device
// comparison's per-thread code, tested on any host; internal to this
// folder).
#pragma once

#if defined(__CUDACC__)
#define TC_INLINE __host__ __device__ __forceinline__
// Before a host-and-device template that calls what it is given: a device
// instance may call device-only functions (lambdas of a kernel).
#define TC_EXEC_CHECK_DISABLE _Pragma("nv_exec_check_disable")
#else
#define TC_INLINE inline
#define TC_EXEC_CHECK_DISABLE
#endif

// Loop unrolling hints for nvcc's device pass only (a host compiler would
// warn about an unknown pragma).
#if defined(__CUDA_ARCH__)
#define TC_PRAGMA(x) _Pragma(#x)
#else
#define TC_PRAGMA(x)
#endif
#define TC_UNROLL TC_PRAGMA(unroll)
#define TC_NO_UNROLL TC_PRAGMA(unroll 1)
