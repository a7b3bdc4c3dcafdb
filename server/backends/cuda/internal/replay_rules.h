// Which CPU configuration replays one cuBLASLt kernel bit for bit, in pure
// host functions (internal to this folder; no CUDA here, so the host test
// checks every rule in a build without CUDA too): the canonical
// `cpu:<precision>:<bias>@...,mma=GEN[,tile_k=N]` whose K order
// (core/linear_config.h's KernelOrderOf) is the kernel's, from what cuBLASLt
// tells of the algorithm (CUBLASLT_ALGO_CONFIG_*) and the device's compute
// capability. The `cublaslt` backend puts it in the details of every
// algorithm it describes (the heuristic's list and the algorithm a run
// used) as "replay", or says why there is none as "replay_unavailable".
//
//   ReplayRun run;
//   run.config = config;                     // cublaslt:bf16:fused
//   run.device = ComputeCapability{9, 0};
//   run.d = run.out = DType::kBFloat16;
//   LtAlgoConfig algo{/*stages=*/15, /*splitk=*/1, /*scheme=*/0};  // STAGES_64x3
//   TC_ASSIGN_OR_RETURN(std::string replay, ReplayConfig(run, algo));
//   // replay == "cpu:bf16:fused@mma=sm90,tile_k=64"
//
// The mapping (cublasLt.h's enums; lt_matmul.cc checks the values):
//   - mma= from the compute capability: 8.0, 8.6 and 8.9 sm80 (the A100's
//     model: the Ampere and Ada tensor cores of the 16- and 19-bit formats),
//     9.0 sm90, 10.0 sm100; no other capability has a model
//     (core/tensor_core_model.h), so no replay (8.7, 10.3, 11.x, 12.x ...).
//     FP8 has no sm80 model: no replay on 8.9.
//   - tile_k= from the algorithm's stages id (cublasLtMatmulStages_t,
//     CUBLASLT_MATMUL_STAGES_<K>x<count> and <K>xAUTO, "size and number of
//     stages in which elements are read into shared memory"): the first
//     number, the K extent of one stage, one iteration of the kernel's
//     mainloop. STAGES_UNDEFINED: no tile_k (one chain of blocks from
//     k = 0). An id this table does not know (a newer cuBLASLt): no replay.
//     A tile_k the model's block does not divide (8 under sm90's 16-wide
//     bf16 block) fails ParseConfigSpec: no replay, its message the reason.
//   - residue: cuBLASLt does not say where its kernels take the partial
//     tile of K (K mod tile_k), so none is named and the replay takes the
//     default, last (zero-filled past the end, as TMA loads do); a CUTLASS
//     2.x multistage kernel takes it first. The GPU validation's bitwise
//     share is what tells.
//   - splitk=N,reduce= from CUBLASLT_ALGO_CONFIG_SPLITK_NUM > 1 and the
//     reduction scheme (ReplayReduce below), for bf16 and fp16 only (the
//     precisions that take `splitk=`); a split of another precision, or of
//     more than kMaxSplitK slices: no replay.
//   - scaling= and fast_accum as the run had them (FP8); scaling=block128
//     is not modelled: no replay.
// Only the precisions that take `mma=` (TakesMma) have a replay at all;
// tf32rna and tf32trunc, which the device emulates with a strict-fp32 GEMM
// on inputs rounded by a kernel (session_run.cc), run no TF32 tensor-core
// kernel to replay.
//
// Thread-safe (pure).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "core/linear_config.h"
#include "core/tensor_core_model.h"
#include "server/backends/cuda/internal/fp8_rules.h"

namespace tensorcheck::cuda::internal {

// One cublasLtMatmulStages_t value: its id, the K extent of a stage and the
// count of stages (0: AUTO).
struct LtStages {
  uint32_t id;
  int k;
  int count;
};

// Every stages id of cublasLt.h (CUDA 13) but UNDEFINED (0), in its order:
// "sorted by stage size first and by number of stages second", then the
// later additions (ids 29 and 30 are not in the header).
inline constexpr LtStages kLtStages[] = {
    {1, 16, 1},   {2, 16, 2},   {3, 16, 3},   {4, 16, 4},   {5, 16, 5},   {6, 16, 6},
    {7, 32, 1},   {8, 32, 2},   {9, 32, 3},   {10, 32, 4},  {11, 32, 5},  {12, 32, 6},
    {13, 64, 1},  {14, 64, 2},  {15, 64, 3},  {16, 64, 4},  {17, 64, 5},  {18, 64, 6},
    {19, 128, 1}, {20, 128, 2}, {21, 128, 3}, {22, 128, 4}, {23, 128, 5}, {24, 128, 6},
    {25, 32, 10}, {26, 8, 4},   {27, 16, 10}, {28, 8, 5},   {31, 8, 3},   {32, 8, 0},
    {33, 16, 0},  {34, 32, 0},  {35, 64, 0},  {36, 128, 0}, {37, 256, 0}, {38, 768, 0},
};

// The id of CUBLASLT_MATMUL_STAGES_<k>x<count> (count 0: AUTO), or 0 when
// the table has none (lt_matmul.cc checks each against cublasLt.h).
constexpr uint32_t LtStagesId(int k, int count) {
  for (const LtStages& s : kLtStages) {
    if (s.k == k && s.count == count) return s.id;
  }
  return 0;
}

// The K extent of a stages id's stage: 0 for CUBLASLT_MATMUL_STAGES_UNDEFINED
// (no tile), nullopt for an id the table does not know.
std::optional<int64_t> StagesTileK(uint32_t stages_id);

// "64x3", "64xAUTO", "UNDEFINED"; "id N" for an unknown one.
std::string LtStagesName(uint32_t stages_id);

// The tensor-core generation a compute capability replays as (above), or
// nullopt.
std::optional<TensorCoreGpu> ReplayGeneration(ComputeCapability cc);

// How a split run with cuBLASLt's reduction `scheme` (cublasLtReductionScheme_t:
// NONE 0, INPLACE 1, COMPUTE_TYPE 2, OUTPUT_TYPE 4), D of type `d` and an
// output of type `out` reduces, as a CPU configuration's `reduce=`
// (docs/numerics.md, "Split-K"), as splitk_rules.h maps the configurations
// to schemes:
//   - COMPUTE_TYPE: fp32 partials reduced in fp32: reduce=fp32.
//   - OUTPUT_TYPE: partials stored and added in D's type: reduce=output
//     when D is the output (16-bit); with an fp32 D that is an fp32
//     reduction: reduce=fp32.
//   - INPLACE: "using the output buffer (and output data type) and counters
//     ... to guarantee the sequentiality": with an fp32 D, fp32 additions
//     one slice after the other, reduce=fp32 (assuming the counters take
//     the slices first to last, as reduce=fp32 adds them). With a 16-bit D
//     each slice's fp32 partial is added to the running 16-bit output, not
//     rounded first as reduce=output rounds it: no replay (FAILED_PRECONDITION).
//   - NONE (or anything else) with a split: no replay.
absl::StatusOr<SplitKReduce> ReplayReduce(uint32_t scheme, DType d, DType out);

// What the replay needs of a cuBLASLt run beside its algorithm.
struct ReplayRun {
  // The configuration run (precision, bias mode, FP8 scaling and fast
  // accumulation; its backend and options other than these are not read).
  Config config;
  ComputeCapability device;
  DType d = DType::kFloat32;    // what the GEMM writes (gemm_plan.h's Plan::d)
  DType out = DType::kFloat32;  // the layer's output dtype
};

// What cuBLASLt tells of the algorithm; nullopt where
// cublasLtMatmulAlgoConfigGetAttribute did not answer.
struct LtAlgoConfig {
  std::optional<uint32_t> stages;  // CUBLASLT_ALGO_CONFIG_STAGES_ID
  std::optional<int32_t> splitk;   // CUBLASLT_ALGO_CONFIG_SPLITK_NUM
  std::optional<uint32_t> scheme;  // CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME
};

// Whether a run of `config` has a replay to describe at all: its precision
// takes `mma=` (TakesMma).
bool ReplayApplies(const Config& config);

// The canonical CPU configuration that replays the kernel, built as a
// Config (Config::ToString) and checked by ParseConfigSpec (and that it
// reads back as itself). FAILED_PRECONDITION saying why none replays it
// (the rules above; INVALID_ARGUMENT when ReplayApplies is false).
absl::StatusOr<std::string> ReplayConfig(const ReplayRun& run, const LtAlgoConfig& algo);

// The details of one algorithm: "replay" (ReplayConfig), or
// "replay_unavailable" with the reason; nothing when ReplayApplies is
// false.
void DescribeReplay(const ReplayRun& run, const LtAlgoConfig& algo,
                    std::map<std::string, std::string>* details);

}  // namespace tensorcheck::cuda::internal
