// RunChunk: one chunk of Compare, block by block. Reads each block (in
// place for fp32 compared in fp32, else widened to double with its
// compared-dtype bits) and hands it to the fastest kernel that takes it.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/float_formats.h"
#include "server/stats/internal/block_kernels.h"

namespace tensorcheck::internal {
namespace {

// Bit patterns in `cmp` of elements [start, start + n) of `t`, whose
// widened values are `v`. Storage in `cmp` itself is read as is.
void ToBits(const Tensor& t, int64_t start, int64_t n, const double* v, DType cmp, uint64_t* out) {
  if (t.dtype() == cmp) {
    switch (cmp) {
      case DType::kFloat64:
        std::memcpy(out, t.data<uint64_t>() + start, n * sizeof(uint64_t));
        return;
      case DType::kFloat32: {
        const uint32_t* p = t.data<uint32_t>() + start;
        for (int64_t j = 0; j < n; ++j) out[j] = p[j];
        return;
      }
      case DType::kFloat16:
      case DType::kBFloat16: {
        const uint16_t* p = t.data<uint16_t>() + start;
        for (int64_t j = 0; j < n; ++j) out[j] = p[j];
        return;
      }
      case DType::kFloat8E4M3Fn:
      case DType::kFloat8E5M2:
      case DType::kFloat4E2M1Fn:  // never compared: no output dtype
      case DType::kFloat8E8M0Fnu: {
        const uint8_t* p = t.data<uint8_t>() + start;
        for (int64_t j = 0; j < n; ++j) out[j] = p[j];
        return;
      }
    }
  }
  // Values of fp32/fp16/bf16 tensors are floats, where the fast float
  // roundings are single roundings of the exact value.
  const bool is_float = t.dtype() != DType::kFloat64;
  switch (cmp) {
    case DType::kFloat64:
      for (int64_t j = 0; j < n; ++j) out[j] = DoubleBits(v[j]);
      return;
    case DType::kFloat32:
      for (int64_t j = 0; j < n; ++j) {
        out[j] = FloatBits(static_cast<float>(v[j]));
      }
      return;
    case DType::kBFloat16:
      if (is_float) {
        for (int64_t j = 0; j < n; ++j) {
          out[j] = FloatToBf16Bits(static_cast<float>(v[j]));
        }
      } else {
        for (int64_t j = 0; j < n; ++j) out[j] = DoubleToBf16Bits(v[j]);
      }
      return;
    case DType::kFloat16:
      for (int64_t j = 0; j < n; ++j) out[j] = DoubleToFp16Bits(v[j]);
      return;
    case DType::kFloat8E4M3Fn:
    case DType::kFloat8E5M2:
      for (int64_t j = 0; j < n; ++j) out[j] = DoubleToFp8Bits(v[j], *Fp8FormatOf(cmp));
      return;
    case DType::kFloat4E2M1Fn:  // never a compared dtype (no output is narrow)
    case DType::kFloat8E8M0Fnu:
      for (int64_t j = 0; j < n; ++j) out[j] = DoubleBits(v[j]);
      return;
  }
}

}  // namespace

void RunChunk(const CompareContext& sh, int64_t first_block, int64_t last_block, ChunkAcc& acc) {
  const CompareOptions& opt = *sh.options;
  acc.start = first_block * kBlock;
  acc.end = std::min(last_block * kBlock, sh.total);
  int64_t col = acc.start % sh.cols;
  int64_t row = acc.start / sh.cols;
  const bool fp32_in_place = sh.actual->dtype() == DType::kFloat32 &&
                             sh.expected->dtype() == DType::kFloat32 &&
                             opt.compared_dtype == DType::kFloat32;

  // Fixed-size scratch, reused per block.
  std::vector<double> va(kBlock), ve(kBlock), abs_buf(kBlock);
  std::vector<uint64_t> ba(kBlock), be(kBlock), ulp_buf(kBlock);

  // Testing only: every block element by element.
  const bool slow_only = CompareKernelMode() == 2;

  for (int64_t b = first_block; b < last_block; ++b) {
    const int64_t start = b * kBlock;
    const int64_t n = std::min(kBlock, sh.total - start);
    BlockSums& bs = (*sh.blocks)[static_cast<size_t>(b)];
    if (fp32_in_place && !slow_only) {
      const FastView<float> fv{
          start,   n,      sh.actual->data<float>() + start, sh.expected->data<float>() + start,
          nullptr, nullptr};
      if (FastBlock(acc, sh, fv, col, row, bs, abs_buf.data(), ulp_buf.data())) {
        continue;
      }
    }
    WidenRange(*sh.actual, start, n, va.data());
    WidenRange(*sh.expected, start, n, ve.data());
    ToBits(*sh.actual, start, n, va.data(), opt.compared_dtype, ba.data());
    ToBits(*sh.expected, start, n, ve.data(), opt.compared_dtype, be.data());
    if (!fp32_in_place && !slow_only) {
      const FastView<double> dv{start, n, va.data(), ve.data(), ba.data(), be.data()};
      if (FastBlock(acc, sh, dv, col, row, bs, abs_buf.data(), ulp_buf.data())) {
        continue;
      }
    }
    const BlockView view{start, n, va.data(), ve.data(), ba.data(), be.data()};
    SlowBlock(acc, sh, view, col, row, bs);
  }
}

}  // namespace tensorcheck::internal
