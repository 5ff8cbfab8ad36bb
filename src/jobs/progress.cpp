#include "jobs/progress.h"

#include <cstdio>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace tprun::jobs {

using Clock = std::chrono::steady_clock;

Progress::Progress(int64_t total, int64_t skipped, bool live, double interval_s)
    : total_(total), skipped_(skipped), live_(live), interval_s_(interval_s), start_(Clock::now()),
      last_draw_(Clock::now()) {}

double Progress::images_per_second() const {
  const double s = std::chrono::duration<double>(Clock::now() - start_).count();
  return s > 0 ? static_cast<double>(done_ + failed_) / s : 0.0;
}

std::string Progress::line() const {
  const int64_t finished = skipped_ + done_ + failed_;
  const int64_t left = total_ - finished;
  const double rate = images_per_second();
  std::string eta = "--";
  if (rate > 0 && left > 0) {
    const int64_t s = static_cast<int64_t>(static_cast<double>(left) / rate + 0.5);
    eta = s >= 3600 ? fmt::format("{}h{:02}m", s / 3600, (s / 60) % 60) : fmt::format("{}m{:02}s", s / 60, s % 60);
  } else if (left == 0) {
    eta = "0s";
  }
  const int width = 24;
  const int fill = total_ > 0 ? static_cast<int>(width * finished / total_) : width;
  return fmt::format("[{}{}] {}/{} done, {} failed | {:.2f} img/s | ETA {}", std::string(fill, '#'),
                     std::string(width - fill, '.'), skipped_ + done_, total_, failed_, rate, eta);
}

void Progress::draw(bool force) {
  const auto now = Clock::now();
  if (live_) {
    std::fprintf(stderr, "\r%s\x1b[K", line().c_str());
    std::fflush(stderr);
  } else if (force || std::chrono::duration<double>(now - last_draw_).count() >= interval_s_) {
    spdlog::info("progress {}", line());
    last_draw_ = now;
  }
}

void Progress::record(bool ok) {
  (ok ? done_ : failed_)++;
  draw(false);
}

void Progress::finish() {
  if (live_) {
    draw(true);
    std::fprintf(stderr, "\n");
  } else {
    draw(true);
  }
}

}  // namespace tprun::jobs
