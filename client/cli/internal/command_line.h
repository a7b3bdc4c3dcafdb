// The command line of the tensorcheck CLI: a command, then its flags, each
// checked against the command (`--config` is repeatable; `--name=VALUE`
// and `--name VALUE` both work; `upload` takes FILE[:NAME] arguments). Internal to client/cli.
//
//   TC_ASSIGN_OR_RETURN(CommandLine cl, ParseCommandLine(argc, argv));
//   if (cl.command == "verify" && cl.Has("json")) ...
//
// Errors are INVALID_ARGUMENT usage errors whose message names the flag.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tensorcheck::cli::internal {

// Parsed command line: every flag's values in order of appearance.
struct CommandLine {
  std::string command;
  std::multimap<std::string, std::string> flags;
  // The arguments that are not flags (upload's FILE[:NAME]...).
  std::vector<std::string> args;

  bool Has(const std::string& f) const { return flags.count(f) > 0; }
  // The last value given.
  std::string Get(const std::string& f, const std::string& def = "") const {
    auto range = flags.equal_range(f);
    std::string v = def;
    for (auto it = range.first; it != range.second; ++it) v = it->second;
    return v;
  }
  std::vector<std::string> All(const std::string& f) const {
    std::vector<std::string> out;
    auto range = flags.equal_range(f);
    for (auto it = range.first; it != range.second; ++it) out.push_back(it->second);
    return out;
  }
};

// A usage error: printed with a pointer to --help, exit 2.
absl::Status Usage(absl::string_view msg);

// Parses argv: an unknown command or flag, a flag of another command, or a
// missing or unexpected value is a usage error.
absl::StatusOr<CommandLine> ParseCommandLine(int argc, char** argv);

// The last value of flag `f` as a finite non-negative number (positive when
// `positive`).
absl::StatusOr<double> ParseDoubleFlag(const CommandLine& cl, const std::string& f, bool positive);

// The last value of flag `f` as an integer in [lo, hi].
absl::StatusOr<int64_t> ParseIntFlag(const CommandLine& cl, const std::string& f, int64_t lo,
                                     int64_t hi);

}  // namespace tensorcheck::cli::internal
