#pragma once
// Host -> device upload of checkpoint slices through a few reused staging
// buffers, the read of one slice overlapping the copy of the one before.
//
// For each slice the pipeline takes the next buffer round-robin, waits for
// that buffer's previous copy, lets the caller read the slice into it, then
// starts the copy and returns. With two buffers slice k+1 is read from
// storage while slice k is copied. Buffers only grow (to the largest slice
// they have held), so host staging memory is bounded by buffers x largest
// slice, never by the sum of the slices.
//
// The device side is a CopyEngine: CUDA's (cuda_copy_engine.h) with pinned
// buffers and a copy stream, or a test's fake on plain host memory.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tprun::checkpoint {

class CopyEngine {
 public:
  // One started copy; 0 is never a ticket.
  using Ticket = uint64_t;

  virtual ~CopyEngine() = default;

  // A host staging buffer of `bytes` (> 0; pinned on CUDA), and its release.
  virtual void* allocate_host(size_t bytes) = 0;
  virtual void free_host(void* host, size_t bytes) noexcept = 0;
  // Starts copying host[0, bytes) to device_dst; neither may be touched
  // until wait_host(ticket) returned. Work queued later on the compute
  // stream may reuse device_dst's memory only after wait_compute(ticket).
  virtual Ticket copy_async(void* device_dst, const void* host, size_t bytes) = 0;
  // Orders work queued later on the compute stream after the copy (the host
  // does not wait). Call at most once per ticket, before wait_host.
  virtual void wait_compute(Ticket ticket) = 0;
  // Blocks until the copy finished and retires the ticket: every ticket is
  // waited exactly once. Throws where the copy failed; retired either way.
  virtual void wait_host(Ticket ticket) = 0;
};

struct StagingStats {
  uint64_t buffers_allocated = 0;   // allocations, regrowths included
  uint64_t peak_staging_bytes = 0;  // largest sum of live staging buffers
  uint64_t slices = 0;
  uint64_t bytes = 0;               // bytes copied
};

class StagingPipeline {
 public:
  // Fills a staging buffer with the slice's bytes (the caller reads it there).
  using ReadFn = std::function<void(void* host)>;

  explicit StagingPipeline(std::unique_ptr<CopyEngine> engine, int buffers = 2);
  // Waits for every copy in flight; never throws (a failure is logged).
  ~StagingPipeline();
  StagingPipeline(const StagingPipeline&) = delete;
  StagingPipeline& operator=(const StagingPipeline&) = delete;

  // Reads `bytes` of tensor `name` through `read` and starts copying them to
  // device_dst, ordered before later work on the compute stream; returns
  // while the copy runs. A slice of no bytes is neither read nor copied.
  // An error (of the read, the copy, or an earlier copy found failed while
  // waiting for its buffer) names its tensor and keeps its kind; every copy
  // in flight is waited for before it leaves, so none outlives its buffers
  // or its destination.
  void upload(const std::string& name, void* device_dst, size_t bytes, const ReadFn& read);
  // Waits for every copy in flight; the first failure, named, after all were waited.
  void finish();

  const StagingStats& stats() const { return stats_; }
  int buffers() const { return static_cast<int>(slots_.size()); }
  CopyEngine& engine() { return *engine_; }

 private:
  struct Slot {
    void* host = nullptr;
    size_t size = 0;
    CopyEngine::Ticket ticket = 0;  // the copy in flight from this buffer, or 0
    std::string name;               // its tensor
  };
  // Waits for slot's copy, if any; a failure rethrown naming the slot's tensor.
  void wait_slot(Slot& slot);
  // Waits for every slot, swallowing failures: logged as warnings in the
  // destructor (`first_failure_is_news`), at debug level on error paths.
  void drain(bool first_failure_is_news = false) noexcept;
  void release_buffers() noexcept;

  std::unique_ptr<CopyEngine> engine_;
  std::vector<Slot> slots_;
  size_t next_ = 0;
  uint64_t live_bytes_ = 0;
  StagingStats stats_;
};

}  // namespace tprun::checkpoint
