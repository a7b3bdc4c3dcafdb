#include "server/backends/cuda/cuda_bench.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "server/backends/cuda/cuda_status.h"
#include "server/backends/cuda/internal/device_compare.h"

namespace tensorcheck {
namespace {

using cuda::ToStatus;

constexpr int kWarmup = 3;

// Device memory freed on scope exit.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (p_ != nullptr) cudaFree(p_);
  }
  absl::Status Allocate(size_t bytes) {
    return ToStatus(cudaMalloc(&p_, std::max<size_t>(bytes, 1)), "cudaMalloc");
  }
  char* get() const { return static_cast<char*>(p_); }

 private:
  void* p_ = nullptr;
};

absl::Status NeedDevice() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError("no CUDA device");
  }
  return absl::OkStatus();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median milliseconds of `work` on `stream`, by CUDA events.
absl::StatusOr<double> TimeOnStream(cudaStream_t stream, int iterations,
                                    const std::function<absl::Status()>& work) {
  cudaEvent_t start = nullptr, stop = nullptr;
  TC_RETURN_IF_ERROR(ToStatus(cudaEventCreate(&start), "cudaEventCreate"));
  TC_RETURN_IF_ERROR(ToStatus(cudaEventCreate(&stop), "cudaEventCreate"));
  std::vector<double> ms;
  absl::Status status;
  for (int i = 0; i < kWarmup + iterations && status.ok(); ++i) {
    cudaEventRecord(start, stream);
    status = work();
    cudaEventRecord(stop, stream);
    if (status.ok()) status = ToStatus(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float t = 0;
    if (status.ok())
      status = ToStatus(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
    if (status.ok() && i >= kWarmup) ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  TC_RETURN_IF_ERROR(status);
  return Median(ms);
}

cudaDataType_t CudaType(DType d) { return d == DType::kBFloat16 ? CUDA_R_16BF : CUDA_R_16F; }

}  // namespace

absl::StatusOr<BareLtTimes> TimeBareCublasLt(const LinearProblem& p, int iterations) {
  TC_RETURN_IF_ERROR(NeedDevice());
  const DType t = p.input->dtype();
  if ((t != DType::kBFloat16 && t != DType::kFloat16) || p.weight->dtype() != t ||
      p.bias == nullptr || p.bias->dtype() != t || p.output_dtype != t ||
      p.layout != WeightLayout::kOutIn) {
    return absl::InvalidArgumentError(
        "bare cuBLASLt baseline: x, W [n, k], b and y of one 16-bit type");
  }
  const int64_t m = p.m, n = p.n, k = p.k;
  cudaStream_t stream = nullptr;
  TC_RETURN_IF_ERROR(ToStatus(cudaStreamCreate(&stream), "cudaStreamCreate"));
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  DeviceBuffer x, w, bias, y, ws;
  const size_t ws_bytes = size_t{32} << 20;
  BareLtTimes out;
  auto body = [&]() -> absl::Status {
    TC_CUDA_RETURN_IF_ERROR(cublasLtCreate(&lt));
    TC_RETURN_IF_ERROR(x.Allocate(p.input->nbytes()));
    TC_RETURN_IF_ERROR(w.Allocate(p.weight->nbytes()));
    TC_RETURN_IF_ERROR(bias.Allocate(p.bias->nbytes()));
    TC_RETURN_IF_ERROR(y.Allocate(static_cast<size_t>(m * n) * ItemSize(t)));
    TC_RETURN_IF_ERROR(ws.Allocate(ws_bytes));
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const void* bias_ptr = bias.get();
    TC_CUDA_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa)));
    TC_CUDA_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof(transb)));
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                           &epilogue, sizeof(epilogue)));
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                           &bias_ptr, sizeof(bias_ptr)));
    const cudaDataType_t ct = CudaType(t);
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&a, ct, k, n, k));
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&b, ct, k, m, k));
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&d, ct, n, m, n));
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t max_ws = ws_bytes;
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof(max_ws)));
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    TC_CUDA_RETURN_IF_ERROR(
        cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, d, d, pref, 1, &heuristic, &found));
    if (found == 0) return absl::FailedPreconditionError("no cuBLASLt heuristic result");
    int32_t id = 0;
    size_t written = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&heuristic.algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id),
                                         &written);
    out.algo = absl::StrCat(id);
    const float one = 1.0f, zero = 0.0f;
    auto matmul = [&]() -> absl::Status {
      TC_CUDA_RETURN_IF_ERROR(cublasLtMatmul(lt, op, &one, w.get(), a, x.get(), b, &zero, y.get(),
                                             d, y.get(), d, &heuristic.algo, ws.get(), ws_bytes,
                                             stream));
      return absl::OkStatus();
    };
    auto upload_x = [&]() -> absl::Status {
      TC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(x.get(), p.input->raw(), p.input->nbytes(),
                                              cudaMemcpyHostToDevice, stream));
      return absl::OkStatus();
    };
    auto upload = [&]() -> absl::Status {
      TC_RETURN_IF_ERROR(upload_x());
      TC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(w.get(), p.weight->raw(), p.weight->nbytes(),
                                              cudaMemcpyHostToDevice, stream));
      TC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(bias.get(), p.bias->raw(), p.bias->nbytes(),
                                              cudaMemcpyHostToDevice, stream));
      return absl::OkStatus();
    };
    TC_RETURN_IF_ERROR(upload());
    TC_ASSIGN_OR_RETURN(out.matmul_ms, TimeOnStream(stream, iterations, matmul));

    TC_ASSIGN_OR_RETURN(Tensor host_y, Tensor::Create(t, {m, n}));
    // Wall clock of the pipeline: `in` (the uploads), the matmul, y back.
    auto pipeline_ms = [&](auto&& in) -> absl::StatusOr<double> {
      std::vector<double> wall;
      for (int i = 0; i < kWarmup + iterations; ++i) {
        const auto start = std::chrono::steady_clock::now();
        TC_RETURN_IF_ERROR(in());
        TC_RETURN_IF_ERROR(matmul());
        TC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_y.raw(), y.get(), host_y.nbytes(),
                                                cudaMemcpyDeviceToHost, stream));
        TC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
        const double ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count();
        if (i >= kWarmup) wall.push_back(ms);
      }
      return Median(wall);
    };
    TC_ASSIGN_OR_RETURN(out.with_transfers_ms, pipeline_ms(upload));
    TC_ASSIGN_OR_RETURN(out.input_only_ms, pipeline_ms(upload_x));
    return absl::OkStatus();
  };
  const absl::Status status = body();
  if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
  if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
  if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
  if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
  if (op != nullptr) cublasLtMatmulDescDestroy(op);
  if (lt != nullptr) cublasLtDestroy(lt);
  cudaStreamDestroy(stream);
  TC_RETURN_IF_ERROR(status);
  return out;
}

absl::StatusOr<double> TimeUploadMs(const Tensor& tensor, int iterations) {
  TC_RETURN_IF_ERROR(NeedDevice());
  DeviceBuffer dst;
  TC_RETURN_IF_ERROR(dst.Allocate(tensor.nbytes()));
  std::vector<double> wall;
  for (int i = 0; i < kWarmup + iterations; ++i) {
    const auto start = std::chrono::steady_clock::now();
    TC_RETURN_IF_ERROR(
        ToStatus(cudaMemcpy(dst.get(), tensor.raw(), tensor.nbytes(), cudaMemcpyHostToDevice),
                 "cudaMemcpy"));
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (i >= kWarmup) wall.push_back(ms);
  }
  return Median(wall);
}

absl::StatusOr<double> TimeDeviceCopyMs(int64_t bytes, int iterations) {
  TC_RETURN_IF_ERROR(NeedDevice());
  DeviceBuffer src, dst;
  TC_RETURN_IF_ERROR(src.Allocate(static_cast<size_t>(bytes)));
  TC_RETURN_IF_ERROR(dst.Allocate(static_cast<size_t>(bytes)));
  TC_RETURN_IF_ERROR(ToStatus(cudaMemset(src.get(), 1, static_cast<size_t>(bytes)), "cudaMemset"));
  cudaStream_t stream = nullptr;
  TC_RETURN_IF_ERROR(ToStatus(cudaStreamCreate(&stream), "cudaStreamCreate"));
  auto ms = TimeOnStream(stream, iterations, [&]() -> absl::Status {
    TC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst.get(), src.get(), static_cast<size_t>(bytes),
                                            cudaMemcpyDeviceToDevice, stream));
    return absl::OkStatus();
  });
  cudaStreamDestroy(stream);
  return ms;
}

absl::StatusOr<DeviceStatsTimes> TimeDeviceStatistics(const Tensor& actual, const Tensor& expected,
                                                      const CompareOptions& options,
                                                      int iterations) {
  TC_RETURN_IF_ERROR(NeedDevice());
  const int64_t total = actual.numel();
  // The error model's sigma where a session keeps it: on the device.
  DeviceBuffer sigma;
  CompareOptions on_device = options;
  if (options.predicted_sigma != nullptr) {
    const size_t bytes = sizeof(float) * static_cast<size_t>(total);
    TC_RETURN_IF_ERROR(sigma.Allocate(bytes));
    TC_RETURN_IF_ERROR(
        ToStatus(cudaMemcpy(sigma.get(), options.predicted_sigma, bytes, cudaMemcpyHostToDevice),
                 "cudaMemcpy"));
    on_device.predicted_sigma = reinterpret_cast<const float*>(sigma.get());
  }
  std::vector<double> host;
  for (int i = 0; i < kWarmup + iterations; ++i) {
    const auto start = std::chrono::steady_clock::now();
    cuda::DeviceCompare prepared(total, on_device);
    host.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
  }
  cuda::DeviceCompare compare(total, on_device);
  TC_RETURN_IF_ERROR(compare.Validate());
  DeviceBuffer a, e, scratch, result_buffer, memory;
  TC_RETURN_IF_ERROR(a.Allocate(actual.nbytes()));
  TC_RETURN_IF_ERROR(e.Allocate(expected.nbytes()));
  TC_RETURN_IF_ERROR(memory.Allocate(static_cast<size_t>(compare.bytes())));
  TC_RETURN_IF_ERROR(scratch.Allocate(cuda::CompareScratchBytes(total)));
  TC_RETURN_IF_ERROR(result_buffer.Allocate(sizeof(cuda::CompareResult)));
  TC_RETURN_IF_ERROR(ToStatus(
      cudaMemcpy(a.get(), actual.raw(), actual.nbytes(), cudaMemcpyHostToDevice), "cudaMemcpy"));
  TC_RETURN_IF_ERROR(
      ToStatus(cudaMemcpy(e.get(), expected.raw(), expected.nbytes(), cudaMemcpyHostToDevice),
               "cudaMemcpy"));
  cudaStream_t stream = nullptr;
  TC_RETURN_IF_ERROR(ToStatus(cudaStreamCreate(&stream), "cudaStreamCreate"));
  DeviceStatsTimes out;
  out.host_ms = Median(host);
  auto body = [&]() -> absl::Status {
    const cuda::DeviceArray da{a.get(), actual.dtype(), total};
    const cuda::DeviceArray de{e.get(), expected.dtype(), total};
    // The totals pass alone: no sigma, bound or group counts.
    const cuda::CompareArgs args = cuda::MakeCompareArgs(da, de, on_device);
    auto* result = reinterpret_cast<cuda::CompareResult*>(result_buffer.get());
    TC_ASSIGN_OR_RETURN(out.totals_ms, TimeOnStream(stream, iterations, [&]() -> absl::Status {
                          TC_CUDA_RETURN_IF_ERROR(cuda::LaunchCompareTotals(
                              args, scratch.get(), result, nullptr, nullptr, stream));
                          return absl::OkStatus();
                        }));
    TC_ASSIGN_OR_RETURN(out.full_ms, TimeOnStream(stream, iterations, [&]() -> absl::Status {
                          return compare.Enqueue(da, de, memory.get(), stream);
                        }));
    return absl::OkStatus();
  };
  const absl::Status status = body();
  cudaStreamDestroy(stream);
  TC_RETURN_IF_ERROR(status);
  return out;
}

}  // namespace tensorcheck
