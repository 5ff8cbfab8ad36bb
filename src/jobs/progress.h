#pragma once
// Rank 0's progress line: done / total, failed, images per second and ETA.
// On a terminal (stderr is a TTY) one line redrawn in place; otherwise a log
// line at most every `interval_s` seconds (and at the end), so batch logs stay
// readable.

#include <chrono>
#include <cstdint>
#include <string>

namespace tprun::jobs {

class Progress {
 public:
  // `total`: requests in the job; `skipped`: already done before this run.
  Progress(int64_t total, int64_t skipped, bool live, double interval_s = 10.0);
  void record(bool ok);  // one request finished in this run
  void finish();         // final line
  std::string line() const;
  double images_per_second() const;

 private:
  void draw(bool force);
  int64_t total_, skipped_, done_ = 0, failed_ = 0;
  bool live_;
  double interval_s_;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace tprun::jobs
