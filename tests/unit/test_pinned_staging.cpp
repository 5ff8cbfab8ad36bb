// The staging pipeline of device loads (checkpoint/pinned_staging.h) on a
// fake copy engine: host memory as the "device", copies run by a worker
// thread so they really are asynchronous. No test relies on timing: the
// overlap and the error cases hold copies back on gates the test opens.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "checkpoint/pinned_staging.h"
#include "runtime/error.h"

namespace tprun::checkpoint {
namespace {

// Long enough never to fire on a busy machine; it turns a broken pipeline's
// deadlock into a failure.
constexpr auto kGateTimeout = std::chrono::seconds(60);

// The fake device and its copy worker. Lives in a shared_ptr so a test can
// still inspect it after the pipeline (which owns the engine) is gone.
class FakeDevice {
 public:
  FakeDevice() : worker_([this] { run(); }) {}
  ~FakeDevice() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();
    for (auto& [p, n] : live_) delete[] static_cast<char*>(p);
  }

  // --- settings (before the uploads) ---
  int block_copy = -1;         // this copy (0-based) waits until open_gate()
  int fail_copy = -1;          // this copy fails on the device (reported by wait_host)
  int fail_launch = -1;        // this copy fails to start (copy_async throws)
  bool hold_until_waited = false;  // a copy ends only once the host waits for it (or a later one)

  void open_gate() {
    std::lock_guard<std::mutex> lk(mu_);
    gate_open_ = true;
    cv_.notify_all();
  }

  // --- the CopyEngine calls ---
  void* allocate_host(size_t bytes) {
    std::lock_guard<std::mutex> lk(mu_);
    void* p = new char[bytes];
    live_[p] = bytes;
    ++allocations;
    max_live_buffers = std::max(max_live_buffers, live_.size());
    return p;
  }
  void free_host(void* p, size_t bytes) {
    std::lock_guard<std::mutex> lk(mu_);
    if (in_flight_.count(p) != 0) violation("a buffer freed while its copy is in flight");
    if (live_.count(p) == 0 || live_[p] != bytes) violation("free_host of an unknown buffer or size");
    live_.erase(p);
    delete[] static_cast<char*>(p);
  }
  CopyEngine::Ticket copy_async(void* dst, const void* host, size_t bytes) {
    std::lock_guard<std::mutex> lk(mu_);
    const int index = started_++;
    if (index == fail_launch) throw DeviceError("fake: the copy did not start");
    if (in_flight_.count(host) != 0) violation("a second copy from a buffer whose copy is in flight");
    const CopyEngine::Ticket t = ++last_ticket_;
    jobs_.push_back(Job{t, index, dst, host, bytes});
    in_flight_.insert(host);
    tickets_[t] = Pending{};
    cv_.notify_all();
    return t;
  }
  void wait_compute(CopyEngine::Ticket t) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = tickets_.find(t);
    if (it == tickets_.end()) return violation("wait_compute of an unknown or retired ticket");
    if (it->second.compute_waited) violation("wait_compute twice for one ticket");
    it->second.compute_waited = true;
  }
  void wait_host(CopyEngine::Ticket t) {
    std::unique_lock<std::mutex> lk(mu_);
    auto it = tickets_.find(t);
    if (it == tickets_.end()) {
      violation("wait_host of an unknown or retired ticket");
      return;
    }
    if (!it->second.compute_waited) violation("the compute stream never waited for a copy");
    // A stream is in order: waiting for a copy lets every earlier one end.
    released_up_to_ = std::max(released_up_to_, t);
    cv_.notify_all();
    cv_.wait(lk, [&] { return tickets_[t].done; });
    const bool failed = tickets_[t].failed;
    tickets_.erase(t);
    if (failed) throw DeviceError("fake: the copy failed on the device");
  }

  // --- for the tests ---
  // Called from read callbacks: the buffer about to be filled has no copy running.
  void expect_idle(void* host) {
    std::lock_guard<std::mutex> lk(mu_);
    if (in_flight_.count(host) != 0) violation("a buffer refilled while its copy is in flight");
  }
  size_t copies_in_flight() {
    std::lock_guard<std::mutex> lk(mu_);
    return in_flight_.size();
  }
  int copies_completed() {
    std::lock_guard<std::mutex> lk(mu_);
    return completed_;
  }
  size_t live_buffers() {
    std::lock_guard<std::mutex> lk(mu_);
    return live_.size();
  }
  std::vector<std::string> violations() {
    std::lock_guard<std::mutex> lk(mu_);
    return violations_;
  }

  int allocations = 0;
  size_t max_live_buffers = 0;

 private:
  struct Job {
    CopyEngine::Ticket ticket;
    int index;
    void* dst;
    const void* host;
    size_t bytes;
  };
  struct Pending {
    bool compute_waited = false;
    bool done = false;
    bool failed = false;
  };

  void violation(const std::string& what) { violations_.push_back(what); }  // mu_ held

  void run() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      const Job job = jobs_.front();
      jobs_.pop_front();
      if (job.index == block_copy &&
          !cv_.wait_for(lk, kGateTimeout, [&] { return gate_open_ || stopping_; })) {
        violation("copy " + std::to_string(job.index) + " waited for its gate in vain (no overlap)");
      }
      if (hold_until_waited) cv_.wait(lk, [&] { return stopping_ || released_up_to_ >= job.ticket; });
      const bool fail = job.index == fail_copy;
      lk.unlock();
      if (!fail) std::memcpy(job.dst, job.host, job.bytes);  // the buffer is not locked: a refill would show
      lk.lock();
      in_flight_.erase(job.host);
      ++completed_;
      tickets_[job.ticket].done = true;
      tickets_[job.ticket].failed = fail;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  std::map<void*, size_t> live_;
  std::set<const void*> in_flight_;
  std::map<CopyEngine::Ticket, Pending> tickets_;
  std::vector<std::string> violations_;
  CopyEngine::Ticket last_ticket_ = 0;
  CopyEngine::Ticket released_up_to_ = 0;
  int started_ = 0;
  int completed_ = 0;
  bool gate_open_ = false;
  bool stopping_ = false;
  std::thread worker_;  // last: starts after the state above exists
};

class FakeEngine final : public CopyEngine {
 public:
  explicit FakeEngine(std::shared_ptr<FakeDevice> d) : d_(std::move(d)) {}
  void* allocate_host(size_t bytes) override { return d_->allocate_host(bytes); }
  void free_host(void* host, size_t bytes) noexcept override { d_->free_host(host, bytes); }
  Ticket copy_async(void* dst, const void* host, size_t bytes) override { return d_->copy_async(dst, host, bytes); }
  void wait_compute(Ticket t) override { d_->wait_compute(t); }
  void wait_host(Ticket t) override { d_->wait_host(t); }

 private:
  std::shared_ptr<FakeDevice> d_;
};

struct Rig {
  std::shared_ptr<FakeDevice> device = std::make_shared<FakeDevice>();
  std::unique_ptr<StagingPipeline> pipeline =
      std::make_unique<StagingPipeline>(std::make_unique<FakeEngine>(device), 2);
};

std::vector<char> pattern(size_t n, unsigned seed) {
  std::vector<char> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& c : v) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<char>(x >> 24);
  }
  return v;
}

std::string name_of(size_t i) { return "blocks." + std::to_string(i) + ".weight"; }

// Uploads `source[i]` into `dst[i]` (sized to match), each read checking its buffer is idle.
void upload_all(Rig& rig, const std::vector<std::vector<char>>& source, std::vector<std::vector<char>>& dst) {
  dst.clear();
  for (const auto& s : source) dst.emplace_back(s.size(), '\0');
  for (size_t i = 0; i < source.size(); ++i) {
    rig.pipeline->upload(name_of(i), dst[i].data(), source[i].size(), [&, i](void* host) {
      rig.device->expect_idle(host);
      std::memcpy(host, source[i].data(), source[i].size());
    });
  }
}

TEST(PinnedStaging, EverySliceArrivesByteExact) {
  Rig rig;
  // Sizes up and down, a slice larger than all before it late, empty slices.
  const std::vector<size_t> sizes = {1000, 17, 0, 4096, 4096, 3, 65536, 0, 12, 5000, 65535, 200000, 1, 64};
  std::vector<std::vector<char>> source, dst;
  for (size_t i = 0; i < sizes.size(); ++i) source.push_back(pattern(sizes[i], static_cast<unsigned>(i)));
  upload_all(rig, source, dst);
  rig.pipeline->finish();
  for (size_t i = 0; i < sizes.size(); ++i) EXPECT_EQ(dst[i], source[i]) << name_of(i);
  EXPECT_EQ(rig.device->copies_in_flight(), 0u);
  EXPECT_EQ(rig.device->violations(), std::vector<std::string>{});
  const StagingStats& st = rig.pipeline->stats();
  EXPECT_EQ(st.slices, sizes.size());
  uint64_t total = 0;
  for (size_t s : sizes) total += s;
  EXPECT_EQ(st.bytes, total);
}

TEST(PinnedStaging, BuffersAreReusedAndGrowOnlyForALargerSlice) {
  Rig rig;
  std::vector<size_t> sizes;
  for (int i = 0; i < 20; ++i) sizes.push_back(1000 + static_cast<size_t>((i * 7919) % 9000));
  sizes[13] = 50000;  // larger than all before it
  std::vector<std::vector<char>> source, dst;
  for (size_t i = 0; i < sizes.size(); ++i) source.push_back(pattern(sizes[i], static_cast<unsigned>(i) + 100));
  upload_all(rig, source, dst);
  rig.pipeline->finish();
  for (size_t i = 0; i < sizes.size(); ++i) EXPECT_EQ(dst[i], source[i]) << name_of(i);

  // Each of the two round-robin buffers is (re)allocated only when a slice
  // larger than it holds comes to it.
  int expected_allocations = 0;
  size_t held[2] = {0, 0};
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] > held[i % 2]) {
      held[i % 2] = sizes[i];
      ++expected_allocations;
    }
  }
  EXPECT_EQ(rig.device->allocations, expected_allocations);
  EXPECT_LT(expected_allocations, 12) << "the sizes should make reuse visible";
  EXPECT_LE(rig.device->max_live_buffers, 2u);
  const size_t largest = *std::max_element(sizes.begin(), sizes.end());
  const StagingStats& st = rig.pipeline->stats();
  EXPECT_EQ(st.buffers_allocated, static_cast<uint64_t>(expected_allocations));
  EXPECT_LE(st.peak_staging_bytes, 2 * largest);
  EXPECT_GE(st.peak_staging_bytes, largest);
  EXPECT_EQ(st.slices, 20u);
  EXPECT_EQ(rig.device->violations(), std::vector<std::string>{});

  // Twenty slices of one size: two allocations in all.
  Rig same;
  std::vector<std::vector<char>> src2(20, pattern(4096, 7)), dst2;
  upload_all(same, src2, dst2);
  same.pipeline->finish();
  EXPECT_EQ(same.device->allocations, 2);
  EXPECT_EQ(same.pipeline->stats().peak_staging_bytes, 2u * 4096u);
  same.pipeline.reset();
  EXPECT_EQ(same.device->live_buffers(), 0u) << "the pipeline frees its buffers";
}

TEST(PinnedStaging, TheNextReadOverlapsThePreviousCopy) {
  Rig rig;
  rig.device->block_copy = 0;  // copy 0 ends only after the read of slice 1 opened its gate
  std::vector<char> a = pattern(3000, 1), b = pattern(5000, 2), c = pattern(100, 3);
  std::vector<char> da(a.size()), db(b.size()), dc(c.size());
  int completed_when_read_1_started = -1;
  rig.pipeline->upload("a", da.data(), a.size(), [&](void* h) { std::memcpy(h, a.data(), a.size()); });
  rig.pipeline->upload("b", db.data(), b.size(), [&](void* h) {
    completed_when_read_1_started = rig.device->copies_completed();
    rig.device->open_gate();
    rig.device->expect_idle(h);
    std::memcpy(h, b.data(), b.size());
  });
  rig.pipeline->upload("c", dc.data(), c.size(), [&](void* h) {
    rig.device->expect_idle(h);  // buffer 0 again: copy 0 must be over
    std::memcpy(h, c.data(), c.size());
  });
  rig.pipeline->finish();
  EXPECT_EQ(completed_when_read_1_started, 0) << "slice 1 was read only after copy 0 finished";
  EXPECT_EQ(da, a);
  EXPECT_EQ(db, b);
  EXPECT_EQ(dc, c);
  EXPECT_EQ(rig.device->violations(), std::vector<std::string>{});
}

TEST(PinnedStaging, AReadErrorNamesTheTensorAndLeavesNoCopyRunning) {
  Rig rig;
  rig.device->hold_until_waited = true;  // copies in flight stay so until the host waits for them
  std::vector<std::vector<char>> source = {pattern(800, 1), pattern(900, 2)}, dst;
  upload_all(rig, source, dst);
  ASSERT_EQ(rig.device->copies_in_flight(), 2u) << "both copies are held in flight";
  std::vector<char> out(10);
  try {
    rig.pipeline->upload("bad.weight", out.data(), out.size(),
                         [](void*) { throw CheckpointError("model.safetensors: unexpected end of file"); });
    FAIL() << "the read error was swallowed";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("'bad.weight'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("unexpected end of file"), std::string::npos) << e.what();
  }
  EXPECT_EQ(rig.device->copies_in_flight(), 0u) << "a copy outlived the failed upload";
  EXPECT_EQ(dst[1], source[1]);
  // The pipeline goes on working after the error.
  std::vector<char> more = pattern(700, 9), dmore(700);
  rig.pipeline->upload("more", dmore.data(), more.size(), [&](void* h) { std::memcpy(h, more.data(), 700); });
  rig.pipeline->finish();
  EXPECT_EQ(dmore, more);
  EXPECT_EQ(rig.device->violations(), std::vector<std::string>{});
}

TEST(PinnedStaging, ACopyErrorNamesItsTensorAndLeavesNoCopyRunning) {
  Rig rig;
  rig.device->hold_until_waited = true;
  rig.device->fail_copy = 1;  // found failed when buffer 1 is needed again (slice 3)
  std::vector<std::vector<char>> source, dst;
  for (int i = 0; i < 5; ++i) source.push_back(pattern(1000 + 10 * i, static_cast<unsigned>(i)));
  try {
    upload_all(rig, source, dst);
    FAIL() << "the copy error was swallowed";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("'" + name_of(1) + "'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("failed on the device"), std::string::npos) << e.what();
  }
  EXPECT_EQ(rig.device->copies_in_flight(), 0u) << "a copy outlived the failure";
  EXPECT_EQ(dst[2], source[2]);
  EXPECT_EQ(rig.device->violations(), std::vector<std::string>{});
}

TEST(PinnedStaging, FinishReportsACopyErrorAfterWaitingForAll) {
  Rig rig;
  rig.device->hold_until_waited = true;
  rig.device->fail_copy = 0;
  std::vector<std::vector<char>> source = {pattern(64, 1), pattern(128, 2)}, dst;
  upload_all(rig, source, dst);
  EXPECT_THROW(
      {
        try {
          rig.pipeline->finish();
        } catch (const DeviceError& e) {
          EXPECT_NE(std::string(e.what()).find("'" + name_of(0) + "'"), std::string::npos) << e.what();
          throw;
        }
      },
      DeviceError);
  EXPECT_EQ(rig.device->copies_in_flight(), 0u);
  EXPECT_EQ(dst[1], source[1]) << "finish waited for the copy after the failed one";
}

TEST(PinnedStaging, ACopyThatDoesNotStartNamesItsTensor) {
  Rig rig;
  rig.device->hold_until_waited = true;
  rig.device->fail_launch = 2;
  std::vector<std::vector<char>> source, dst;
  for (int i = 0; i < 4; ++i) source.push_back(pattern(300, static_cast<unsigned>(i)));
  try {
    upload_all(rig, source, dst);
    FAIL() << "the launch error was swallowed";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("'" + name_of(2) + "'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(rig.device->copies_in_flight(), 0u);
  EXPECT_EQ(dst[1], source[1]);
}

TEST(PinnedStaging, TheDestructorWaitsForCopiesInFlight) {
  Rig rig;
  rig.device->hold_until_waited = true;
  rig.device->fail_copy = 1;  // a failure found by the destructor is logged, not thrown
  std::vector<std::vector<char>> source = {pattern(500, 1), pattern(600, 2)}, dst;
  upload_all(rig, source, dst);
  EXPECT_EQ(rig.device->copies_in_flight(), 2u);
  EXPECT_NO_THROW(rig.pipeline.reset());
  EXPECT_EQ(rig.device->copies_in_flight(), 0u);
  EXPECT_EQ(rig.device->live_buffers(), 0u);
  EXPECT_EQ(dst[0], source[0]);
  EXPECT_EQ(rig.device->violations(), std::vector<std::string>{});
}

}  // namespace
}  // namespace tprun::checkpoint
