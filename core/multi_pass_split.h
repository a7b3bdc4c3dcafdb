// The split of the multi-pass precisions (docs/numerics.md, "Multi-pass
// precisions"), written once for host and device: core's SplitMultiPass
// (linear_config.h, what the CPU backend multiplies) and the cuda backends'
// split kernel (server/backends/cuda/cuda_kernels.cu) call the same
// functions, so the host tests check what the device runs.
//
//   float parts[3];
//   SplitMultiPassValue(/*parts=*/2, /*tf32=*/false, 1.0f + 0x1p-10f, parts);
//   // parts[0] == 1.0f (cut toward zero to bf16), parts[1] == 0x1p-10f
//
// Every part but the last is the running remainder cut toward zero to bf16
// (the low 16 bits cleared, as XLA masks them) or, for TF32, rounded ties
// away (Triton's cvt.rna.tf32.f32); the remainder after it is exact in
// fp32. The last part is the remainder rounded to bf16 (nearest even; a
// NaN stays a quiet NaN) or truncated to TF32.
//
// TC_HOST_DEVICE (core/host_device.h): nvcc's device pass compiles this
// header, so it includes no CUDA header and nothing of Abseil. Pure
// functions, safe from any thread.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/host_device.h"
#include "core/tf32_rounding.h"

namespace tensorcheck {
namespace multi_pass {

TC_HOST_DEVICE uint32_t BitsOf(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

TC_HOST_DEVICE float FloatOf(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// Toward zero to bf16: the low 16 bits cleared (float_formats.h's
// TruncateToBf16).
TC_HOST_DEVICE float CutToBf16(float f) { return FloatOf(BitsOf(f) & 0xffff0000u); }

// To nearest even bf16, as an fp32 value; NaN stays NaN, quieted
// (float_formats.h's RoundToBf16, bit for bit).
TC_HOST_DEVICE float NearestBf16(float f) {
  const uint32_t u = BitsOf(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return FloatOf((u | 0x00400000u) & 0xffff0000u);
  const uint32_t lsb = (u >> 16) & 1u;
  return FloatOf((u + 0x7fffu + lsb) & 0xffff0000u);
}

}  // namespace multi_pass

// Splits `v` into `parts` (2 or 3) parts, highest first, into out[0..parts).
// `tf32`: TF32 parts (tf32x3), else bf16 parts (bf16x3, bf16x6, bf16x9).
TC_HOST_DEVICE void SplitMultiPassValue(int parts, bool tf32, float v, float* out) {
  float rest = v;
  for (int i = 0; i + 1 < parts; ++i) {
    const float part =
        tf32 ? RoundToTf32(rest, Tf32Rounding::kTiesAway) : multi_pass::CutToBf16(rest);
    out[i] = part;
    // Exact: `part` is `rest` with its low bits cleared, or (TF32 ties
    // away) rounded at a bit that `rest` has; the difference fits in fp32
    // (Sterbenz when the rounding carries into a new binade).
    rest = rest - part;
  }
  out[parts - 1] =
      tf32 ? RoundToTf32(rest, Tf32Rounding::kTruncate) : multi_pass::NearestBf16(rest);
}

// One step of the partial sums: s + partial, where `guard` (before the last,
// high x high partial) first replaces a NaN s by zero and keeps
// infinities (XLA's select(inf >= |s|, s, 0)).
TC_HOST_DEVICE float AddPartial(float s, float partial, bool guard) {
  const bool nan = (multi_pass::BitsOf(s) & 0x7fffffffu) > 0x7f800000u;
  return (guard && nan ? 0.0f : s) + partial;
}

}  // namespace tensorcheck
