#pragma once
// A thread that ends the job when a collective does not complete in time, so a
// dead or stuck peer never turns into a silent hang. Blocking collectives
// (MPI) arm it around the call; asynchronous ones (NCCL) register a poll
// function that reports completion or an asynchronous error.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace tprun::dist {

class CommWatchdog {
 public:
  // timeout <= 0 disables the deadline (errors from poll functions still end the job).
  explicit CommWatchdog(std::chrono::milliseconds timeout);
  ~CommWatchdog();
  CommWatchdog(const CommWatchdog&) = delete;
  CommWatchdog& operator=(const CommWatchdog&) = delete;

  std::chrono::milliseconds timeout() const { return timeout_; }

  // RAII: while alive, the named blocking collective must finish within the timeout.
  class Armed {
   public:
    Armed(CommWatchdog* dog, const char* what, const std::string& group);
    ~Armed();
    Armed(const Armed&) = delete;
    Armed& operator=(const Armed&) = delete;

   private:
    CommWatchdog* dog_;
  };
  Armed arm(const char* what, const std::string& group) { return Armed(this, what, group); }

  // A poll function returns "" while healthy, or an error message. It is called
  // every poll interval from the watchdog thread until unregistered.
  using Poll = std::function<std::string()>;
  int add_poll(Poll poll);
  void remove_poll(int id);

  // The process-wide watchdog (set by the Session); may be null in tools and tests.
  static CommWatchdog* global();
  static void set_global(CommWatchdog* dog);

 private:
  void loop();
  [[noreturn]] void fire(const std::string& message);

  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool armed_ = false;
  std::chrono::steady_clock::time_point deadline_{};
  std::string what_;
  int next_poll_id_ = 1;
  std::vector<std::pair<int, Poll>> polls_;
  std::thread thread_;
};

}  // namespace tprun::dist
