// The JSON encodings of docs/json-report.md's values, shared by the
// report (report_json.cc) and the sweep report (sweep_report.cc):
// non-finite floats as "inf"/"-inf"/"nan", an infinite ULP distance as
// "inf", a Group as {index, mismatched, share}, Stats.negligible.
#pragma once

#include <cstdint>
#include <string>

#include "nlohmann/json.hpp"
#include "tensorcheck/v1/tensorcheck.pb.h"

namespace tensorcheck::cli::internal {

nlohmann::ordered_json JsonNumber(double v);
nlohmann::ordered_json JsonUlp(uint64_t v);
nlohmann::ordered_json JsonGroups(
    const google::protobuf::RepeatedPtrField<tensorcheck::v1::Group>& groups);
nlohmann::ordered_json JsonStrings(const google::protobuf::RepeatedPtrField<std::string>& v);
// Stats.negligible as {below, differing, max_abs, significant_max_ulp,
// note}; null when the server left nothing out.
nlohmann::ordered_json NegligibleJson(const tensorcheck::v1::Stats& s);

}  // namespace tensorcheck::cli::internal
