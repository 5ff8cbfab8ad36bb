#include "jobs/run_status.h"

#include <chrono>
#include <system_error>
#include <utility>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "jobs/job_runner.h"
#include "jobs/output_folder.h"
#include "jobs/results_log.h"
#include "runtime/error.h"

namespace tprun::jobs {

StatusFile::StatusFile(std::string path, std::string manifest, bool writer)
    : path_(std::move(path)), manifest_(std::move(manifest)), active_(writer && !path_.empty()) {}

StatusFile::~StatusFile() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    closed_ = true;
  }
  cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
}

void StatusFile::arm(std::function<bool()> stop_requested, int poll_ms) {
  if (!active_ || watcher_.joinable()) return;
  // A thread, not the signal handler: the handler may only set a flag, and
  // the main thread may be busy for long (a step, a load) when it is set.
  try {
    watcher_ = std::thread([this, fn = std::move(stop_requested), poll_ms] { watch(fn, poll_ms); });
  } catch (const std::system_error& e) {
    // No thread (a tight ulimit): the verdict still comes when the run agrees to stop.
    spdlog::warn("--status-file: cannot start the thread that writes the verdict on SIGTERM ({}); it is written "
                 "when the run stops",
                 e.what());
  }
}

void StatusFile::watch(std::function<bool()> stop_requested, int poll_ms) {
  std::unique_lock<std::mutex> lk(mu_);
  while (!closed_) {
    if (stop_requested()) {
      if (!wrote_interrupted_) {
        spdlog::info("stop requested (SIGTERM/SIGINT): stopping at the next step; {} says interrupted (exit code {}) "
                     "until the run ends",
                     path_, kExitInterrupted);
        write_locked(kExitInterrupted);
      }
      return;
    }
    cv_.wait_for(lk, std::chrono::milliseconds(poll_ms));
  }
}

void StatusFile::interrupted() {
  if (!active_) return;
  std::lock_guard<std::mutex> lk(mu_);
  if (!closed_ && !wrote_interrupted_) write_locked(kExitInterrupted);
}

void StatusFile::finish(int code) {
  if (!active_) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (closed_) return;
    write_locked(code);
    closed_ = true;
  }
  cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
}

void StatusFile::write_locked(int code) {
  if (code == kExitInterrupted) wrote_interrupted_ = true;
  const char* state = code == 0                  ? "finished"
                      : code == kExitInterrupted ? "interrupted"
                      : code == kExitSomeFailed  ? "finished_with_failures"
                                                 : "error";
  try {
    // A new file or one holding a tprun status (checked before the run, and here again, race-free: a file put
    // there since is never replaced; output_folder.h).
    OutputTemp tmp(path_);
    write_file_atomic(tmp.path(),
                      nlohmann::json{{"exit_code", code}, {"state", state}, {"manifest", manifest_}}.dump() + "\n");
    tmp.place(OutputKind::Status);
  } catch (const Error& e) {
    spdlog::warn("--status-file: {}", e.what());
  }
}

}  // namespace tprun::jobs
