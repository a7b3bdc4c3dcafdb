// The cuBLASLt call, in the order of NVIDIA's samples: matmul descriptor
// (compute and scale types, transposes, epilogue, bias, FP8 scales),
// layouts, preference (workspace, reduction schemes), heuristic, matmul.
// LtSetup builds everything before the heuristic, once for both users:
// the run (PrepareLtMatmul, which picks the heuristic's entry `algo`) and
// the list of algorithms (LtAlgorithms), so that entry N of the list is
// what `algo=N` runs. A split-K configuration's list is LtSetup's
// SplitKAlgorithms (gemm_call.h, splitk_rules.h).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"
#include "server/backends/cuda/cuda_status.h"
#include "server/backends/cuda/internal/compare_args.h"
#include "server/backends/cuda/internal/cuda_kernels.h"
#include "server/backends/cuda/internal/gemm_call.h"
#include "server/backends/cuda/internal/replay_rules.h"
#include "server/backends/cuda/internal/splitk_rules.h"

namespace tensorcheck::cuda::internal {
namespace {

static_assert(static_cast<uint32_t>(LtReductionScheme::kNone) == CUBLASLT_REDUCTION_SCHEME_NONE);
static_assert(static_cast<uint32_t>(LtReductionScheme::kInplace) ==
              CUBLASLT_REDUCTION_SCHEME_INPLACE);
static_assert(static_cast<uint32_t>(LtReductionScheme::kComputeType) ==
              CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE);
static_assert(static_cast<uint32_t>(LtReductionScheme::kOutputType) ==
              CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE);

// replay_rules.h's stages table is cublasLt.h's: each id and the K of its
// stage, and no id past the header's last.
#define TC_LT_STAGES(K, N) \
  static_assert(LtStagesId(K, N) == CUBLASLT_MATMUL_STAGES_##K##x##N, "stages " #K "x" #N);
#define TC_LT_STAGES_AUTO(K) \
  static_assert(LtStagesId(K, 0) == CUBLASLT_MATMUL_STAGES_##K##xAUTO, "stages " #K "xAUTO");
TC_LT_STAGES(16, 1)
TC_LT_STAGES(16, 2)
TC_LT_STAGES(16, 3)
TC_LT_STAGES(16, 4)
TC_LT_STAGES(16, 5)
TC_LT_STAGES(16, 6)
TC_LT_STAGES(32, 1)
TC_LT_STAGES(32, 2)
TC_LT_STAGES(32, 3)
TC_LT_STAGES(32, 4)
TC_LT_STAGES(32, 5)
TC_LT_STAGES(32, 6)
TC_LT_STAGES(64, 1)
TC_LT_STAGES(64, 2)
TC_LT_STAGES(64, 3)
TC_LT_STAGES(64, 4)
TC_LT_STAGES(64, 5)
TC_LT_STAGES(64, 6)
TC_LT_STAGES(128, 1)
TC_LT_STAGES(128, 2)
TC_LT_STAGES(128, 3)
TC_LT_STAGES(128, 4)
TC_LT_STAGES(128, 5)
TC_LT_STAGES(128, 6)
TC_LT_STAGES(32, 10)
TC_LT_STAGES(8, 4)
TC_LT_STAGES(16, 10)
TC_LT_STAGES(8, 5)
TC_LT_STAGES(8, 3)
TC_LT_STAGES_AUTO(8)
TC_LT_STAGES_AUTO(16)
TC_LT_STAGES_AUTO(32)
TC_LT_STAGES_AUTO(64)
TC_LT_STAGES_AUTO(128)
TC_LT_STAGES_AUTO(256)
TC_LT_STAGES_AUTO(768)
#undef TC_LT_STAGES
#undef TC_LT_STAGES_AUTO
static_assert(std::size(kLtStages) == 36 && CUBLASLT_MATMUL_STAGES_END == 39,
              "cublasLt.h has stages ids replay_rules.h does not know");

// The most algorithm ids a split-K configuration looks through when none
// of the heuristic's entries takes the split.
constexpr int kMaxLtAlgorithmIds = 256;

// ---- RAII for cuBLASLt descriptors.

struct MatmulDescDestroy {
  void operator()(cublasLtMatmulDesc_t d) const { cublasLtMatmulDescDestroy(d); }
};
struct LayoutDestroy {
  void operator()(cublasLtMatrixLayout_t l) const { cublasLtMatrixLayoutDestroy(l); }
};
struct PreferenceDestroy {
  void operator()(cublasLtMatmulPreference_t p) const { cublasLtMatmulPreferenceDestroy(p); }
};
using MatmulDescPtr =
    std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>, MatmulDescDestroy>;
using LayoutPtr = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>, LayoutDestroy>;
using PreferencePtr =
    std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, PreferenceDestroy>;

const char* EpilogueName(cublasLtEpilogue_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT:
      return "DEFAULT";
    case CUBLASLT_EPILOGUE_BIAS:
      return "BIAS";
    case CUBLASLT_EPILOGUE_RELU_BIAS:
      return "RELU_BIAS";
    case CUBLASLT_EPILOGUE_GELU_BIAS:
      return "GELU_BIAS";
    case CUBLASLT_EPILOGUE_RELU:
      return "RELU";
    case CUBLASLT_EPILOGUE_GELU:
      return "GELU";
    default:
      return "?";
  }
}

// cuBLASLt's scale mode of A (`b` false: the weight) or B (the input).
cublasLtMatmulMatrixScale_t LtScaleMode(Fp8ScaleMode mode, bool b) {
  switch (mode) {
    case Fp8ScaleMode::kTensor:
      return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    case Fp8ScaleMode::kOuterVector:
      return CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    case Fp8ScaleMode::kBlock128:
      return b ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
               : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    case Fp8ScaleMode::kMxVec32:
      return CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0;
    case Fp8ScaleMode::kNvVec16:
      return CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3;
  }
  return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
}

// The epilogue that adds the bias (when there is one) and the activation.
cublasLtEpilogue_t EpilogueOf(bool bias, ActKind act) {
  if (bias) {
    return act == ActKind::kRelu       ? CUBLASLT_EPILOGUE_RELU_BIAS
           : act == ActKind::kGeluTanh ? CUBLASLT_EPILOGUE_GELU_BIAS
                                       : CUBLASLT_EPILOGUE_BIAS;
  }
  return act == ActKind::kRelu       ? CUBLASLT_EPILOGUE_RELU
         : act == ActKind::kGeluTanh ? CUBLASLT_EPILOGUE_GELU
                                     : CUBLASLT_EPILOGUE_DEFAULT;
}

// One heuristic result as RunResult::details / AlgorithmInfo::details: the
// algorithm's configuration as far as cuBLASLt tells it, the workspace it
// needs and the most it was allowed, the heuristic's waves count and, for a
// `replay` run, the CPU configuration that replays the kernel
// (replay_rules.h).
void DescribeAlgorithm(const cublasLtMatmulHeuristicResult_t& h, uint64_t workspace_limit,
                       const std::optional<ReplayRun>& replay, Details* details) {
  Details& d = *details;
  size_t written = 0;
  int32_t id = 0, splitk = 0;
  uint32_t tile = 0, stages = 0, scheme = 0, custom = 0;
  LtAlgoConfig told;
  if (cublasLtMatmulAlgoConfigGetAttribute(&h.algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id),
                                           &written) == CUBLAS_STATUS_SUCCESS) {
    d["algo"] = absl::StrCat(id);
  }
  if (cublasLtMatmulAlgoConfigGetAttribute(&h.algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
                                           sizeof(tile), &written) == CUBLAS_STATUS_SUCCESS) {
    d["algo_tile"] = absl::StrCat(tile);
  }
  if (cublasLtMatmulAlgoConfigGetAttribute(&h.algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                                           sizeof(stages), &written) == CUBLAS_STATUS_SUCCESS) {
    d["algo_stages"] = absl::StrCat(stages);
    told.stages = stages;
  }
  if (cublasLtMatmulAlgoConfigGetAttribute(&h.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                           sizeof(splitk), &written) == CUBLAS_STATUS_SUCCESS) {
    d["algo_splitk"] = absl::StrCat(splitk);
    told.splitk = splitk;
  }
  if (cublasLtMatmulAlgoConfigGetAttribute(&h.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                           sizeof(scheme), &written) == CUBLAS_STATUS_SUCCESS) {
    d["algo_reduction_scheme"] = absl::StrCat(scheme);
    told.scheme = scheme;
  }
  if (cublasLtMatmulAlgoConfigGetAttribute(&h.algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom,
                                           sizeof(custom), &written) == CUBLAS_STATUS_SUCCESS) {
    d["algo_custom_option"] = absl::StrCat(custom);
  }
  d["algo_workspace_bytes"] = absl::StrCat(h.workspaceSize);
  d["workspace_limit_bytes"] = absl::StrCat(workspace_limit);
  d["waves_count"] = absl::StrFormat("%.4g", h.wavesCount);
  if (replay) DescribeReplay(*replay, told, details);
}

// Everything before the heuristic: the operation's descriptor, the
// layouts of A, B and C = D, and the preference. The heuristic reads the
// descriptors' pointers (bias, FP8 scales) for their alignment only.
class LtSetup {
 public:
  // `lt` is only asked by Heuristic: descriptors need no handle (and no
  // device).
  LtSetup(const GemmOperands& operands, cublasLtHandle_t lt, uint64_t workspace_limit)
      : ops_(operands), lt_(lt), workspace_limit_(workspace_limit) {}

  // Builds the descriptors; `details` gets the epilogue, the reduction
  // scheme mask and, for FP8, the scale modes and fast accumulation.
  absl::Status Build(const RunOptions& options, Details* details) {
    epilogue_ = EpilogueOf(ops_.bias != nullptr, ToActKind(ops_.activation));
    (*details)["epilogue"] = EpilogueName(epilogue_);
    TC_RETURN_IF_ERROR(CreateMatmulDesc(details));
    TC_RETURN_IF_ERROR(CreateLayouts());
    TC_RETURN_IF_ERROR(CreatePreference(options, details));
    return absl::OkStatus();
  }

  // The heuristic's first `count` results (in its order of estimated time),
  // up to the first whose state is not CUBLAS_STATUS_SUCCESS. None is
  // FAILED_PRECONDITION naming the problem and the device.
  absl::StatusOr<std::vector<cublasLtMatmulHeuristicResult_t>> Heuristic(
      int count, absl::string_view cfg, absl::string_view device_name) const {
    std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(std::max(count, 1)));
    int found = 0;
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(
        lt_, op_desc_.get(), a_desc_.get(), b_desc_.get(), d_desc_.get(), d_desc_.get(),
        pref_.get(), static_cast<int>(results.size()), results.data(), &found);
    if (hs != CUBLAS_STATUS_SUCCESS && hs != CUBLAS_STATUS_NOT_SUPPORTED) {
      TC_CUDA_RETURN_IF_ERROR(hs);
    }
    if (hs == CUBLAS_STATUS_NOT_SUPPORTED) found = 0;
    size_t usable = 0;
    while (usable < static_cast<size_t>(found) && results[usable].state == CUBLAS_STATUS_SUCCESS) {
      ++usable;
    }
    results.resize(usable);
    if (results.empty()) {
      return MarkNoKernel(absl::FailedPreconditionError(absl::StrCat(
          "configuration ", cfg, ": cuBLASLt has no algorithm (no heuristic result) for ",
          Problem(), ", workspace ", workspace_limit(), " bytes on ", device_name)));
    }
    return results;
  }

  // One algorithm that runs the split, and where it came from (details'
  // "split_k_algo_source").
  struct SplitKAlgo {
    cublasLtMatmulHeuristicResult_t result;
    std::string source;
  };

  // The algorithms that run ops_.split, at most `count` (gemm_call.h): the
  // heuristic's `results` that take it, in their order; when none does,
  // cuBLASLt's algorithm ids for the types, each with the first tile and
  // stages that pass. None: NoSplitKAlgorithm's FAILED_PRECONDITION with
  // the NoKernel mark.
  absl::StatusOr<std::vector<SplitKAlgo>> SplitKAlgorithms(
      const std::vector<cublasLtMatmulHeuristicResult_t>& results, size_t count,
      absl::string_view cfg, absl::string_view device_name) const {
    const SplitKGemm& split = *ops_.split;
    SplitKTally tally;
    std::vector<SplitKAlgo> out;
    for (size_t i = 0; i < results.size() && out.size() < count; ++i) {
      SplitKMiss miss = CapsMiss(results[i].algo, split);
      std::optional<cublasLtMatmulHeuristicResult_t> r;
      if (miss == SplitKMiss::kNone) r = Configure(results[i].algo, split, &miss, &tally);
      tally.Count(miss);
      if (r) out.push_back({*r, absl::StrCat("heuristic entry ", i)});
    }
    if (out.empty()) TC_RETURN_IF_ERROR(FromAlgorithmIds(split, count, &tally, &out));
    if (out.empty()) {
      return NoSplitKAlgorithm(cfg, split, tally, Problem(), workspace_limit(), device_name);
    }
    return out;
  }

  uint64_t workspace_limit() const { return workspace_limit_; }

  cublasLtMatmulDesc_t op_desc() const { return op_desc_.get(); }
  cublasLtMatrixLayout_t a_desc() const { return a_desc_.get(); }
  cublasLtMatrixLayout_t b_desc() const { return b_desc_.get(); }
  cublasLtMatrixLayout_t d_desc() const { return d_desc_.get(); }

 private:
  // The problem, for messages: types, compute type, epilogue and shape.
  std::string Problem() const {
    return absl::StrCat("A/B ", AbTypes(), ", D ", DTypeName(ops_.plan.d), ", ",
                        ComputeName(ops_.plan.compute), ", epilogue ", EpilogueName(epilogue_),
                        ", m=", ops_.m, " n=", ops_.n, " k=", ops_.k);
  }

  // Whether `algo`'s capabilities allow the split (kNone), or why not.
  static SplitKMiss CapsMiss(const cublasLtMatmulAlgo_t& algo, const SplitKGemm& split) {
    LtAlgoCaps caps;
    size_t written = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT,
                                          &caps.splitk_support, sizeof(caps.splitk_support),
                                          &written) != CUBLAS_STATUS_SUCCESS) {
      caps.splitk_support = 0;
    }
    if (cublasLtMatmulAlgoCapGetAttribute(
            &algo, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &caps.reduction_scheme_mask,
            sizeof(caps.reduction_scheme_mask), &written) != CUBLAS_STATUS_SUCCESS) {
      caps.reduction_scheme_mask = 0;
    }
    return AlgoTakesSplitK(caps, split);
  }

  // `algo` with the split's count and scheme set, when
  // cublasLtMatmulAlgoCheck passes it and its workspace fits; otherwise
  // nullopt and `miss` says why (a workspace need goes into `tally`).
  std::optional<cublasLtMatmulHeuristicResult_t> Configure(cublasLtMatmulAlgo_t algo,
                                                           const SplitKGemm& split,
                                                           SplitKMiss* miss,
                                                           SplitKTally* tally) const {
    const int32_t splitk = split.splitk;
    const uint32_t scheme = static_cast<uint32_t>(split.scheme);
    cublasLtMatmulHeuristicResult_t r{};
    if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                             sizeof(splitk)) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                             sizeof(scheme)) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulAlgoCheck(lt_, op_desc_.get(), a_desc_.get(), b_desc_.get(), d_desc_.get(),
                                d_desc_.get(), &algo, &r) != CUBLAS_STATUS_SUCCESS) {
      *miss = SplitKMiss::kCheckFailed;
      return std::nullopt;
    }
    *miss = WorkspaceFits(r.workspaceSize, workspace_limit());
    if (*miss != SplitKMiss::kNone) {
      tally->largest_workspace_needed =
          std::max<uint64_t>(tally->largest_workspace_needed, r.workspaceSize);
      return std::nullopt;
    }
    r.algo = algo;  // "algo field is never updated" by the check
    r.state = CUBLAS_STATUS_SUCCESS;
    return r;
  }

  // An algorithm capability that is an array of uint32_t (tile or stages
  // ids); empty when it has none.
  static std::vector<uint32_t> CapIds(const cublasLtMatmulAlgo_t& algo,
                                      cublasLtMatmulAlgoCapAttributes_t attr) {
    size_t bytes = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, nullptr, 0, &bytes) !=
            CUBLAS_STATUS_SUCCESS ||
        bytes == 0) {
      return {};
    }
    std::vector<uint32_t> ids(bytes / sizeof(uint32_t));
    size_t written = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, ids.data(), ids.size() * sizeof(uint32_t),
                                          &written) != CUBLAS_STATUS_SUCCESS) {
      return {};
    }
    ids.resize(written / sizeof(uint32_t));
    return ids;
  }

  // cuBLASLt's algorithm ids for the problem's types, each initialised
  // (cublasLtMatmulAlgoInit) and, when its capabilities take the split, with
  // the first of its tiles and stages (in the order cuBLASLt lists them)
  // that Configure passes: one entry per id, appended to `out` up to
  // `count`, each counted once in `tally`.
  absl::Status FromAlgorithmIds(const SplitKGemm& split, size_t count, SplitKTally* tally,
                                std::vector<SplitKAlgo>* out) const {
    const cublasComputeType_t compute = ops_.plan.compute;
    const cudaDataType_t scale = ops_.plan.scale;
    const cudaDataType_t a = ToCudaType(ops_.plan.a()), b = ToCudaType(ops_.plan.b());
    const cudaDataType_t d = ToCudaType(ops_.plan.d);
    std::vector<int> ids(kMaxLtAlgorithmIds);
    int found = 0;
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatmulAlgoGetIds(
        lt_, compute, scale, a, b, d, d, static_cast<int>(ids.size()), ids.data(), &found));
    for (int i = 0; i < found && out->size() < count; ++i) {
      cublasLtMatmulAlgo_t algo;
      if (cublasLtMatmulAlgoInit(lt_, compute, scale, a, b, d, d, ids[static_cast<size_t>(i)],
                                 &algo) != CUBLAS_STATUS_SUCCESS) {
        continue;
      }
      SplitKMiss miss = CapsMiss(algo, split);
      std::optional<cublasLtMatmulHeuristicResult_t> r;
      if (miss == SplitKMiss::kNone) {
        std::vector<uint32_t> tiles = CapIds(algo, CUBLASLT_ALGO_CAP_TILE_IDS);
        std::vector<uint32_t> stages = CapIds(algo, CUBLASLT_ALGO_CAP_STAGES_IDS);
        if (tiles.empty()) tiles.push_back(CUBLASLT_MATMUL_TILE_UNDEFINED);
        if (stages.empty()) stages.push_back(CUBLASLT_MATMUL_STAGES_UNDEFINED);
        // The most telling reason over the tiles and stages tried: a
        // workspace short beats a check that failed.
        SplitKMiss worst = SplitKMiss::kCheckFailed;
        for (size_t t = 0; t < tiles.size() && !r; ++t) {
          for (size_t st = 0; st < stages.size() && !r; ++st) {
            cublasLtMatmulAlgo_t one = algo;
            if (cublasLtMatmulAlgoConfigSetAttribute(&one, CUBLASLT_ALGO_CONFIG_TILE_ID, &tiles[t],
                                                     sizeof(uint32_t)) != CUBLAS_STATUS_SUCCESS ||
                cublasLtMatmulAlgoConfigSetAttribute(&one, CUBLASLT_ALGO_CONFIG_STAGES_ID,
                                                     &stages[st],
                                                     sizeof(uint32_t)) != CUBLAS_STATUS_SUCCESS) {
              continue;
            }
            SplitKMiss m = SplitKMiss::kNone;
            r = Configure(one, split, &m, tally);
            if (m == SplitKMiss::kNoWorkspace) worst = m;
          }
        }
        miss = r ? SplitKMiss::kNone : worst;
      }
      tally->Count(miss);
      if (r) out->push_back({*r, absl::StrCat("algorithm id ", ids[static_cast<size_t>(i)])});
    }
    return absl::OkStatus();
  }

  // "bfloat16", or "float8_e4m3fn x float8_e5m2" (A, the weight, first).
  std::string AbTypes() const {
    if (!ops_.plan.fp8) return std::string(DTypeName(ops_.plan.ab));
    return absl::StrCat(DTypeName(ops_.plan.a()), " x ", DTypeName(ops_.plan.b()));
  }

  // The operation: compute and scale types, transposes, epilogue and the
  // bias it adds; for FP8 the scales, their mode and fast accumulation.
  absl::Status CreateMatmulDesc(Details* details) {
    cublasLtMatmulDesc_t od = nullptr;
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&od, ops_.plan.compute, ops_.plan.scale));
    op_desc_.reset(od);
    const cublasOperation_t transa = ops_.a_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t transb = CUBLAS_OP_N;
    TC_CUDA_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(od, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa)));
    TC_CUDA_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(od, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof(transb)));
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(od, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                           &epilogue_, sizeof(epilogue_)));
    if (ops_.bias != nullptr) {
      const void* bias_ptr = ops_.bias;
      TC_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(od, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                             &bias_ptr, sizeof(bias_ptr)));
    }
    if (ops_.plan.fp8) TC_RETURN_IF_ERROR(SetFp8Attributes(od, *ops_.plan.fp8, details));
    return absl::OkStatus();
  }

  // The FP8 GEMM: D = alpha * scale_A * scale_B * op(A) op(B) + bias per
  // tensor, D_ij = alpha * scale_A[i] * scale_B[j] * sum_l a_il b_lj row-wise
  // (cuBLAS documentation, "Narrow Precision Data Types Usage"), alpha 1;
  // block-wise, each block's products times its A and B scales, alpha 1
  // (NVFP4: the global scales' product). A is the weight (scale_A: n values
  // row-wise), B the input (m values).
  absl::Status SetFp8Attributes(cublasLtMatmulDesc_t od, const Fp8Gemm& fp8, Details* details) {
    const void* a_scale = ops_.w_scale;
    const void* b_scale = ops_.x_scale;
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(od, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                           &a_scale, sizeof(a_scale)));
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(od, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                           &b_scale, sizeof(b_scale)));
    if (fp8.scale_mode != Fp8ScaleMode::kTensor) {
      // "int32_t, default: 0" (CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F).
      const int32_t a_mode = LtScaleMode(fp8.scale_mode, /*b=*/false);
      const int32_t b_mode = LtScaleMode(fp8.scale_mode, /*b=*/true);
      TC_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(od, CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                                                             &a_mode, sizeof(a_mode)));
      TC_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(od, CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                                                             &b_mode, sizeof(b_mode)));
    }
    const bool fp8_scaling = fp8.scale_mode == Fp8ScaleMode::kTensor ||
                             fp8.scale_mode == Fp8ScaleMode::kOuterVector ||
                             fp8.scale_mode == Fp8ScaleMode::kBlock128;
    if (fp8_scaling) {
      // "int8_t, default: 0 - fast accumulation mode is disabled."
      const int8_t fast = ops_.fast_accum ? 1 : 0;
      TC_CUDA_RETURN_IF_ERROR(
          cublasLtMatmulDescSetAttribute(od, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
    }
    if (ops_.bias != nullptr && fp8.bias) {
      // bf16 with an fp32 D, not D's type: "int32_t based on cudaDataType".
      const int32_t bias_type = ToCudaType(*fp8.bias);
      TC_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          od, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
    }
    (*details)["a_scale_mode"] = Fp8ScaleModeName(fp8.scale_mode);
    (*details)["b_scale_mode"] = Fp8BScaleModeName(fp8.scale_mode);
    if (fp8_scaling) (*details)["fast_accum"] = ops_.fast_accum ? "true" : "false";
    if (fp8.global_scales) (*details)["alpha"] = absl::StrFormat("%.9g", ops_.alpha);
    return absl::OkStatus();
  }

  // A, B and D as the row-major trick lays them out (gemm_call.h).
  absl::Status CreateLayouts() {
    const int64_t m = ops_.m, n = ops_.n, k = ops_.k;
    const int64_t lda = ops_.a_transposed ? k : n;
    const cudaDataType_t d_type = ToCudaType(ops_.plan.d);
    cublasLtMatrixLayout_t l = nullptr;
    // A as stored: k x n (OUT_IN, transposed) or n x k (IN_OUT).
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(
        &l, ToCudaType(ops_.plan.a()), static_cast<uint64_t>(ops_.a_transposed ? k : n),
        static_cast<uint64_t>(ops_.a_transposed ? n : k), lda));
    a_desc_.reset(l);
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(
        &l, ToCudaType(ops_.plan.b()), static_cast<uint64_t>(k), static_cast<uint64_t>(m), k));
    b_desc_.reset(l);
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&l, d_type, static_cast<uint64_t>(n),
                                                       static_cast<uint64_t>(m), n));
    d_desc_.reset(l);
    return absl::OkStatus();
  }

  // The workspace the algorithm may use and, when asked, no reduced
  // precision reduction.
  absl::Status CreatePreference(const RunOptions& options, Details* details) {
    cublasLtMatmulPreference_t p = nullptr;
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&p));
    pref_.reset(p);
    const uint64_t ws = workspace_limit();
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
        p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    if (options.disallow_reduced_precision_reduction) {
      // Split-K partial sums only in the compute type: no in-place
      // reduction in D (D's type) and no output-type reduction.
      const uint32_t mask = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
      TC_CUDA_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
          p, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof(mask)));
      (*details)["reduction_scheme_mask"] = absl::StrCat(mask);
    } else {
      (*details)["reduction_scheme_mask"] =
          absl::StrCat(static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_MASK));
    }
    return absl::OkStatus();
  }

  const GemmOperands ops_;
  const cublasLtHandle_t lt_;
  const uint64_t workspace_limit_;
  cublasLtEpilogue_t epilogue_ = CUBLASLT_EPILOGUE_DEFAULT;
  // The descriptors live as long as the setup.
  MatmulDescPtr op_desc_;
  LayoutPtr a_desc_, b_desc_, d_desc_;
  PreferencePtr pref_;
};

class LtMatmul final : public GemmCall {
 public:
  LtMatmul(const GemmOperands& operands, CudaContext& ctx)
      : ops_(operands),
        ctx_(ctx),
        setup_(operands, ctx.lt(), static_cast<uint64_t>(ctx.workspace_bytes())) {}

  // Every step before the first matmul, in the samples' order; the
  // heuristic's entry `algo` (0 unless the configuration names one).
  absl::Status Prepare(const RunOptions& options, absl::string_view cfg,
                       absl::string_view device_name, Details* details) {
    TC_RETURN_IF_ERROR(setup_.Build(options, details));
    const int algo = ops_.algo.value_or(0);
    if (algo < 0 || algo > kMaxAlgorithmIndex) {
      return absl::FailedPreconditionError(absl::StrCat("configuration ", cfg, ": algo=", algo,
                                                        " is outside 0..", kMaxAlgorithmIndex));
    }
    // The same fixed-size question as LtAlgorithms, so that entry N here is
    // entry N of the list: cublasLt.h does not promise that the first N+1
    // results of a shorter request are a prefix of a longer one.
    TC_ASSIGN_OR_RETURN(std::vector<cublasLtMatmulHeuristicResult_t> results,
                        setup_.Heuristic(kMaxLtAlgorithms, cfg, device_name));
    std::string source;
    if (ops_.split) {
      // The split list's first algo+1 entries: a prefix of any longer one.
      TC_ASSIGN_OR_RETURN(
          std::vector<LtSetup::SplitKAlgo> split,
          setup_.SplitKAlgorithms(results, static_cast<size_t>(algo) + 1, cfg, device_name));
      results.clear();
      for (const LtSetup::SplitKAlgo& s : split) results.push_back(s.result);
      if (static_cast<size_t>(algo) < split.size()) {
        source = split[static_cast<size_t>(algo)].source;
      }
    }
    if (static_cast<size_t>(algo) >= results.size()) {
      const size_t k = results.size();
      return absl::FailedPreconditionError(absl::StrCat(
          "configuration ", cfg, ": cuBLASLt offers only ", k,
          k == 1 ? " algorithm" : " algorithms", ops_.split ? " that take the split" : "",
          " for this problem (m=", ops_.m, ", n=", ops_.n, ", k=", ops_.k, ", workspace ",
          setup_.workspace_limit(), " bytes); algo=", algo, " is out of range"));
    }
    heuristic_ = results[static_cast<size_t>(algo)];
    DescribeAlgorithm(heuristic_, setup_.workspace_limit(), ops_.replay, details);
    (*details)["algo_index"] = absl::StrCat(algo);
    if (!source.empty()) (*details)["split_k_algo_source"] = source;
    return absl::OkStatus();
  }

  absl::Status Run(char* dst) override {
    void* d_ptr = ops_.d != nullptr ? ops_.d : dst;
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatmul(
        ctx_.lt(), setup_.op_desc(),
        ops_.plan.fp8 ? static_cast<const void*>(&ops_.alpha) : scalars_.one(ops_.plan.scale),
        ops_.w, setup_.a_desc(), ops_.x, setup_.b_desc(), scalars_.zero(ops_.plan.scale), d_ptr,
        setup_.d_desc(), d_ptr, setup_.d_desc(), &heuristic_.algo, ctx_.workspace(),
        static_cast<size_t>(ctx_.workspace_bytes()), ops_.stream));
    if (ops_.d != nullptr) {
      TC_CUDA_RETURN_IF_ERROR(LaunchConvert(ops_.d, ToElem(ops_.plan.d), dst, ToElem(ops_.out),
                                            ops_.m * ops_.n, ops_.stream));
    }
    return absl::OkStatus();
  }

 private:
  const GemmOperands ops_;
  CudaContext& ctx_;
  const Scalars scalars_;
  LtSetup setup_;
  cublasLtMatmulHeuristicResult_t heuristic_{};
};

}  // namespace

absl::StatusOr<std::unique_ptr<GemmCall>> PrepareLtMatmul(
    const GemmOperands& operands, CudaContext& ctx, const RunOptions& options,
    absl::string_view cfg, absl::string_view device_name, Details* details) {
  auto call = std::make_unique<LtMatmul>(operands, ctx);
  TC_RETURN_IF_ERROR(call->Prepare(options, cfg, device_name, details));
  return std::unique_ptr<GemmCall>(std::move(call));
}

absl::StatusOr<std::vector<AlgorithmInfo>> LtAlgorithms(const GemmOperands& operands,
                                                        CudaContext& ctx, const RunOptions& options,
                                                        int limit, absl::string_view cfg,
                                                        absl::string_view device_name) {
  std::vector<AlgorithmInfo> out;
  if (limit < 1) return out;
  LtSetup setup(operands, ctx.lt(), static_cast<uint64_t>(ctx.workspace_bytes()));
  Details ignored;
  TC_RETURN_IF_ERROR(setup.Build(options, &ignored));
  // Always kMaxLtAlgorithms asked, as LtMatmul::Prepare asks, then cut.
  TC_ASSIGN_OR_RETURN(std::vector<cublasLtMatmulHeuristicResult_t> results,
                      setup.Heuristic(kMaxLtAlgorithms, cfg, device_name));
  std::vector<std::string> sources;
  if (operands.split) {
    TC_ASSIGN_OR_RETURN(std::vector<LtSetup::SplitKAlgo> split,
                        setup.SplitKAlgorithms(
                            results, std::min<size_t>(static_cast<size_t>(limit), kMaxLtAlgorithms),
                            cfg, device_name));
    results.clear();
    for (LtSetup::SplitKAlgo& s : split) {
      results.push_back(s.result);
      sources.push_back(std::move(s.source));
    }
  }
  const size_t count = std::min(results.size(), static_cast<size_t>(limit));
  for (size_t i = 0; i < count; ++i) {
    AlgorithmInfo info;
    info.index = static_cast<int>(i);
    DescribeAlgorithm(results[i], setup.workspace_limit(), operands.replay, &info.details);
    if (i < sources.size()) info.details["split_k_algo_source"] = sources[i];
    out.push_back(std::move(info));
  }
  return out;
}

absl::Status BuildLtDescriptors(const GemmOperands& operands, uint64_t workspace_limit,
                                const RunOptions& options, Details* details) {
  LtSetup setup(operands, /*lt=*/nullptr, workspace_limit);
  return setup.Build(options, details);
}

}  // namespace tensorcheck::cuda::internal
