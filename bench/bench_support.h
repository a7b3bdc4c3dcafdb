// What the C++ benchmarks share: `--name=value` flags and the process's
// peak resident memory.
//
//   const int64_t m = FlagValue(argc, argv, "m", 1921);
//   const char* dtype = FlagText(argc, argv, "dtype", "bf16");
//   const int64_t peak = VmHwmBytes();
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

namespace tensorcheck::bench {

// The text after `--name=`, or `fallback`.
inline const char* FlagText(int argc, char** argv, const char* name, const char* fallback) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) {
      return argv[i] + prefix.size();
    }
  }
  return fallback;
}

inline int64_t FlagValue(int argc, char** argv, const char* name, int64_t fallback) {
  const char* text = FlagText(argc, argv, name, nullptr);
  return text == nullptr ? fallback : std::atoll(text);
}

// Peak resident memory of this process (VmHWM), in bytes; -1 off Linux.
inline int64_t VmHwmBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  }
  return -1;
}

}  // namespace tensorcheck::bench
