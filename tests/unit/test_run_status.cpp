// `tprun run --status-file` (jobs/run_status.h): the interrupted verdict is
// written as soon as a stop is requested, not when the run gets round to it.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "jobs/job_runner.h"
#include "jobs/run_status.h"

namespace tprun::jobs {
namespace {

namespace fs = std::filesystem;

class RunStatus : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("tprun-status-{}-{}", ::getpid(), counter_++);
    fs::create_directories(dir_);
    path_ = (dir_ / "status.json").string();
  }
  void TearDown() override { fs::remove_all(dir_); }
  // The exit code in the file, -1 while there is none.
  int code() const {
    std::ifstream f(path_);
    if (!f) return -1;
    std::stringstream s;
    s << f.rdbuf();
    return nlohmann::json::parse(s.str()).at("exit_code").get<int>();
  }
  // Waits (bounded: a hang fails, a busy machine does not) for `want`.
  bool becomes(int want) const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      if (code() == want) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
  fs::path dir_;
  std::string path_;
  static inline int counter_ = 0;
};

// The main thread is busy (a long step, a load) when the signal comes: the
// verdict is there anyway, before the run reaches a point where it stops.
TEST_F(RunStatus, StopSignalWritesInterruptedAtOnce) {
  std::atomic<bool> stop{false};
  StatusFile status(path_, "job.toml", true);
  status.arm([&] { return stop.load(); }, 5);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(code(), -1) << "nothing is written before a stop";
  stop = true;
  EXPECT_TRUE(becomes(kExitInterrupted));
  status.finish(kExitInterrupted);
  EXPECT_EQ(code(), kExitInterrupted);
}

TEST_F(RunStatus, SignalBeforeArmingCounts) {
  StatusFile status(path_, "job.toml", true);
  status.arm([] { return true; }, 5);
  EXPECT_TRUE(becomes(kExitInterrupted));
}

// The run's own exit code replaces the early verdict, and nothing is written
// after it (a signal during the exit must not turn "finished" into 75).
TEST_F(RunStatus, FinishReplacesAndIsLast) {
  std::atomic<bool> stop{false};
  {
    StatusFile status(path_, "job.toml", true);
    status.arm([&] { return stop.load(); }, 5);
    status.interrupted();
    EXPECT_EQ(code(), kExitInterrupted);
    status.finish(0);
    EXPECT_EQ(code(), 0);
    stop = true;
    status.interrupted();
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_EQ(code(), 0);
  }
  std::ifstream f(path_);
  std::stringstream s;
  s << f.rdbuf();
  const auto j = nlohmann::json::parse(s.str());
  EXPECT_EQ(j.at("state"), "finished");
  EXPECT_EQ(j.at("manifest"), "job.toml");
}

TEST_F(RunStatus, OtherRanksAndNoPathWriteNothing) {
  {
    StatusFile status(path_, "job.toml", false);
    status.arm([] { return true; }, 5);
    status.interrupted();
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    status.finish(3);
  }
  EXPECT_FALSE(fs::exists(path_));
  StatusFile none("", "job.toml", true);
  none.arm([] { return true; }, 5);
  none.finish(0);
}

}  // namespace
}  // namespace tprun::jobs
