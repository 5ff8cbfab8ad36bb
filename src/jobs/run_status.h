#pragma once
// `tprun run --status-file`: tprun's own verdict for requeue scripts, written
// by world rank 0 (atomically: a reader sees the old file or the new one).
//
// The verdict must be there even when the launcher kills the ranks after its
// grace time (mpirun: SIGTERM, then SIGKILL odls_base_sigkill_timeout s
// later; Slurm: KillWait), and on a busy node the current step, a load or the
// teardown may take longer than that. So once armed, a stop signal writes
// "interrupted" (75) at once, from a watcher thread, whatever the run is doing;
// the exit code the run ends with replaces it. An early 75 is always safe: a
// requeued job resumes, and a finished one finds nothing left to do.

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace tprun::jobs {

class StatusFile {
 public:
  // `writer`: this rank writes (world rank 0); on the others every call is a
  // no-op. An empty `path` writes nothing.
  StatusFile(std::string path, std::string manifest, bool writer);
  ~StatusFile();  // stops the watcher
  StatusFile(const StatusFile&) = delete;
  StatusFile& operator=(const StatusFile&) = delete;

  // From now on (the path has been checked), `stop_requested` turning true
  // writes 75 within `poll_ms`. Checked at once: a signal seen before counts.
  void arm(std::function<bool()> stop_requested, int poll_ms = 50);
  // The run agreed to stop: 75 now, unless written already.
  void interrupted();
  // The exit code every rank returns; nothing is written after it.
  void finish(int code);

 private:
  void write_locked(int code);
  void watch(std::function<bool()> stop_requested, int poll_ms);

  const std::string path_, manifest_;
  const bool active_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false, wrote_interrupted_ = false;
  std::thread watcher_;
};

}  // namespace tprun::jobs
