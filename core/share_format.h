// Shares as percentages, for every report: the server's explanations and
// the CLI's text, GitHub summary and HTML.
//
//   FormatShare(0.99996831)  // "99.997%"
//   FormatShare(1.0)         // "100%"
//   FormatShare(3, 1024)     // "0.3%"
//
// A share is printed as 100% or 0% only when it is exactly that: a
// bitwise-equal share of 99.997% printed as "100.0%" reads as "all
// elements agree" when 3 in 100,000 do not. One decimal is the default;
// more (up to six) are added only where one would round to 100.0 or 0.0.
//
// Pure functions: thread-safe, no errors.
#pragma once

#include <cstdint>
#include <string>

namespace tensorcheck {

// A fraction in [0, 1] as a percentage: exactly 1 is "100%", exactly 0
// "0%"; anything else has one decimal, or as many more (up to 6) as it takes
// not to read 100.0 or 0.0; beyond six, "<0.000001%" and ">99.999999%".
// NaN is "nan%"; values outside [0, 1] get one decimal.
std::string FormatShare(double fraction);

// `part` of `whole` as a percentage by the same rule, decided on the counts
// (part == whole is "100%", part == 0 is "0%"). An empty whole is "0%".
std::string FormatShare(int64_t part, int64_t whole);

}  // namespace tensorcheck
