#include "server/engine/kernel_orders.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace tensorcheck {

namespace {

constexpr std::pair<absl::string_view, TensorCoreGpu> kGpuNames[] = {
    {"a100", TensorCoreGpu::kSm80},   {"h100", TensorCoreGpu::kSm90},
    {"h200", TensorCoreGpu::kSm90},   {"gh200", TensorCoreGpu::kSm90},
    {"b200", TensorCoreGpu::kSm100},  {"gb200", TensorCoreGpu::kSm100},
    {"sm80", TensorCoreGpu::kSm80},   {"sm90", TensorCoreGpu::kSm90},
    {"sm100", TensorCoreGpu::kSm100},
};

// The precision whose records a candidate's replay reads: the TF32
// roundings share TF32's (the GPU rounds as it does; the candidates
// differ in how the CPU rounds the inputs).
Precision RecordPrecision(Precision p) {
  return p == Precision::kTf32Rna || p == Precision::kTf32Trunc ? Precision::kTf32 : p;
}

}  // namespace

absl::StatusOr<TensorCoreGpu> ParseGpuName(absl::string_view name, absl::string_view field) {
  const std::string lower = absl::AsciiStrToLower(name);
  for (const auto& [known, gpu] : kGpuNames) {
    if (lower == known) return gpu;
  }
  std::string names;
  for (const auto& entry : kGpuNames)
    absl::StrAppend(&names, names.empty() ? "" : ", ", entry.first);
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": unknown GPU '", name, "'; expected one of ", names));
}

absl::StatusOr<KernelOrderTable> ParseKernelOrderTable(absl::string_view json,
                                                       absl::string_view source) {
  auto error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("kernel orders ", source, ": ", what));
  };
  const nlohmann::json doc = nlohmann::json::parse(json.begin(), json.end(), nullptr,
                                                   /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return error("not a JSON object");
  auto string_of = [&](const nlohmann::json& o, const char* key) -> absl::StatusOr<std::string> {
    auto it = o.find(key);
    if (it == o.end() || !it->is_string())
      return error(absl::StrCat("'", key, "': a string expected"));
    return it->get<std::string>();
  };
  KernelOrderTable table;
  TC_ASSIGN_OR_RETURN(const std::string gpu, string_of(doc, "gpu"));
  absl::StatusOr<TensorCoreGpu> generation = ParseTensorCoreGpu(gpu, "gpu");
  if (!generation.ok()) return error(generation.status().message());
  table.gpu = *generation;
  TC_ASSIGN_OR_RETURN(table.device, string_of(doc, "device"));
  TC_ASSIGN_OR_RETURN(table.recorded, string_of(doc, "recorded"));
  auto kernels = doc.find("kernels");
  if (kernels == doc.end() || !kernels->is_array()) return error("'kernels': an array expected");
  for (size_t i = 0; i < kernels->size(); ++i) {
    const nlohmann::json& entry = (*kernels)[i];
    const std::string at = absl::StrCat("kernels[", i, "]");
    if (!entry.is_object()) return error(absl::StrCat(at, ": an object expected"));
    RecordedKernel kernel;
    TC_ASSIGN_OR_RETURN(const std::string precision, string_of(entry, "precision"));
    absl::StatusOr<Precision> p = ParsePrecision(precision);
    if (!p.ok()) return error(absl::StrCat(at, ".precision: ", p.status().message()));
    kernel.precision = *p;
    for (auto [key, value] :
         {std::pair<const char*, int64_t*>{"m", &kernel.m}, {"n", &kernel.n}, {"k", &kernel.k}}) {
      auto it = entry.find(key);
      if (it == entry.end() || !it->is_number_integer() || it->get<int64_t>() < 1) {
        return error(absl::StrCat(at, ".", key, ": a positive integer expected"));
      }
      *value = it->get<int64_t>();
    }
    TC_ASSIGN_OR_RETURN(kernel.options, string_of(entry, "options"));
    // The options must make a replay of this generation for the precision.
    absl::StatusOr<ConfigSpec> spec =
        ParseConfigSpec(absl::StrCat("cpu:", PrecisionName(kernel.precision), "@", kernel.options),
                        absl::StrCat(at, ".options"));
    if (!spec.ok()) return error(spec.status().message());
    if (spec->mma != table.gpu) {
      return error(absl::StrCat(at, ".options: mma=", TensorCoreGpuName(table.gpu),
                                " expected (the table's gpu), got '", kernel.options, "'"));
    }
    table.kernels.push_back(std::move(kernel));
  }
  return table;
}

absl::StatusOr<std::vector<KernelOrderTable>> LoadKernelOrderTables(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("kernel orders: '", dir, "' is not a readable directory"));
  }
  std::vector<fs::path> files;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".json") files.push_back(e.path());
  }
  if (ec)
    return absl::InvalidArgumentError(absl::StrCat("kernel orders: ", dir, ": ", ec.message()));
  std::sort(files.begin(), files.end());
  std::vector<KernelOrderTable> tables;
  for (const fs::path& f : files) {
    std::ifstream in(f);
    std::stringstream text;
    text << in.rdbuf();
    if (!in)
      return absl::InvalidArgumentError(absl::StrCat("kernel orders: cannot read ", f.string()));
    TC_ASSIGN_OR_RETURN(KernelOrderTable t, ParseKernelOrderTable(text.str(), f.string()));
    tables.push_back(std::move(t));
  }
  return tables;
}

ReplayOrder ReplayOrderFor(const std::vector<KernelOrderTable>& tables, TensorCoreGpu gpu,
                           Precision precision, int64_t m, int64_t n, int64_t k) {
  const Precision wanted = RecordPrecision(precision);
  for (const KernelOrderTable& t : tables) {
    if (t.gpu != gpu) continue;
    for (const RecordedKernel& kernel : t.kernels) {
      if (RecordPrecision(kernel.precision) == wanted && kernel.m == m && kernel.n == n &&
          kernel.k == k) {
        return {kernel.options, absl::StrCat("the kernel cuBLASLt's heuristic picked on ", t.device,
                                             " (recorded ", t.recorded, ")")};
      }
    }
  }
  return {absl::StrCat("mma=", TensorCoreGpuName(gpu)),
          absl::StrCat("no kernel recorded for this layer on ", TensorCoreGpuName(gpu),
                       ": the generation's model, blocks from k = 0, no split")};
}

}  // namespace tensorcheck
