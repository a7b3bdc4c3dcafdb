// TF32 input rounding, written once for host and device: fp32's exponent
// range with a 10-bit mantissa. Tensor cores read fp32 operands and drop
// the low 13 mantissa bits; how they round is a property of the hardware,
// so all three candidates are available. float_formats.h (the host's
// reduced-precision formats) includes this header, and the device kernels
// (server/backends/cuda/error_model_kernels.cu's LaunchRoundTf32) call the
// same RoundToTf32, so that the host tests check what the device runs.
//
//   RoundToTf32(1.00048828125f, Tf32Rounding::kNearestEven);  // 1 + 2^-11: a tie, 1.0f
//   RoundToTf32(1.00048828125f, Tf32Rounding::kTiesAway);     // 1 + 2^-10
//   Tf32Bits(0x3f801fffu, Tf32Rounding::kTruncate);           // 0x3f800000
//
// TC_HOST_DEVICE (core/host_device.h): inline for a host compiler,
// __host__ __device__ for nvcc, whose device pass compiles this header (so
// it includes no CUDA header and nothing of Abseil or <string>). Pure
// functions, safe from any thread.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/host_device.h"

namespace tensorcheck {

// How the 13 dropped mantissa bits round. The values are what the device
// launchers take as an int (LaunchRoundTf32).
enum class Tf32Rounding : int {
  kNearestEven = 0,  // `tf32`
  kTiesAway = 1,     // `tf32rna` (cvt.rna.tf32.f32)
  kTruncate = 2,     // `tf32trunc` (low 13 bits dropped)
};

// The fp32 bit pattern `u` rounded to TF32 (the low 13 bits cleared).
// Infinities and NaN are returned unchanged; a carry out of the largest
// binade gives infinity, as the hardware's conversion does.
TC_HOST_DEVICE uint32_t Tf32Bits(uint32_t u, Tf32Rounding mode) {
  if ((u & 0x7f800000u) == 0x7f800000u) return u;  // Inf and NaN unchanged.
  switch (mode) {
    case Tf32Rounding::kNearestEven:
      u += 0xfffu + ((u >> 13) & 1u);
      break;
    case Tf32Rounding::kTiesAway:
      u += 0x1000u;
      break;
    case Tf32Rounding::kTruncate:
      break;
  }
  return u & 0xffffe000u;
}

// f rounded to TF32 under `mode`, as an fp32 value.
TC_HOST_DEVICE float RoundToTf32(float f, Tf32Rounding mode) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(Tf32Bits(__float_as_uint(f), mode));
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  u = Tf32Bits(u, mode);
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

}  // namespace tensorcheck
