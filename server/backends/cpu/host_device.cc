#include "server/backends/cpu/host_device.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/parallel.h"
#include "core/status_macros.h"
#include "server/stats/diagnosis_passes.h"
#include "server/stats/error_model.h"
#include "server/stats/magnitude_sums.h"

namespace tensorcheck {

absl::StatusOr<std::unique_ptr<DeviceSession>> HostDevice::OpenSession(const StopSignal* stop) {
  TC_RETURN_IF_ERROR(CheckStop(stop));
  return std::unique_ptr<DeviceSession>(OpenHostSession(stop));
}

std::unique_ptr<HostSession> HostDevice::OpenHostSession(const StopSignal* stop) {
  return std::make_unique<HostSession>(&options_, stop);
}

ArrayRef HostSession::Adopt(Tensor t) {
  arrays_.push_back(std::make_unique<Tensor>(std::move(t)));
  return ArrayRef{static_cast<int>(arrays_.size()) - 1};
}

absl::StatusOr<const Tensor*> HostSession::Get(ArrayRef a) const {
  if (!a.valid() || static_cast<size_t>(a.id) >= arrays_.size() ||
      arrays_[static_cast<size_t>(a.id)] == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("no array ", a.id, " in this host session"));
  }
  return arrays_[static_cast<size_t>(a.id)].get();
}

absl::StatusOr<const float*> HostSession::Floats(ArrayRef a, const char* what) const {
  TC_ASSIGN_OR_RETURN(const Tensor* t, Get(a));
  if (t->dtype() != DType::kFloat32) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": not a float32 array"));
  }
  return t->data<float>();
}

const uint8_t* HostSession::MaskData(ArrayRef mask) const {
  if (!mask.valid()) return nullptr;
  auto it = masks_.find(mask.id);
  return it == masks_.end() ? nullptr : it->second.data();
}

absl::StatusOr<const double*> HostSession::Doubles(ArrayRef a) {
  TC_ASSIGN_OR_RETURN(const Tensor* t, Get(a));
  std::vector<double>& d = doubles_[a.id];
  if (d.empty() && t->numel() > 0) {
    d.resize(static_cast<size_t>(t->numel()));
    ToDouble(*t, d.data());
  }
  return d.data();
}

absl::StatusOr<ArrayRef> HostSession::Upload(const Tensor& t) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  // A view: the caller's tensor outlives the session (the header's
  // contract), and nothing is written to an uploaded array.
  TC_ASSIGN_OR_RETURN(Tensor view, Tensor::Borrow(t.dtype(), t.shape(), t.raw(), t.nbytes(),
                                                  /*owner=*/nullptr));
  view.set_content_id(t.content_id());
  return Adopt(std::move(view));
}

absl::StatusOr<LinearProblem> HostSession::Problem(const SessionOperands& op) const {
  LinearProblem p;
  p.shape() = op.shape();
  TC_ASSIGN_OR_RETURN(p.input, Get(op.input));
  TC_ASSIGN_OR_RETURN(p.weight, Get(op.weight));
  if (op.bias.valid()) {
    TC_ASSIGN_OR_RETURN(p.bias, Get(op.bias));
  }
  if (op.input_scale.valid()) {
    TC_ASSIGN_OR_RETURN(p.input_scale, Get(op.input_scale));
  }
  if (op.weight_scale.valid()) {
    TC_ASSIGN_OR_RETURN(p.weight_scale, Get(op.weight_scale));
  }
  if (op.input_global_scale.valid()) {
    TC_ASSIGN_OR_RETURN(p.input_global_scale, Get(op.input_global_scale));
  }
  if (op.weight_global_scale.valid()) {
    TC_ASSIGN_OR_RETURN(p.weight_global_scale, Get(op.weight_global_scale));
  }
  p.scale_blocks = op.scale_blocks;
  return p;
}

absl::StatusOr<SessionRun> HostSession::Adopted(RunResult run) {
  ++counters_.runs;
  SessionRun out;
  out.output = Adopt(std::move(run.output));
  run.output = Tensor();
  out.run = std::move(run);
  return out;
}

absl::StatusOr<SessionRun> HostSession::Run(const SessionOperands& op, const PreparedRun& prepared,
                                            const RunOptions& options) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  TC_RETURN_IF_ERROR(prepared.status());
  TC_ASSIGN_OR_RETURN(const LinearProblem problem, Problem(op));
  TC_ASSIGN_OR_RETURN(LinearBackend * backend, options_->resolve(prepared.config().backend));
  TC_ASSIGN_OR_RETURN(RunResult run, backend->Run(problem, prepared, options));
  return Adopted(std::move(run));
}

absl::Status HostSession::RunBatch(const SessionOperands& op, const std::vector<PreparedRun>& runs,
                                   const RunOptions& options, const SessionBatchConsumer& consume) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  TC_ASSIGN_OR_RETURN(const LinearProblem problem, Problem(op));
  // One batch per backend, in the order of their first run (so runs[0]
  // comes first).
  std::vector<std::pair<LinearBackend*, std::vector<size_t>>> groups;
  for (size_t i = 0; i < runs.size(); ++i) {
    TC_ASSIGN_OR_RETURN(LinearBackend * backend, options_->resolve(runs[i].config().backend));
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == backend; });
    if (it == groups.end()) {
      groups.push_back({backend, {i}});
    } else {
      it->second.push_back(i);
    }
  }
  for (const auto& group : groups) {
    // Not a structured binding: clang before C++20 cannot capture one in
    // the lambda below (the sanitizer and fuzz builds use clang).
    LinearBackend* backend = group.first;
    const std::vector<size_t>& members = group.second;
    std::vector<PreparedRun> batch;
    batch.reserve(members.size());
    for (size_t i : members) batch.push_back(runs[i]);
    // The consumer's own failure ends the batch with its status, which
    // RunBatch returns; the backend's names its configuration.
    TC_RETURN_IF_ERROR(backend->RunBatch(
        problem, batch, options, [&](size_t index, RunResult result) -> absl::Status {
          TC_ASSIGN_OR_RETURN(SessionRun run, Adopted(std::move(result)));
          return consume(members[index], std::move(run));
        }));
  }
  return absl::OkStatus();
}

absl::StatusOr<SessionMagnitudes> HostSession::MagnitudeSums(const SessionOperands& op,
                                                             bool abs_dot, bool sq_dot, bool dot) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  TC_ASSIGN_OR_RETURN(const LinearProblem problem, Problem(op));
  const int64_t mn = op.m * op.n;
  SessionMagnitudes out;
  ::tensorcheck::MagnitudeSums sums;
  auto make = [&](bool wanted, ArrayRef* ref, float** data) -> absl::Status {
    if (!wanted) return absl::OkStatus();
    TC_ASSIGN_OR_RETURN(Tensor t, Tensor::Create(DType::kFloat32, {mn}));
    *data = t.data<float>();
    *ref = Adopt(std::move(t));
    return absl::OkStatus();
  };
  TC_RETURN_IF_ERROR(make(abs_dot, &out.abs_dot, &sums.abs_dot));
  TC_RETURN_IF_ERROR(make(sq_dot, &out.sq_dot, &sums.sq_dot));
  TC_RETURN_IF_ERROR(make(dot, &out.dot, &sums.dot));
  MagnitudeOperands operands{op.shape(), problem.input, problem.weight, stop_};
  operands.input_scale = problem.input_scale;
  operands.weight_scale = problem.weight_scale;
  std::optional<DequantizedOperands> dequantised;
  if (problem.scale_blocks.block_wise()) {
    // Block-wise scales: the sums of the dequantised operands (fp32,
    // rounded once: the error model's magnitudes, not a result), times
    // NVFP4's per-tensor scales where there are some.
    TC_ASSIGN_OR_RETURN(dequantised, DequantizeOperands(problem, DType::kFloat32));
    operands.input = &dequantised->input;
    operands.weight = &dequantised->weight;
    operands.input_scale = problem.input_global_scale;
    operands.weight_scale = problem.weight_global_scale;
  }
  TC_RETURN_IF_ERROR(ComputeMagnitudeSums(operands, sums));
  return out;
}

absl::StatusOr<SessionModel> HostSession::ErrorModel(const SessionModelSpec& spec) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  ErrorModelInput in = ModelInputOf(spec);
  if (spec.abs_dot.valid()) {
    TC_ASSIGN_OR_RETURN(in.abs_dot, Floats(spec.abs_dot, "abs_dot"));
  }
  if (spec.sq_dot.valid()) {
    TC_ASSIGN_OR_RETURN(in.sq_dot, Floats(spec.sq_dot, "sq_dot"));
  }
  if (spec.pre_bias.valid()) {
    TC_ASSIGN_OR_RETURN(in.pre_bias, Floats(spec.pre_bias, "pre_bias"));
  }
  TC_ASSIGN_OR_RETURN(in.value, Doubles(spec.value));
  in.executor = options_->executor;
  TC_ASSIGN_OR_RETURN(Tensor t, Tensor::Create(DType::kFloat32, {spec.count}));
  float* v = t.data<float>();
  SessionModel m;
  switch (spec.kind) {
    case SessionModelSpec::kSigma:
      m.sum_sq = PredictSigma(in, v);
      break;
    case SessionModelSpec::kPairSigma:
      m.sum_sq = PredictPairSigma(in, v);
      break;
    case SessionModelSpec::kPairAccumulation:
      PredictPairAccumulationSigma(in, v);
      break;
    case SessionModelSpec::kBound:
      HardBound(in, /*c=*/1.0, v);  // Compare applies bound_factor
      break;
  }
  ++counters_.model_arrays;
  m.values = Adopt(std::move(t));
  return m;
}

absl::StatusOr<ArrayRef> HostSession::FlipGrid(const SessionFlipSpec& spec) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  FlipGridInput in = FlipInputOf(spec);
  TC_ASSIGN_OR_RETURN(in.pre_bias, Floats(spec.pre_bias, "pre_bias"));
  if (spec.bias.valid()) {
    TC_ASSIGN_OR_RETURN(in.bias, Doubles(spec.bias));
  }
  in.executor = options_->executor;
  TC_ASSIGN_OR_RETURN(Tensor t, Tensor::Create(DType::kFloat32, {spec.count}));
  ::tensorcheck::FlipGrid(in, t.data<float>());
  return Adopt(std::move(t));
}

absl::StatusOr<DiffStats> HostSession::Compare(ArrayRef actual, ArrayRef expected,
                                               const SessionCompare& compare) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  CompareOptions options = compare.options;
  options.predicted_sigma = nullptr;
  options.error_bound = nullptr;
  if (compare.sigma.valid()) {
    TC_ASSIGN_OR_RETURN(options.predicted_sigma, Floats(compare.sigma, "sigma"));
  }
  if (compare.bound.valid()) {
    TC_ASSIGN_OR_RETURN(options.error_bound, Floats(compare.bound, "bound"));
  }
  TC_ASSIGN_OR_RETURN(const Tensor* a, Get(actual));
  TC_ASSIGN_OR_RETURN(const Tensor* e, Get(expected));
  ++counters_.comparisons;
  return ::tensorcheck::Compare(*a, *e, options);
}

absl::StatusOr<Tensor> HostSession::Download(ArrayRef array) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  TC_ASSIGN_OR_RETURN(const Tensor* a, Get(array));
  ++counters_.downloads;
  counters_.download_bytes += static_cast<int64_t>(a->nbytes());
  Tensor t = a->Clone();
  TC_RETURN_IF_ERROR(t.Reshape({t.numel()}));
  return t;
}

void HostSession::Release(ArrayRef array) {
  if (!array.valid() || static_cast<size_t>(array.id) >= arrays_.size()) return;
  arrays_[static_cast<size_t>(array.id)].reset();
  doubles_.erase(array.id);
  masks_.erase(array.id);
}

absl::StatusOr<bool> HostSession::SameBits(ArrayRef a, ArrayRef b) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  TC_ASSIGN_OR_RETURN(const Tensor* x, Get(a));
  TC_ASSIGN_OR_RETURN(const Tensor* y, Get(b));
  ++counters_.diagnosis_passes;
  return SameBitsPass(*x, *y);
}

absl::StatusOr<ArrayRef> HostSession::NewMask(int64_t count) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  // The array stands for the mask (its id); the bytes live in masks_.
  const ArrayRef ref = Adopt(Tensor());
  masks_[ref.id].assign(static_cast<size_t>(count), 0);
  return ref;
}

absl::StatusOr<int64_t> HostSession::MarkConsistent(ArrayRef mask, ArrayRef observed,
                                                    ArrayRef candidate, ArrayRef pair_sigma,
                                                    DType compared) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  auto m = masks_.find(mask.id);
  if (m == masks_.end()) return absl::InvalidArgumentError("MarkConsistent: not a mask");
  TC_ASSIGN_OR_RETURN(const Tensor* o, Get(observed));
  TC_ASSIGN_OR_RETURN(const Tensor* c, Get(candidate));
  TC_ASSIGN_OR_RETURN(const float* sigma, Floats(pair_sigma, "pair_sigma"));
  ++counters_.diagnosis_passes;
  return MarkConsistentPass(*o, *c, sigma, compared, &m->second);
}

absl::StatusOr<rules::ScoreSums> HostSession::Score(const SessionScoreSpec& spec) {
  TC_ASSIGN_OR_RETURN(std::vector<rules::ScoreSums> sums, ScoreAll({spec}));
  return sums[0];
}

absl::StatusOr<std::vector<rules::ScoreSums>> HostSession::ScoreAll(
    const std::vector<SessionScoreSpec>& specs) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  std::vector<ScorePassInput> inputs;
  for (const SessionScoreSpec& spec : specs) {
    ScorePassInput in;
    TC_ASSIGN_OR_RETURN(in.observed, Get(spec.observed));
    TC_ASSIGN_OR_RETURN(in.candidate, Get(spec.candidate));
    TC_ASSIGN_OR_RETURN(in.pair_sigma, Floats(spec.pair_sigma, "pair_sigma"));
    TC_ASSIGN_OR_RETURN(in.pair_accumulation_sigma,
                        Floats(spec.pair_accumulation_sigma, "pair_accumulation_sigma"));
    if (spec.flip_grid.valid()) {
      TC_ASSIGN_OR_RETURN(in.flip_grid, Floats(spec.flip_grid, "flip_grid"));
    }
    in.mask = MaskData(spec.mask);
    in.compared = spec.compared;
    inputs.push_back(in);
  }
  counters_.diagnosis_passes += static_cast<int64_t>(specs.size());
  std::vector<rules::ScoreSums> sums(inputs.size());
  // One candidate per task, its sums in element order.
  ParallelChunks(
      static_cast<int64_t>(inputs.size()), options_->executor,
      [&](int64_t begin, int64_t end) {
        for (int64_t j = begin; j < end; ++j) {
          sums[static_cast<size_t>(j)] = ScorePass(inputs[static_cast<size_t>(j)]);
        }
      },
      /*min_chunk=*/1);
  return sums;
}

absl::StatusOr<rules::PairedSums> HostSession::Paired(ArrayRef observed, ArrayRef best,
                                                      ArrayRef runner, ArrayRef sigma,
                                                      ArrayRef mask, DType compared) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  TC_ASSIGN_OR_RETURN(const Tensor* o, Get(observed));
  TC_ASSIGN_OR_RETURN(const Tensor* b, Get(best));
  TC_ASSIGN_OR_RETURN(const Tensor* r, Get(runner));
  TC_ASSIGN_OR_RETURN(const float* s, Floats(sigma, "sigma"));
  ++counters_.diagnosis_passes;
  return PairedPass(*o, *b, *r, s, MaskData(mask), compared);
}

absl::StatusOr<DifferingCounts> HostSession::Differing(ArrayRef a, ArrayRef b, ArrayRef mask,
                                                       int64_t cols, DType compared) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  TC_ASSIGN_OR_RETURN(const Tensor* x, Get(a));
  TC_ASSIGN_OR_RETURN(const Tensor* y, Get(b));
  ++counters_.diagnosis_passes;
  return DifferingPass(*x, *y, MaskData(mask), cols, compared);
}

absl::StatusOr<rules::ErrorSums> HostSession::ErrorVsReference(ArrayRef observed,
                                                               ArrayRef reference,
                                                               ArrayRef sigma_vs_reference,
                                                               ArrayRef mask) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  TC_ASSIGN_OR_RETURN(const Tensor* o, Get(observed));
  TC_ASSIGN_OR_RETURN(const Tensor* r, Get(reference));
  TC_ASSIGN_OR_RETURN(const float* s, Floats(sigma_vs_reference, "sigma_vs_reference"));
  ++counters_.diagnosis_passes;
  return ErrorPass(*o, *r, s, MaskData(mask));
}

absl::StatusOr<std::vector<uint8_t>> HostSession::DownloadMask(ArrayRef mask) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  auto m = masks_.find(mask.id);
  if (m == masks_.end()) return absl::InvalidArgumentError("DownloadMask: not a mask");
  ++counters_.downloads;
  counters_.download_bytes += static_cast<int64_t>(m->second.size());
  return m->second;
}

}  // namespace tensorcheck
