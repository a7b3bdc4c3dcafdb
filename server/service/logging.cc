#include "server/service/logging.h"

#include <atomic>

#include "spdlog/sinks/stdout_sinks.h"

namespace tensorcheck {

namespace {
std::atomic<bool> json_logs{false};
}  // namespace

void ConfigureLogging(bool json, spdlog::level::level_enum level) {
  json_logs = json;
  auto logger = spdlog::get("tensorcheck");
  if (!logger) logger = spdlog::stderr_logger_mt("tensorcheck");
  spdlog::set_default_logger(logger);
  if (json) {
    // Each message is the members of one JSON object (see LogEvent).
    spdlog::set_pattern(R"({"time":"%Y-%m-%dT%H:%M:%S.%fZ","level":"%l",%v})",
                        spdlog::pattern_time_type::utc);
  } else {
    spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] %v");
  }
  spdlog::set_level(level);
}

void LogEvent(spdlog::level::level_enum level, const std::string& msg,
              const nlohmann::json& fields) {
  if (!spdlog::should_log(level)) return;
  constexpr auto kReplace = nlohmann::json::error_handler_t::replace;
  if (json_logs) {
    nlohmann::json line = fields;
    line["msg"] = msg;
    std::string dumped = line.dump(-1, ' ', false, kReplace);
    // Strip the braces: the pattern supplies them around time and level.
    spdlog::log(level, "{}", dumped.substr(1, dumped.size() - 2));
    return;
  }
  std::string text = msg;
  for (const auto& [key, value] : fields.items()) {
    text += " " + key + "=" +
            (value.is_string() ? value.get<std::string>() : value.dump(-1, ' ', false, kReplace));
  }
  // Client-supplied strings must not forge extra log lines.
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  spdlog::log(level, "{}", text);
}

}  // namespace tensorcheck
