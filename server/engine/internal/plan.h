// What the engine decides before running a request (Engine::Plan) and what
// a run keeps for a diagnosis (Engine::Artifacts). Shared by engine.cc,
// which makes the plan, and device_execution.cc, which carries it out.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "core/layer_shape.h"
#include "core/linear_config.h"
#include "server/backends/linear_backend.h"
#include "server/engine/diagnosis.h"
#include "server/engine/engine.h"
#include "server/stats/diff_stats.h"
#include "server/stats/tolerance.h"

namespace tensorcheck {

// Everything decided before running anything.
struct Engine::Plan {
  // The layer: m, n, k from the tensors, the request's layout and
  // activation, the output dtype it asked for or the default.
  LayerShape shape;
  std::vector<int64_t> output_shape;  // the input's leading dims, then N
  // How the FP8 operands' block-wise scales tile the layer (none: per
  // tensor or row-wise scales, or wide operands).
  ScaleBlocks scale_blocks;
  // MXFP8/NVFP4 block scales in the plain layout the layer takes (the
  // request's, converted from the swizzled layout when they came so);
  // unset: the request's scales as they came.
  std::optional<Tensor> input_scale, weight_scale;
  Config reference;
  LinearBackend* reference_backend = nullptr;
  // The reference prepared for the layer by its backend
  // (LinearBackend::Prepare, asked once per configuration).
  PreparedRun reference_run;
  std::vector<Config> configs;
  std::vector<LinearBackend*> backends;
  std::vector<PreparedRun> runs;  // configs[i] prepared by backends[i]
  Tolerance tolerance;
  Precision observed_bound_precision = Precision::kFp32;
  CompareOptions compare;
  RunOptions run;
  // Batch invariance: the sub-batch sizes to run (empty: not asked).
  std::vector<int64_t> batch_sizes;
  // Default candidates that a device backend could not run on this layer,
  // by the configuration that ran instead: "the device's configuration:
  // why" (ranked candidates' details, "passed_over").
  std::map<std::string, std::string> passed_over;
  // The request's accepted configurations (LinearRequest::accept).
  std::vector<ConfigPattern> accept;
  // Where the run counts its steps for GetProgress; null: nobody asks.
  RequestProgress* progress = nullptr;
  // A diagnosis over default candidates: the tiers they come from
  // (DiagnosisOutcome::tiers); empty when the request named them.
  std::vector<int> tiers;
  // The request's GPU, when it named one, and where the orders of its
  // kernels' replays come from (ReplayOrder::source, one per distinct).
  std::optional<TensorCoreGpu> gpu;
  std::vector<std::string> replay_sources;
  // Runs an earlier tier of this request made (its configurations and
  // reference, times its repeats): counted by CheckCost against the work
  // per request.
  int64_t prior_runs = 0;
};

// What a run keeps for a diagnosis: the evidence the ranking reads, over
// the arrays the run left on its session (the candidates' outputs and
// error-model arrays).
struct Engine::Artifacts {
  std::unique_ptr<DiagnosisEvidence> evidence;
};

// What every outcome reports about its run: the configuration, its
// timing, details and determinism.
ConfigOutcome DescribeRun(const Config& config, const RunResult& run, double ms);

}  // namespace tensorcheck
