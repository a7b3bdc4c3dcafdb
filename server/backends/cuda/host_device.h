// Qualifiers for code that compiles for host and device alike (the device
// comparison's per-thread code, tested on any host; internal to this
// folder).
#pragma once

#if defined(__CUDACC__)
#define TC_INLINE __host__ __device__ __forceinline__
#else
#define TC_INLINE inline
#endif

// Loop unrolling hints for nvcc's device pass only (a host compiler would
// warn about an unknown pragma).
#if defined(__CUDA_ARCH__)
#define TC_UNROLL _Pragma("unroll")
#define TC_NO_UNROLL _Pragma("unroll 1")
#else
#define TC_UNROLL
#define TC_NO_UNROLL
#endif
