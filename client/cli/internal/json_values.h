// The JSON encodings of docs/json-report.md's values, shared by the
// report (report_json.cc) and the sweep report (sweep_report.cc):
// non-finite floats as "inf"/"-inf"/"nan", an infinite ULP distance as
// "inf", a Group as {index, mismatched, share}.
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

}  // namespace tensorcheck::cli::internal
