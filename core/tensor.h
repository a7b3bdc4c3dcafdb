// Tensor: a dtype, a shape and an owned, 64-byte aligned host buffer.
//
// Creation validates the shape with checked arithmetic before anything is
// allocated, so a hostile shape is an error, never an overflow or a huge
// allocation.
//
//   TC_ASSIGN_OR_RETURN(Tensor t, Tensor::Create(DType::kFloat32, {2, 3}));
//   float* p = t.data<float>();
//   double v = t.GetDouble(4);   // element 4 widened exactly to double
//
// Tensors are move-only; Clone() copies explicitly. A tensor may also view
// bytes it does not own (Borrow: a stored tensor, pinned by `owner` for as
// long as the view lives); such a tensor is read-only.
//
//   TC_ASSIGN_OR_RETURN(Tensor w, Tensor::Borrow(DType::kBFloat16, {n, k}, blob->data(),
//                                                blob->size(), blob));
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/dtype.h"

namespace tensorcheck {

// Product of `shape` with overflow and sign checks. `field` names the
// tensor in error messages. Fails when a dim is negative, the rank exceeds
// kMaxRank, or the product exceeds `max_elements`.
inline constexpr int kMaxRank = 8;
absl::StatusOr<int64_t> CheckedNumel(absl::Span<const int64_t> shape, int64_t max_elements,
                                     absl::string_view field);

// "[2, 768]".
std::string ShapeString(absl::Span<const int64_t> shape);

class Tensor {
 public:
  // An empty float32 tensor of shape [0].
  Tensor();

  // Zero-filled tensor. Fails on a bad shape (see CheckedNumel, with no
  // element limit beyond int64 overflow) or when allocation fails.
  static absl::StatusOr<Tensor> Create(DType dtype, std::vector<int64_t> shape);

  // Copies `bytes`, which must be exactly numel * itemsize long.
  static absl::StatusOr<Tensor> FromBytes(DType dtype, std::vector<int64_t> shape,
                                          absl::string_view bytes);

  // A read-only view of `bytes` (exactly numel * itemsize of them), which
  // `owner` keeps alive: no copy. The bytes need only the alignment of the
  // dtype's elements.
  static absl::StatusOr<Tensor> Borrow(DType dtype, std::vector<int64_t> shape, const void* bytes,
                                       size_t size, std::shared_ptr<const void> owner);

  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  Tensor Clone() const;

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(StorageBytes(dtype_, numel_)); }
  int64_t dim(int i) const { return shape_[static_cast<size_t>(i)]; }
  int rank() const { return static_cast<int>(shape_.size()); }

  // Writable bytes; never of a borrowed tensor.
  void* raw();
  const void* raw() const { return buffer_.get(); }
  // Whether the bytes are a view of someone else's (Borrow).
  bool borrowed() const { return borrowed_; }
  absl::string_view bytes() const {
    return absl::string_view(static_cast<const char*>(raw()), nbytes());
  }

  template <typename T>
  T* data() {
    return static_cast<T*>(raw());
  }
  template <typename T>
  const T* data() const {
    return static_cast<const T*>(raw());
  }

  // Element i widened exactly to double (bf16/fp16 are read as their bits).
  double GetDouble(int64_t i) const;

  // Same data, new shape with the same number of elements.
  absl::Status Reshape(std::vector<int64_t> shape);

  // What names these bytes across requests (a stored tensor's digest,
  // "sha256:..."), or empty. A device backend keeps tensors with one
  // resident between requests, keyed by it; equal ids must mean equal
  // bytes, so set it only on tensors nobody writes (borrowed ones). A
  // Clone (writable) has none; Reshape keeps it (same bytes).
  const std::string& content_id() const { return content_id_; }
  void set_content_id(std::string id) { content_id_ = std::move(id); }

 private:
  DType dtype_ = DType::kFloat32;
  std::vector<int64_t> shape_;
  int64_t numel_ = 0;
  // Owned (freed with std::free) or borrowed (the owner's handle).
  std::shared_ptr<void> buffer_;
  bool borrowed_ = false;
  std::string content_id_;
};

// Widens every element exactly into `out` (numel doubles).
void ToDouble(const Tensor& t, double* out);
// Widens into float: exact for fp32/fp16/bf16/fp8; fp64 is rounded to nearest.
void ToFloat(const Tensor& t, float* out);
// The same for elements [begin, begin + count) only (a block of a weight,
// a chunk of a comparison).
void WidenRange(const Tensor& t, int64_t begin, int64_t count, double* out);
void WidenRange(const Tensor& t, int64_t begin, int64_t count, float* out);

// Stores `values` into a new tensor of `dtype`, rounding each once to
// nearest even.
absl::StatusOr<Tensor> FromDoubles(DType dtype, std::vector<int64_t> shape,
                                   absl::Span<const double> values);
absl::StatusOr<Tensor> FromFloats(DType dtype, std::vector<int64_t> shape,
                                  absl::Span<const float> values);

// Rounds a value to `dtype` and widens it back (the value a tensor of that
// dtype would hold).
double RoundToDType(double v, DType dtype);
float RoundToDType(float v, DType dtype);

}  // namespace tensorcheck
