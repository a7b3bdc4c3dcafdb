// The progress line on stderr (internal/progress.h).
#include "client/cli/internal/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tensorcheck::cli::internal {
namespace {

// A phase shorter than this never draws.
constexpr auto kQuiet = std::chrono::milliseconds(500);
constexpr auto kRedraw = std::chrono::milliseconds(200);
constexpr int kBarWidth = 24;

std::string Bytes(double b) {
  if (b >= 1e9) return absl::StrFormat("%.2f GB", b / 1e9);
  if (b >= 1e6) return absl::StrFormat("%.1f MB", b / 1e6);
  if (b >= 1e3) return absl::StrFormat("%.1f kB", b / 1e3);
  return absl::StrFormat("%.0f B", b);
}

}  // namespace

bool StderrIsTerminal() { return isatty(STDERR_FILENO) == 1; }

Progress::Progress(bool enabled) : enabled_(enabled) {
  if (enabled_) thread_ = std::thread([this] { Loop(); });
}

Progress::~Progress() {
  if (!enabled_) return;
  End();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Progress::Begin(std::string label, int64_t total_bytes) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  label_ = std::move(label);
  total_ = total_bytes;
  count_ = false;
  done_.store(0, std::memory_order_relaxed);
  start_ = std::chrono::steady_clock::now();
  active_ = true;
}

void Progress::BeginCount(std::string label, int64_t total_items) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  label_ = std::move(label);
  total_ = total_items;
  count_ = true;
  done_.store(0, std::memory_order_relaxed);
  start_ = std::chrono::steady_clock::now();
  active_ = true;
}

void Progress::Update(std::string label, int64_t done, int64_t total) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!active_) return;  // the phase ended first
  label_ = std::move(label);
  total_ = total;
  count_ = total > 0;
  done_.store(done, std::memory_order_relaxed);
  // Drawn now, not at the next redraw: what the server said is on the
  // line before the next question.
  if (std::chrono::steady_clock::now() - start_ >= kQuiet) DrawLocked();
}

void Progress::End() {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (drawn_) {
    std::fputs("\r\033[K", stderr);
    std::fflush(stderr);
  }
  drawn_ = false;
  last_line_.clear();
  active_ = false;
}

void Progress::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, kRedraw);
    if (!stop_ && active_ && std::chrono::steady_clock::now() - start_ >= kQuiet) DrawLocked();
  }
}

std::string ProgressLine(absl::string_view label, int64_t done, int64_t total, bool count,
                         double seconds) {
  std::string line = absl::StrCat(label, " ");
  if (count) {
    absl::StrAppend(&line, std::min(done, total), "/", total);
  } else if (total > 0) {
    done = std::min(done, total);
    const double frac = static_cast<double>(done) / static_cast<double>(total);
    const int filled = static_cast<int>(frac * kBarWidth);
    absl::StrAppend(&line, "[", std::string(filled, '#'), std::string(kBarWidth - filled, '.'),
                    "] ", absl::StrFormat("%3.0f%% ", 100 * frac), Bytes(done), " / ",
                    Bytes(total));
    if (seconds > 0) absl::StrAppend(&line, "  ", Bytes(done / seconds), "/s");
    absl::StrAppend(&line, ", ");
  }
  // Every phase says how long it has lasted.
  absl::StrAppend(&line, count ? ", " : "", absl::StrFormat("%.0f s", seconds));
  return line;
}

void Progress::DrawLocked() {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::string line = absl::StrCat(
      "\r", ProgressLine(label_, done_.load(std::memory_order_relaxed), total_, count_, seconds),
      "\033[K");
  if (drawn_ && line == last_line_) return;  // nothing new to show
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
  drawn_ = true;
  last_line_ = std::move(line);
}

}  // namespace tensorcheck::cli::internal
