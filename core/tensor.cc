#include "core/tensor.h"

#include <cassert>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/float_formats.h"
#include "core/mx_formats.h"

namespace tensorcheck {

absl::StatusOr<int64_t> CheckedNumel(absl::Span<const int64_t> shape, int64_t max_elements,
                                     absl::string_view field) {
  if (shape.size() > static_cast<size_t>(kMaxRank)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".shape: rank at most ", kMaxRank, " expected, got ", shape.size()));
  }
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    const int64_t d = shape[i];
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".shape[", i, "]: non-negative dimension expected, got ", d));
    }
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".shape ", ShapeString(shape), ": element count overflows"));
    }
    n *= d;
  }
  if (n > max_elements) {
    return absl::ResourceExhaustedError(absl::StrCat(field, ".shape ", ShapeString(shape), ": ", n,
                                                     " elements exceed the limit of ",
                                                     max_elements));
  }
  return n;
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

Tensor::Tensor() : shape_{0} {}

namespace {

// numel of `shape` whose byte size also fits in int64; an overflow of either
// is a malformed shape (INVALID_ARGUMENT), not a resource limit.
absl::StatusOr<int64_t> CheckedNumelAndBytes(DType dtype, const std::vector<int64_t>& shape) {
  auto numel = CheckedNumel(shape, std::numeric_limits<int64_t>::max(), "tensor");
  if (!numel.ok()) return numel.status();
  const int64_t itemsize = static_cast<int64_t>(ItemSize(dtype));
  if (*numel > std::numeric_limits<int64_t>::max() / itemsize) {
    return absl::InvalidArgumentError(absl::StrCat("tensor.shape ", ShapeString(shape),
                                                   ": byte size (", *numel, " x ", itemsize,
                                                   ") overflows"));
  }
  return numel;
}

}  // namespace

absl::StatusOr<Tensor> Tensor::Create(DType dtype, std::vector<int64_t> shape) {
  auto numel = CheckedNumelAndBytes(dtype, shape);
  if (!numel.ok()) return numel.status();
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.numel_ = *numel;
  const size_t bytes = t.nbytes();
  // aligned_alloc needs a size that is a multiple of the alignment.
  const size_t padded = ((bytes + 63) / 64) * 64 + 64;
  void* p = std::aligned_alloc(64, padded);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes for a tensor"));
  }
  std::memset(p, 0, padded);
  t.buffer_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  return t;
}

absl::StatusOr<Tensor> Tensor::Borrow(DType dtype, std::vector<int64_t> shape, const void* bytes,
                                      size_t size, std::shared_ptr<const void> owner) {
  auto numel = CheckedNumelAndBytes(dtype, shape);
  if (!numel.ok()) return numel.status();
  const uint64_t expected = static_cast<uint64_t>(StorageBytes(dtype, *numel));
  if (size != expected) {
    return absl::InvalidArgumentError(absl::StrCat("data: ", expected, " bytes expected (", *numel,
                                                   " ", DTypeName(dtype), "), got ", size));
  }
  if (reinterpret_cast<uintptr_t>(bytes) % ItemSize(dtype) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data: not aligned to ", ItemSize(dtype), " bytes for ", DTypeName(dtype)));
  }
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.numel_ = *numel;
  // The aliasing constructor: shares the owner's lifetime, points at bytes.
  t.buffer_ = std::shared_ptr<void>(std::const_pointer_cast<void>(std::move(owner)),
                                    const_cast<void*>(bytes));
  t.borrowed_ = true;
  return t;
}

void* Tensor::raw() {
  // A borrowed tensor's bytes belong to someone else (a stored tensor
  // other requests read): writing them is a bug, caught here in debug
  // builds and by tests.
  assert(!borrowed_);
  return buffer_.get();
}

absl::StatusOr<Tensor> Tensor::FromBytes(DType dtype, std::vector<int64_t> shape,
                                         absl::string_view bytes) {
  // Check the byte count before allocating: a hostile shape with a short
  // payload must not cost a huge allocation.
  auto numel = CheckedNumelAndBytes(dtype, shape);
  if (!numel.ok()) return numel.status();
  const uint64_t expected = static_cast<uint64_t>(StorageBytes(dtype, *numel));
  if (bytes.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat("data: ", expected, " bytes expected (", *numel,
                                                   " ", DTypeName(dtype), "), got ", bytes.size()));
  }
  auto t = Create(dtype, std::move(shape));
  if (!t.ok()) return t.status();
  if (!bytes.empty()) std::memcpy(t->raw(), bytes.data(), bytes.size());
  return t;
}

Tensor Tensor::Clone() const {
  Tensor t = *Create(dtype_, shape_);  // shape already validated
  if (nbytes() > 0) std::memcpy(t.raw(), raw(), nbytes());
  return t;
}

double Tensor::GetDouble(int64_t i) const {
  switch (dtype_) {
    case DType::kFloat64:
      return data<double>()[i];
    case DType::kFloat32:
      return data<float>()[i];
    case DType::kFloat16:
      return Fp16BitsToFloat(data<uint16_t>()[i]);
    case DType::kBFloat16:
      return Bf16BitsToFloat(data<uint16_t>()[i]);
    case DType::kFloat8E4M3Fn:
      return Fp8BitsToFloat(data<uint8_t>()[i], Fp8Format::kE4M3Fn);
    case DType::kFloat8E5M2:
      return Fp8BitsToFloat(data<uint8_t>()[i], Fp8Format::kE5M2);
    case DType::kFloat4E2M1Fn:
      return Fp4E2M1BitsToFloat(Fp4Code(data<uint8_t>(), i));
    case DType::kFloat8E8M0Fnu:
      return E8M0BitsToFloat(data<uint8_t>()[i]);
  }
  return 0.0;
}

absl::Status Tensor::Reshape(std::vector<int64_t> shape) {
  auto n = CheckedNumel(shape, std::numeric_limits<int64_t>::max(), "tensor");
  if (!n.ok()) return n.status();
  if (*n != numel_) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot reshape ", ShapeString(shape_), " to ", ShapeString(shape)));
  }
  shape_ = std::move(shape);
  return absl::OkStatus();
}

namespace {

// Elements [begin, begin + count) of `t`, widened into T: every dtype's
// decoding, written once.
template <typename T>
void Widen(const Tensor& t, int64_t begin, int64_t count, T* out) {
  switch (t.dtype()) {
    case DType::kFloat64: {
      const double* p = t.data<double>() + begin;
      for (int64_t i = 0; i < count; ++i) out[i] = static_cast<T>(p[i]);
      return;
    }
    case DType::kFloat32: {
      const float* p = t.data<float>() + begin;
      if constexpr (std::is_same_v<T, float>) {
        if (count > 0) std::memcpy(out, p, static_cast<size_t>(count) * sizeof(float));
      } else {
        for (int64_t i = 0; i < count; ++i) out[i] = p[i];
      }
      return;
    }
    case DType::kFloat16: {
      const uint16_t* p = t.data<uint16_t>() + begin;
      for (int64_t i = 0; i < count; ++i) out[i] = Fp16BitsToFloat(p[i]);
      return;
    }
    case DType::kBFloat16: {
      const uint16_t* p = t.data<uint16_t>() + begin;
      for (int64_t i = 0; i < count; ++i) out[i] = Bf16BitsToFloat(p[i]);
      return;
    }
    case DType::kFloat8E4M3Fn:
    case DType::kFloat8E5M2: {
      const Fp8Format format = *Fp8FormatOf(t.dtype());
      const uint8_t* p = t.data<uint8_t>() + begin;
      for (int64_t i = 0; i < count; ++i) out[i] = Fp8BitsToFloat(p[i], format);
      return;
    }
    case DType::kFloat4E2M1Fn: {
      const uint8_t* p = t.data<uint8_t>();
      for (int64_t i = 0; i < count; ++i) out[i] = Fp4E2M1BitsToFloat(Fp4Code(p, begin + i));
      return;
    }
    case DType::kFloat8E8M0Fnu: {
      const uint8_t* p = t.data<uint8_t>() + begin;
      for (int64_t i = 0; i < count; ++i) out[i] = E8M0BitsToFloat(p[i]);
      return;
    }
  }
}

}  // namespace

void WidenRange(const Tensor& t, int64_t begin, int64_t count, double* out) {
  Widen(t, begin, count, out);
}

void WidenRange(const Tensor& t, int64_t begin, int64_t count, float* out) {
  Widen(t, begin, count, out);
}

void ToDouble(const Tensor& t, double* out) { Widen(t, 0, t.numel(), out); }

void ToFloat(const Tensor& t, float* out) { Widen(t, 0, t.numel(), out); }

namespace {

template <typename Src>
absl::StatusOr<Tensor> StoreValues(DType dtype, std::vector<int64_t> shape,
                                   absl::Span<const Src> values) {
  auto t = Tensor::Create(dtype, std::move(shape));
  if (!t.ok()) return t.status();
  if (static_cast<int64_t>(values.size()) != t->numel()) {
    return absl::InvalidArgumentError(
        absl::StrCat("values: ", t->numel(), " expected, got ", values.size()));
  }
  const size_t n = values.size();
  switch (dtype) {
    case DType::kFloat64: {
      double* p = t->template data<double>();
      for (size_t i = 0; i < n; ++i) p[i] = static_cast<double>(values[i]);
      break;
    }
    case DType::kFloat32: {
      float* p = t->template data<float>();
      for (size_t i = 0; i < n; ++i) p[i] = static_cast<float>(values[i]);
      break;
    }
    case DType::kFloat16: {
      uint16_t* p = t->template data<uint16_t>();
      for (size_t i = 0; i < n; ++i) p[i] = DoubleToFp16Bits(values[i]);
      break;
    }
    case DType::kBFloat16: {
      uint16_t* p = t->template data<uint16_t>();
      if constexpr (std::is_same_v<Src, float>) {
        for (size_t i = 0; i < n; ++i) p[i] = FloatToBf16Bits(values[i]);
      } else {
        for (size_t i = 0; i < n; ++i) p[i] = DoubleToBf16Bits(values[i]);
      }
      break;
    }
    case DType::kFloat8E4M3Fn:
    case DType::kFloat8E5M2: {
      const Fp8Format format = *Fp8FormatOf(dtype);
      uint8_t* p = t->template data<uint8_t>();
      for (size_t i = 0; i < n; ++i) p[i] = DoubleToFp8Bits(values[i], format);
      break;
    }
    case DType::kFloat4E2M1Fn: {
      uint8_t* p = t->template data<uint8_t>();
      for (size_t i = 0; i < n; ++i) {
        SetFp4Code(p, static_cast<int64_t>(i), DoubleToFp4E2M1Bits(values[i]));
      }
      break;
    }
    case DType::kFloat8E8M0Fnu: {
      // The nearest power of two at or above |v| (a scale is positive).
      uint8_t* p = t->template data<uint8_t>();
      for (size_t i = 0; i < n; ++i) p[i] = DoubleToE8M0Bits(values[i]);
      break;
    }
  }
  return t;
}

}  // namespace

absl::StatusOr<Tensor> FromDoubles(DType dtype, std::vector<int64_t> shape,
                                   absl::Span<const double> values) {
  return StoreValues<double>(dtype, std::move(shape), values);
}

absl::StatusOr<Tensor> FromFloats(DType dtype, std::vector<int64_t> shape,
                                  absl::Span<const float> values) {
  return StoreValues<float>(dtype, std::move(shape), values);
}

double RoundToDType(double v, DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      return v;
    case DType::kFloat32:
      return static_cast<float>(v);
    case DType::kFloat16:
      return Fp16BitsToFloat(DoubleToFp16Bits(v));
    case DType::kBFloat16:
      return Bf16BitsToFloat(DoubleToBf16Bits(v));
    case DType::kFloat8E4M3Fn:
    case DType::kFloat8E5M2: {
      const Fp8Format format = *Fp8FormatOf(dtype);
      return Fp8BitsToFloat(DoubleToFp8Bits(v, format), format);
    }
    case DType::kFloat4E2M1Fn:
      return Fp4E2M1BitsToFloat(DoubleToFp4E2M1Bits(v));
    case DType::kFloat8E8M0Fnu:
      return E8M0BitsToFloat(DoubleToE8M0Bits(v));
  }
  return v;
}

float RoundToDType(float v, DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
    case DType::kFloat32:
      return v;
    case DType::kFloat16:
      return RoundToFp16(v);
    case DType::kBFloat16:
      return RoundToBf16(v);
    case DType::kFloat8E4M3Fn:
    case DType::kFloat8E5M2:
    case DType::kFloat4E2M1Fn:
    case DType::kFloat8E8M0Fnu:
      return static_cast<float>(RoundToDType(static_cast<double>(v), dtype));
  }
  return v;
}

}  // namespace tensorcheck
