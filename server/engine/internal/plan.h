// What the engine decides before running a request (Engine::Plan) and what
// a run keeps for a diagnosis (Engine::Artifacts). Shared by engine.cc,
// which makes the plan, and execution.cc, which carries it out.
#pragma once

#include <map>
#include <memory>
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
};

// Per-element arrays a diagnosis reads; several candidates may hold the
// same one (equal error-model parameters on this request).
using SharedFloats = std::shared_ptr<const std::vector<float>>;

// What a run keeps for a diagnosis, per configuration (results order).
struct Engine::Artifacts {
  Tensor reference;
  std::vector<Tensor> outputs;
  // Predicted standard error of observed - candidate under "the observed
  // output is this configuration in another summation order", and its
  // accumulation part alone.
  std::vector<SharedFloats> pair_sigma;
  std::vector<SharedFloats> pair_accumulation_sigma;
  // Predicted standard error of the configuration against the exact result.
  std::vector<SharedFloats> sigma_vs_reference;
  // The output grid where two summation orders part (FlipGrid), for the
  // configuration's bias mode.
  std::vector<SharedFloats> flip_grid;
  // Where the arrays above stay on a device instead (a device execution
  // fills this and leaves them empty): the passes a ranking reads.
  std::unique_ptr<DiagnosisEvidence> evidence;

  // Room for `n` configurations' outputs and arrays.
  void Resize(size_t n) {
    outputs.resize(n);
    pair_sigma.resize(n);
    pair_accumulation_sigma.resize(n);
    sigma_vs_reference.resize(n);
    flip_grid.resize(n);
  }
};

// What every outcome reports about its run: the configuration, its
// timing, details and determinism.
ConfigOutcome DescribeRun(const Config& config, const RunResult& run, double ms);

}  // namespace tensorcheck
