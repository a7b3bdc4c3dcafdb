// `tensorcheck sweep`: every layer call of a captures file checked against
// its weights, one Diagnose (or Verify) each, several in flight
// (internal/commands.h; docs/model-checks.md).
//
// Everything that can be checked from the files is checked before anything
// is sent (internal/sweep_plan.h): a bad file is exit 2 with nothing sent.
// Then the weights (and biases) go into the server's store once each,
// identical ones once (FindMissingTensors first), and every request names
// them by digest; inputs and outputs above kInlineMaxBytes go by digest too.
// --jobs workers take the layer calls in execution order; once the server
// has gone (UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED) no further call is
// started, and those left are reported not_checked.
//
// The results go to RenderSweep (internal/sweep_render.h), which `render`
// (also here) feeds with the results it reads back from a JSON report:
// one renderer for both. With --html the responses keep the outputs the
// page draws, so that the JSON report can draw it again.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "client/cli/html_report.h"
#include "client/cli/internal/commands.h"
#include "client/cli/internal/output_files.h"
#include "client/cli/internal/progress.h"
#include "client/cli/internal/store_client.h"
#include "client/cli/internal/sweep_plan.h"
#include "client/cli/internal/sweep_render.h"
#include "client/cli/internal/sweep_report.h"
#include "client/cli/internal/tensor_transfer.h"
#include "client/cli/internal/verify_request.h"
#include "client/cli/tensor_io.h"
#include "core/executor.h"
#include "core/status_macros.h"
#include "proto/dtype_proto.h"

namespace tensorcheck::cli::internal {
namespace {

constexpr int64_t kMaxJobs = 64;

// The payload under which Call hands a FAILED_PRECONDITION's MissingTensors
// detail (serialized) to its caller.
constexpr absl::string_view kMissingTensorsPayload =
    "type.googleapis.com/tensorcheck.v1.MissingTensors";

// What the files say, checked, before anything is sent.
struct SweepInput {
  std::string captures;
  std::vector<LayerPlan> plans;
  pb::VerifyRequest request_template;
  SweepOptions options;
  int jobs = 4;
};

// The number of non-finite values in `t` and the flat index of the first
// (-1 when all are finite), read from the bits: an all-ones exponent (for
// float8_e4m3fn, which has no infinities, all-ones exponent and mantissa).
std::pair<int64_t, int64_t> CountNonFinite(const Tensor& t) {
  int64_t count = 0, first = -1;
  auto scan = [&](auto bits_of, auto exp_mask) {
    for (int64_t i = 0; i < t.numel(); ++i) {
      if ((bits_of(i) & exp_mask) == exp_mask) {
        if (first < 0) first = i;
        ++count;
      }
    }
  };
  switch (t.dtype()) {
    case DType::kFloat64:
      scan([&](int64_t i) { return t.data<uint64_t>()[i]; }, uint64_t{0x7ff0000000000000});
      break;
    case DType::kFloat32:
      scan([&](int64_t i) { return t.data<uint32_t>()[i]; }, uint32_t{0x7f800000});
      break;
    case DType::kFloat16:
      scan([&](int64_t i) { return t.data<uint16_t>()[i]; }, uint16_t{0x7c00});
      break;
    case DType::kBFloat16:
      scan([&](int64_t i) { return t.data<uint16_t>()[i]; }, uint16_t{0x7f80});
      break;
    case DType::kFloat8E4M3Fn:
      // No infinities: only S.1111.111 is NaN, the rest of that exponent is finite.
      scan([&](int64_t i) { return t.data<uint8_t>()[i]; }, uint8_t{0x7f});
      break;
    case DType::kFloat8E5M2:
      scan([&](int64_t i) { return t.data<uint8_t>()[i]; }, uint8_t{0x7c});
      break;
    case DType::kFloat4E2M1Fn:  // no infinities or NaN
      break;
    case DType::kFloat8E8M0Fnu:  // 0xff is NaN
      scan([&](int64_t i) { return t.data<uint8_t>()[i]; }, uint8_t{0xff});
      break;
  }
  return {count, first};
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(flag, " ", path, ": cannot be read"));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

absl::StatusOr<SweepInput> PrepareSweep(const CommandLine& cl) {
  if (!cl.Has("captures")) return Usage("--captures FILE is required");
  if (!cl.Has("weights")) {
    return Usage(
        "--weights FILE is required (repeatable; give the captures file too when it holds the "
        "weights)");
  }
  SweepInput in;
  TC_ASSIGN_OR_RETURN(in.request_template, BuildRequestOptions(cl, "--config"));
  // The whole-model question is "more than its precision explains": every
  // element within its output precision's error bound (docs/model-checks.md).
  // torch's rtol would fail every layer that adds its bias after rounding
  // where x W and b cancel.
  if (!cl.Has("tolerance") && !cl.Has("max-ulp") && !cl.Has("atol") && !cl.Has("rtol")) {
    in.request_template.mutable_tolerance()->set_preset(pb::Tolerance::PRESET_BOUND);
  }
  in.options.diagnose = !cl.Has("no-diagnose");
  if (cl.Has("bound-threshold")) {
    TC_ASSIGN_OR_RETURN(in.options.bound_threshold,
                        ParseDoubleFlag(cl, "bound-threshold", /*positive=*/true));
    in.request_template.mutable_bound_threshold()->set_value(*in.options.bound_threshold);
  }
  if (cl.Has("jobs")) {
    TC_ASSIGN_OR_RETURN(int64_t jobs, ParseIntFlag(cl, "jobs", 1, kMaxJobs));
    in.jobs = static_cast<int>(jobs);
  }
  std::map<std::string, std::string> layer_map;
  if (cl.Has("map")) {
    TC_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(cl.Get("map"), "--map"));
    TC_ASSIGN_OR_RETURN(layer_map, ParseLayerMap(text, cl.Get("map")));
  }

  in.captures = cl.Get("captures");
  TC_ASSIGN_OR_RETURN(SafetensorsIndex captures, ReadSafetensorsIndex(in.captures));
  TC_ASSIGN_OR_RETURN(std::vector<CapturedCall> calls, PlanCaptures(captures, in.captures));
  std::vector<std::pair<std::string, SafetensorsIndex>> files;
  for (const std::string& w : cl.All("weights")) {
    if (std::any_of(files.begin(), files.end(), [&](const auto& f) { return f.first == w; })) {
      continue;  // the same file twice is the same tensors
    }
    TC_ASSIGN_OR_RETURN(SafetensorsIndex index, ReadSafetensorsIndex(w));
    files.emplace_back(w, std::move(index));
  }
  TC_ASSIGN_OR_RETURN(WeightIndex weights, WeightIndex::Build(files));
  TC_RETURN_IF_ERROR(CheckWeightsFilesUsed(files, calls, layer_map));
  for (const CapturedCall& c : calls) {
    TC_ASSIGN_OR_RETURN(LayerPlan p, ResolveLayer(c, in.captures, weights, layer_map));
    in.plans.push_back(std::move(p));
  }
  // A captured output must be finite: a NaN or infinity there is a broken
  // capture (or a model already broken upstream), not a question of which
  // configuration ran, and it would be reported far from its cause.
  for (const LayerPlan& p : in.plans) {
    TC_ASSIGN_OR_RETURN(Tensor y, ReadSafetensorsFile(in.captures, p.call.output.name));
    const auto [count, first] = CountNonFinite(y);
    if (count > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer '", p.call.name.Full(), "' (", in.captures, "): '", p.call.output.name, "' holds ",
          count, " non-finite value", count == 1 ? "" : "s", " (the first at flat index ", first,
          "); a captured output must be finite"));
    }
  }
  return in;
}

// A view of a shared tensor (no copy), for a Blob.
Tensor ViewOf(const std::shared_ptr<const Tensor>& t) {
  auto v = Tensor::Borrow(t->dtype(), t->shape(), t->raw(), t->nbytes(), t);
  return *std::move(v);  // the same dtype, shape and size: cannot fail
}

void SetMeta(const Tensor& t, pb::Tensor* out) {
  out->set_dtype(DTypeToProto(t.dtype()));
  out->clear_shape();
  for (int64_t d : t.shape()) out->add_shape(d);
}

bool ServerGone(absl::StatusCode c) {
  return c == absl::StatusCode::kUnavailable || c == absl::StatusCode::kDeadlineExceeded ||
         c == absl::StatusCode::kCancelled;
}

// The sweep's RPCs; shared by the workers (StoreClient and the stub are
// thread-safe; the counters are guarded).
class SweepRunner {
 public:
  SweepRunner(const SweepInput& in, pb::TensorCheck::Stub* stub,
              std::chrono::system_clock::time_point deadline, bool html)
      : in_(in), stub_(stub), deadline_(deadline), store_(stub, deadline), html_(html) {}

  // Puts every weight and bias into the store (or finds there is none).
  // An error means nothing could be checked.
  absl::Status UploadWeights(Executor* executor, Progress* progress);

  // Checks layer call `i` into `out`; false when the server has gone.
  bool RunLayer(size_t i, LayerResult* out);

  // Assigns the weights' bytes to the layer calls that named them: the
  // first (in execution order) of an uploaded one counts it as uploaded.
  void AttributeWeights(std::vector<LayerResult>& layers) const;

  SweepCounts counts() const {
    std::lock_guard<std::mutex> lock(mu_);
    return counts_;
  }

 private:
  struct Weight {
    Blob blob;
    std::shared_ptr<const Tensor> tensor;
    bool uploaded = false;  // by this run
  };

  absl::StatusOr<pb::VerifyResponse> Call(const pb::VerifyRequest& req);
  // Counts a tensor named by digest once per sweep.
  void Count(const pb::TensorDigest& d, bool uploaded);

  const SweepInput& in_;
  pb::TensorCheck::Stub* stub_;
  std::chrono::system_clock::time_point deadline_;
  StoreClient store_;
  const bool html_;
  bool by_digest_ = false;
  std::vector<Weight> weights_;
  std::map<std::string, size_t> weight_of_;  // "file:name" -> weights_ index
  mutable std::mutex mu_;
  SweepCounts counts_;  // guarded by mu_
  // Each digest counted so far: true once uploaded, false while only reused.
  std::map<std::string, bool> counted_;  // guarded by mu_
  // Per layer call, the weights it uploaded again after an eviction.
  std::map<size_t, std::set<std::string>> reuploaded_;  // guarded by mu_
};

void SweepRunner::Count(const pb::TensorDigest& d, bool uploaded) {
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, first] = counted_.emplace(d.hash(), uploaded);
  if (uploaded) {
    // Every upload counts; one counted as held before was evicted since.
    counts_.uploaded_bytes += d.size_bytes();
    if (!first && !it->second) counts_.reused_bytes -= d.size_bytes();
    it->second = true;
  } else if (first) {
    counts_.reused_bytes += d.size_bytes();
  }
}

absl::Status SweepRunner::UploadWeights(Executor* executor, Progress* progress) {
  for (const LayerPlan& p : in_.plans) {
    for (const WeightSource* w : {&p.weight, p.bias ? &*p.bias : nullptr}) {
      if (w == nullptr || weight_of_.count(w->Label()) > 0) continue;
      TC_ASSIGN_OR_RETURN(Tensor t, ReadSafetensorsFile(w->file, w->info.name));
      Weight weight;
      weight.tensor = std::make_shared<const Tensor>(std::move(t));
      weight.blob.label = w->Label();
      weight.blob.field = &p.weight == w ? "op.weight" : "op.bias";
      weight.blob.data = ViewOf(weight.tensor);
      weight_of_[w->Label()] = weights_.size();
      weights_.push_back(std::move(weight));
    }
  }
  std::vector<Blob> blobs;
  for (Weight& w : weights_) blobs.push_back(std::move(w.blob));
  HashBlobs(blobs, executor, progress);
  for (size_t i = 0; i < blobs.size(); ++i) weights_[i].blob = std::move(blobs[i]);

  std::vector<pb::TensorDigest> digests;
  for (const Weight& w : weights_) digests.push_back(w.blob.digest);
  auto missing = store_.FindMissing(digests);
  if (absl::IsUnimplemented(missing.status())) return absl::OkStatus();  // inline
  if (!missing.ok()) return missing.status();
  by_digest_ = true;
  std::set<std::string> absent;
  for (const pb::TensorDigest& d : *missing) absent.insert(d.hash());
  std::vector<Blob*> upload;
  std::set<std::string> seen;
  for (Weight& w : weights_) {
    if (!seen.insert(w.blob.digest.hash()).second) continue;  // tied weights: once
    if (absent.count(w.blob.digest.hash()) > 0) {
      upload.push_back(&w.blob);
      w.uploaded = true;
    }
  }
  TransferCounts counts;
  TC_RETURN_IF_ERROR(UploadBlobs(upload, &store_, executor, progress, &counts));
  for (const Weight& w : weights_) Count(w.blob.digest, w.uploaded);
  return absl::OkStatus();
}

absl::StatusOr<pb::VerifyResponse> SweepRunner::Call(const pb::VerifyRequest& req) {
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline_);
  pb::VerifyResponse resp;
  const grpc::Status s =
      in_.options.diagnose ? stub_->Diagnose(&ctx, req, &resp) : stub_->Verify(&ctx, req, &resp);
  if (!s.ok()) {
    absl::Status status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
    if (std::optional<pb::MissingTensors> m = MissingTensorsOf(s); m.has_value()) {
      std::string detail;
      m->SerializeToString(&detail);
      status.SetPayload(kMissingTensorsPayload, absl::Cord(detail));
    }
    return status;
  }
  return resp;
}

bool SweepRunner::RunLayer(size_t i, LayerResult* out) {
  const LayerPlan& p = in_.plans[i];
  Progress quiet(/*enabled=*/false);
  auto fail = [&](const absl::Status& s, absl::string_view what) {
    out->rpc = LayerRpc::kError;
    out->error_code = static_cast<int>(s.code());
    out->error = absl::StrCat(what, " (", absl::StatusCodeToString(s.code()), "): ", s.message());
    return !ServerGone(s.code());
  };
  auto x = ReadSafetensorsFile(in_.captures, p.call.input.name);
  if (!x.ok()) return fail(x.status(), "reading the input");
  auto y = ReadSafetensorsFile(in_.captures, p.call.output.name);
  if (!y.ok()) return fail(y.status(), "reading the output");
  const auto input = std::make_shared<const Tensor>(*std::move(x));
  const auto output = std::make_shared<const Tensor>(*std::move(y));

  pb::VerifyRequest req = in_.request_template;
  pb::LinearOp* op = req.mutable_op();
  op->set_weight_layout(p.in_out ? pb::WEIGHT_LAYOUT_IN_OUT : pb::WEIGHT_LAYOUT_OUT_IN);
  std::vector<Blob*> named;  // what goes by digest, for a retry after eviction
  std::vector<Blob> io;      // this call's own tensors by digest
  auto put = [&](const std::shared_ptr<const Tensor>& t, const char* field, pb::Tensor* dst) {
    SetMeta(*t, dst);
    if (by_digest_ && static_cast<int64_t>(t->nbytes()) > kInlineMaxBytes) {
      Blob b;
      b.label = absl::StrCat(in_.captures, ":",
                             dst == op->mutable_input() ? p.call.input.name : p.call.output.name);
      b.field = field;
      b.data = ViewOf(t);
      b.tensor = dst;
      io.push_back(std::move(b));
    } else {
      dst->set_data(t->bytes().data(), t->bytes().size());
    }
  };
  put(input, "op.input", op->mutable_input());
  put(output, "observed", req.mutable_observed());
  for (const WeightSource* w : {&p.weight, p.bias ? &*p.bias : nullptr}) {
    if (w == nullptr) continue;
    Weight& weight = weights_[weight_of_.at(w->Label())];
    pb::Tensor* dst = w == &p.weight ? op->mutable_weight() : op->mutable_bias();
    SetMeta(*weight.tensor, dst);
    if (by_digest_) {
      dst->set_digest(weight.blob.digest.hash());
      named.push_back(&weight.blob);
    } else {
      dst->set_data(weight.tensor->bytes().data(), weight.tensor->bytes().size());
    }
  }
  if (!io.empty()) {
    HashBlobs(io, /*executor=*/nullptr, &quiet);
    std::vector<pb::TensorDigest> digests;
    for (const Blob& b : io) digests.push_back(b.digest);
    auto missing = store_.FindMissing(digests);
    if (!missing.ok()) return fail(missing.status(), "FindMissingTensors");
    std::set<std::string> absent;
    for (const pb::TensorDigest& d : *missing) absent.insert(d.hash());
    for (Blob& b : io) {
      bool uploaded = false;
      if (absent.erase(b.digest.hash()) > 0) {  // the same bytes twice: once
        // One at a time, to know of each whether another call stored it
        // meanwhile (already_present: then it counts as reused).
        TransferCounts counts;
        const absl::Status s = UploadBlobs({&b}, &store_, /*executor=*/nullptr, &quiet, &counts);
        if (!s.ok()) return fail(s, "uploading");
        uploaded = counts.uploaded_bytes > 0;
      }
      (uploaded ? out->uploaded_bytes : out->reused_bytes) += b.digest.size_bytes();
      Count(b.digest, uploaded);
      b.tensor->set_digest(b.digest.hash());
      named.push_back(&b);
    }
  }

  auto resp = Call(req);
  if (!resp.ok() && by_digest_) {
    // Evicted since it was uploaded: upload what the server lacks, once.
    auto payload = resp.status().GetPayload(kMissingTensorsPayload);
    pb::MissingTensors m;
    if (payload.has_value() && m.ParseFromString(std::string(*payload))) {
      std::vector<Blob*> again;
      for (const pb::TensorDigest& d : m.digests()) {
        for (Blob* b : named) {
          if (b->digest.hash() == d.hash() &&
              std::find(again.begin(), again.end(), b) == again.end()) {
            again.push_back(b);
          }
        }
      }
      TransferCounts counts;
      const absl::Status s = UploadBlobs(again, &store_, /*executor=*/nullptr, &quiet, &counts);
      if (!s.ok()) return fail(s, "uploading again");
      for (const Blob* b : again) {
        Count(b->digest, /*uploaded=*/true);
        const bool own =
            std::any_of(io.begin(), io.end(), [&](const Blob& mine) { return &mine == b; });
        if (own) {
          out->uploaded_bytes += b->digest.size_bytes();
        } else {
          std::lock_guard<std::mutex> lock(mu_);
          reuploaded_[i].insert(b->digest.hash());  // AttributeWeights counts it
        }
      }
      resp = Call(req);
    }
  }
  if (!resp.ok()) {
    return fail(resp.status(), in_.options.diagnose ? "server: Diagnose" : "server: Verify");
  }
  out->rpc = LayerRpc::kOk;
  out->response = *std::move(resp);
  if (html_) {
    // The page's heatmaps draw the reference's output and the best
    // candidate's: those stay in the response (and so in the JSON report,
    // which `tensorcheck render --html` draws the same page from), the
    // rest go.
    KeepDrawnOutputs(&out->response, ReportContext{in_.options.diagnose ? "diagnose" : "verify"},
                     /*has_observed=*/true);
    const absl::Status read = ReadOutputsByDigest(&out->response, &store_, &quiet);
    if (!read.ok()) {
      std::cerr << "tensorcheck: warning: " << p.call.name.Full() << ": " << read.message() << "\n";
    }
  }
  return true;
}

void SweepRunner::AttributeWeights(std::vector<LayerResult>& layers) const {
  if (!by_digest_) return;
  std::lock_guard<std::mutex> lock(mu_);
  std::set<std::string> attributed;
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i].rpc != LayerRpc::kOk) continue;
    const LayerPlan& p = in_.plans[i];
    for (const WeightSource* w : {&p.weight, p.bias ? &*p.bias : nullptr}) {
      if (w == nullptr) continue;
      const Weight& weight = weights_[weight_of_.at(w->Label())];
      const std::string& hash = weight.blob.digest.hash();
      const bool first = attributed.insert(hash).second;
      auto again = reuploaded_.find(i);
      const bool uploaded = (weight.uploaded && first) ||
                            (again != reuploaded_.end() && again->second.count(hash) > 0);
      (uploaded ? layers[i].uploaded_bytes : layers[i].reused_bytes) +=
          weight.blob.digest.size_bytes();
    }
  }
}

// The outputs `sweep` and `render` share: --json, --junit, --html,
// --github.
SweepRenderRequest RenderRequestFromFlags(const CommandLine& cl, bool text) {
  SweepRenderRequest want;
  want.text = text;
  want.json = cl.Has("json");
  want.junit = cl.Has("junit");
  want.html = cl.Has("html");
  want.github = cl.Has("github");
  return want;
}

// Renders the report (RenderSweep, the one renderer) and writes it: the
// table or the JSON on stdout, the annotations on stdout (stderr beside
// the JSON), the Markdown summary appended to $GITHUB_STEP_SUMMARY, the
// --junit and --html files. Returns SweepExitCode, or kExitUsage when a
// file could not be written (and everything passed) or the rendering
// failed (a bad --captures file).
int WriteSweepReports(SweepReport report, const SweepRenderRequest& want, const CommandLine& cl,
                      absl::string_view command) {
  auto rendered = RenderSweep(std::move(report), want);
  if (!rendered.ok()) {
    std::cerr << "tensorcheck: " << command << ": " << rendered.status().message() << "\n";
    return kExitUsage;
  }
  std::cout << rendered->stdout_text;
  int code = rendered->exit_code;
  if (want.github) {
    (want.json ? std::cerr : std::cout) << rendered->github_annotations;
    if (const char* file = std::getenv("GITHUB_STEP_SUMMARY"); file != nullptr && file[0] != '\0') {
      const absl::Status w = WriteTextFile(file, rendered->github_summary, /*append=*/true);
      if (!w.ok()) std::cerr << "tensorcheck: warning: " << w.message() << "\n";
    }
  }
  absl::Status files;
  if (want.junit) files.Update(WriteTextFile(cl.Get("junit"), rendered->junit, /*append=*/false));
  if (want.html) files.Update(WriteTextFile(cl.Get("html"), rendered->html, /*append=*/false));
  if (!files.ok()) {
    std::cerr << "tensorcheck: " << files.message() << "\n";
    if (code == kExitPass) code = kExitUsage;
  }
  return code;
}

}  // namespace

int RunSweep(const CommandLine& cl, const Connection& server, double timeout) {
  auto in = PrepareSweep(cl);
  if (!in.ok()) {
    std::cerr << "tensorcheck: sweep: " << in.status().message() << "\n";
    if (absl::string_view(in.status().message()).rfind("--", 0) == 0) {
      std::cerr << "(see tensorcheck sweep --help)\n";
    }
    return kExitUsage;
  }
  std::vector<LayerResult> layers(in->plans.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerPlan& p = in->plans[i];
    layers[i].layer = p.call.name.layer;
    layers[i].call = p.call.name.call;
    layers[i].input_shape = p.call.input.shape;
    layers[i].weight_shape = p.weight.info.shape;
    layers[i].in_out = p.in_out;
    layers[i].dtype = p.dtype;
  }

  auto stub = MakeStub(server);
  Progress progress(ProgressWanted(cl));
  std::unique_ptr<Executor> transfer = TransferExecutor();
  SweepRunner runner(*in, stub.get(), DeadlineAfter(timeout), cl.Has("html"));
  absl::Status fatal = runner.UploadWeights(transfer.get(), &progress);
  if (!fatal.ok()) {
    ReportStatus(fatal, server);
  } else {
    auto jobs = Executor::Create({/*threads=*/in->jobs});
    std::atomic<size_t> next{0};
    std::atomic<bool> gone{false};
    progress.BeginCount("layers", static_cast<int64_t>(layers.size()));
    auto work = [&](int64_t) {
      for (size_t i = next++; i < layers.size(); i = next++) {
        if (gone.load()) continue;  // left not_checked
        if (!runner.RunLayer(i, &layers[i])) gone.store(true);
        progress.Advance(1);
      }
    };
    ParallelFor(jobs.ok() ? jobs->get() : nullptr, in->jobs, work);
    progress.End();
    if (gone.load()) {
      for (const LayerResult& l : layers) {
        if (l.rpc == LayerRpc::kError && ServerGone(static_cast<absl::StatusCode>(l.error_code))) {
          ReportError(static_cast<grpc::StatusCode>(l.error_code),
                      absl::StrCat(l.FullName(), ": ", l.error), server);
          break;
        }
      }
    }
  }
  runner.AttributeWeights(layers);

  SweepRenderRequest want = RenderRequestFromFlags(cl, /*text=*/!cl.Has("json"));
  want.captures = in->captures;
  const int code = WriteSweepReports(SweepReport{std::move(layers), runner.counts(), in->options},
                                     want, cl, "sweep");
  // Nothing was checked: the failure that stopped it says how it ended.
  return fatal.ok() ? code : ExitCodeForGrpc(static_cast<grpc::StatusCode>(fatal.code()));
}

int RunRender(const CommandLine& cl) {
  auto fail = [](absl::string_view message) {
    std::cerr << "tensorcheck: render: " << message << "\n";
    if (message.rfind("--", 0) == 0 || message.rfind("REPORT.json ", 0) == 0) {
      std::cerr << "(see tensorcheck render --help)\n";
    }
    return kExitUsage;
  };
  if (cl.args.size() != 1) {
    return fail(absl::StrCat("REPORT.json (a file, or - for stdin) expected once, got ",
                             cl.args.size(), " arguments"));
  }
  if (cl.Has("text") && cl.Has("json")) {
    return fail("--text and --json both print to stdout: give one");
  }
  const std::string path = cl.args[0];
  std::ostringstream text;
  if (path == "-") {
    text << std::cin.rdbuf();
  } else {
    std::ifstream in(path, std::ios::binary);
    if (!in) return fail(absl::StrCat(path, ": cannot be read"));
    text << in.rdbuf();
  }
  auto report = ParseSweepReport(text.str());
  if (!report.ok()) return fail(absl::StrCat(path, ": ", report.status().message()));
  // Without an output flag, the table, as `sweep` prints it.
  const bool any =
      cl.Has("text") || cl.Has("json") || cl.Has("junit") || cl.Has("html") || cl.Has("github");
  SweepRenderRequest want = RenderRequestFromFlags(cl, /*text=*/cl.Has("text") || !any);
  want.captures = cl.Get("captures");
  if (cl.Has("captures") && want.captures.empty()) return fail("--captures: a file expected");
  if (cl.Has("captures") && !want.html) return fail("--captures is for --html's heatmaps");
  return WriteSweepReports(*std::move(report), want, cl, "render");
}

}  // namespace tensorcheck::cli::internal
