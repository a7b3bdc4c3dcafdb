// One logging entry point for the server, in text or JSON lines.
//
//   ConfigureLogging(/*json=*/true, spdlog::level::info);
//   LogEvent(spdlog::level::info, "listening", {{"address", "0.0.0.0:50051"}});
//   // {"time":"...","level":"info","msg":"listening","address":"0.0.0.0:50051"}
//   // text: [time] [info] listening address=0.0.0.0:50051
#pragma once

#include <string>

#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace tensorcheck {

// Logs go to stderr (stdout is reserved for the "listening on" line).
void ConfigureLogging(bool json, spdlog::level::level_enum level);

// One line: a message and structured fields.
void LogEvent(spdlog::level::level_enum level, const std::string& msg,
              const nlohmann::json& fields = nlohmann::json::object());

}  // namespace tensorcheck
