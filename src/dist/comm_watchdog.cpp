#include "dist/comm_watchdog.h"

#include <atomic>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "dist/mpi_world.h"
#include "runtime/error.h"

namespace tprun::dist {
namespace {
std::atomic<CommWatchdog*> g_watchdog{nullptr};
constexpr auto kPollInterval = std::chrono::milliseconds(100);
}  // namespace

CommWatchdog* CommWatchdog::global() { return g_watchdog.load(); }
void CommWatchdog::set_global(CommWatchdog* dog) { g_watchdog.store(dog); }

CommWatchdog::CommWatchdog(std::chrono::milliseconds timeout) : timeout_(timeout) {
  thread_ = std::thread([this] { loop(); });
}

CommWatchdog::~CommWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (global() == this) set_global(nullptr);
}

CommWatchdog::Armed::Armed(CommWatchdog* dog, const char* what, const std::string& group)
    : dog_(dog) {
  if (dog_ == nullptr || dog_->timeout_.count() <= 0) {
    dog_ = nullptr;
    return;
  }
  std::lock_guard<std::mutex> lock(dog_->mu_);
  dog_->armed_ = true;
  dog_->deadline_ = std::chrono::steady_clock::now() + dog_->timeout_;
  dog_->what_ = fmt::format("{} on group {}", what, group);
}

CommWatchdog::Armed::~Armed() {
  if (dog_ == nullptr) return;
  std::lock_guard<std::mutex> lock(dog_->mu_);
  dog_->armed_ = false;
}

int CommWatchdog::add_poll(Poll poll) {
  std::lock_guard<std::mutex> lock(mu_);
  int id = next_poll_id_++;
  polls_.emplace_back(id, std::move(poll));
  return id;
}

void CommWatchdog::remove_poll(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = polls_.begin(); it != polls_.end(); ++it) {
    if (it->first == id) {
      polls_.erase(it);
      return;
    }
  }
}

void CommWatchdog::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, kPollInterval);
    if (stop_) break;
    if (armed_ && std::chrono::steady_clock::now() > deadline_) {
      std::string what = what_;
      lock.unlock();
      fire(fmt::format(
          "{} did not complete within {:.0f} s: a peer rank is stuck, dead or called a different "
          "collective; ending the job (raise --comm-timeout if a peer is legitimately slow)",
          what, static_cast<double>(timeout_.count()) / 1000.0));
    }
    for (auto& entry : polls_) {
      std::string err = entry.second();
      if (!err.empty()) {
        lock.unlock();
        fire(err);
      }
    }
  }
}

void CommWatchdog::fire(const std::string& message) {
  spdlog::critical("communication error: {}", message);
  abort_job(exit_code::kComm);
}

}  // namespace tprun::dist
