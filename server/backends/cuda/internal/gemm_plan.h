// How one configuration of the `cublaslt` and `cublas` backends runs on the
// device: the type A and B are given in, the compute and scale types, and
// D's type, what the GEMM (and the Lt epilogue) writes (internal to this
// folder; docs/numerics.md).
//
//   const Plan plan = MakePlan(Precision::kBf16, /*x=*/DType::kFloat32, /*w=*/DType::kFloat32,
//                              /*out=*/DType::kBFloat16, /*epilogue_bias=*/nullptr);
//   // plan.ab == kBFloat16: x and W rounded on the device; CUBLAS_COMPUTE_32F,
//   // fp32 scale; plan.d == kBFloat16: the GEMM writes the output dtype.
//
// Compute types actually used:
//
//   precision  A/B on device        compute             scale  D
//   fp64       fp64                 64F                 fp64   fp64
//   fp32       fp32 (fp32/fp64      32F_PEDANTIC        fp32   fp32
//              storage)
//              fp16/bf16 (x and W   32F                 fp32   out dtype if
//              stored so)                                      it is A/B's
//                                                              type, else fp32
//   tf32       fp32                 32F_FAST_TF32       fp32   fp32
//   bf16       bf16                 32F                 fp32   bf16 if out is
//                                                              bf16, else fp32
//   fp16       fp16                 32F                 fp32   fp16 if out is
//                                                              fp16, else fp32
//   fp16acc    fp16                 16F                 fp16   fp16
//
// Inputs whose storage differs from the A/B type are converted on the
// device by one kernel each, rounding once to nearest even (fp64 -> fp32,
// fp32/fp64 -> bf16/fp16, bf16 -> fp16). We round explicitly rather than
// use CUBLAS_COMPUTE_32F_FAST_16BF/_16F because those "allow" a
// down-conversion (to bf16/fp16 *or TF32*, per cublas_api.h) whose rounding
// is not specified; the explicit kernel is what `x.to(torch.bfloat16)` does
// and what the CPU emulation assumes. TF32 is different: the hardware reads
// fp32 and decides the rounding, which is the thing we want to observe, so
// tf32/tf32rna/tf32trunc all map to FAST_TF32 and only `tf32` is listed.
//
// Output dtype: where cuBLAS(Lt) can write problem.output_dtype directly
// (the column above), it does; otherwise the GEMM (with the Lt epilogue)
// writes D and one kernel rounds D to the output dtype. For an fp32 D this
// is the same single rounding of the same fp32 value the epilogue would
// have rounded, so the result is identical; writing the 16-bit type
// directly is still preferred because it keeps cuBLAS's own choices
// (e.g. split-K reduction in the output type) visible, as in PyTorch.
// For the Lt epilogue the bias has D's type (cublasLt.h); D is widened to
// fp32 when the bias would not convert to D's type exactly. With fp16acc
// the epilogue runs in fp16 and the bias is rounded to fp16.
#pragma once

#include <cublas_v2.h>
#include <library_types.h>

#include "server/backends/cuda/cuda_kernels.h"
#include "server/core/dtype.h"
#include "server/core/linear_config.h"
#include "server/core/tensor.h"

namespace tensorcheck::cuda::internal {

// How one configuration runs on the device.
struct Plan {
  DType ab = DType::kFloat32;  // A and B on the device
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale = CUDA_R_32F;
  DType d = DType::kFloat32;  // what the GEMM (and Lt epilogue) writes
};

// The plan for precision `p`, inputs stored as `x` and `w`, output `out`.
// `epilogue_bias`: the bias (or nullptr) the Lt epilogue will add.
Plan MakePlan(Precision p, DType x, DType w, DType out, const Tensor* epilogue_bias);

// Whether every value of `from` is a value of `to`.
bool ConvertsExactly(DType from, DType to);

// cuBLAS's data type of a dtype.
cudaDataType_t ToCudaType(DType d);

// The activation kernel's kind (cuda_kernels.h) of a layer's activation.
ActKind ToActKind(Activation a);

// "CUBLAS_COMPUTE_32F" and so on, for the details and messages.
const char* ComputeName(cublasComputeType_t c);

}  // namespace tensorcheck::cuda::internal
