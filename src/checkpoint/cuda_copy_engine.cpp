#include "checkpoint/cuda_copy_engine.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "runtime/error.h"

#ifdef TPRUN_TORCH_HAS_CUDA
#include <unordered_map>
#include <vector>

#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "runtime/cuda_check.h"
#endif

namespace tprun::checkpoint {

#ifdef TPRUN_TORCH_HAS_CUDA
namespace {

class CudaCopyEngine final : public CopyEngine {
 public:
  explicit CudaCopyEngine(int device) : device_(device) {
    const int count = static_cast<int>(c10::cuda::device_count());
    if (device_ < 0) device_ = static_cast<int>(c10::cuda::current_device());
    if (device_ >= count) {
      throw DeviceError(fmt::format("cuda:{}: no such CUDA device ({} visible)", device_, count));
    }
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    // A stream of its own, not synchronising with the legacy default stream,
    // so copies run beside the compute stream's work.
    TPRUN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    try {
      TPRUN_CUDA_CHECK(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming));
    } catch (...) {
      best_effort("destroying the copy stream", [&] { TPRUN_CUDA_CHECK(cudaStreamDestroy(stream_)); });
      throw;
    }
  }

  ~CudaCopyEngine() override {
    best_effort("selecting the device", [&] {
      c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
      for (auto& [ticket, event] : pending_) {
        best_effort("waiting for a copy", [&] { TPRUN_CUDA_CHECK(cudaEventSynchronize(event)); });
        free_events_.push_back(event);
      }
      pending_.clear();
      for (cudaEvent_t event : free_events_) {
        best_effort("destroying an event", [&] { TPRUN_CUDA_CHECK(cudaEventDestroy(event)); });
      }
      best_effort("destroying an event", [&] { TPRUN_CUDA_CHECK(cudaEventDestroy(compute_ready_)); });
      best_effort("waiting for the copy stream", [&] { TPRUN_CUDA_CHECK(cudaStreamSynchronize(stream_)); });
      best_effort("destroying the copy stream", [&] { TPRUN_CUDA_CHECK(cudaStreamDestroy(stream_)); });
    });
  }

  void* allocate_host(size_t bytes) override {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    void* host = nullptr;
    TPRUN_CUDA_CHECK(cudaHostAlloc(&host, bytes, cudaHostAllocDefault));
    return host;
  }

  void free_host(void* host, size_t bytes) noexcept override {
    best_effort("freeing a pinned staging buffer", [&] {
      c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
      TPRUN_CUDA_CHECK(cudaFreeHost(host));
    });
  }

  Ticket copy_async(void* device_dst, const void* host, size_t bytes) override {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    cudaEvent_t done = take_event();
    try {
      // The destination was just allocated for the compute stream, whose
      // earlier work may still use that memory (the caching allocator reuses
      // blocks in stream order): the copy queues behind it.
      const cudaStream_t compute = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream();
      TPRUN_CUDA_CHECK(cudaEventRecord(compute_ready_, compute));
      TPRUN_CUDA_CHECK(cudaStreamWaitEvent(stream_, compute_ready_, 0));
      TPRUN_CUDA_CHECK(cudaMemcpyAsync(device_dst, host, bytes, cudaMemcpyHostToDevice, stream_));
      TPRUN_CUDA_CHECK(cudaEventRecord(done, stream_));
    } catch (...) {
      // No ticket leaves, so nothing may still read the buffer either.
      best_effort("waiting for the copy stream", [&] { TPRUN_CUDA_CHECK(cudaStreamSynchronize(stream_)); });
      free_events_.push_back(done);
      throw;
    }
    const Ticket ticket = ++last_ticket_;
    pending_.emplace(ticket, done);
    return ticket;
  }

  void wait_compute(Ticket ticket) override {
    const cudaEvent_t done = event_of(ticket);
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    const cudaStream_t compute = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream();
    TPRUN_CUDA_CHECK(cudaStreamWaitEvent(compute, done, 0));
  }

  void wait_host(Ticket ticket) override {
    const cudaEvent_t done = event_of(ticket);
    pending_.erase(ticket);
    free_events_.push_back(done);  // retired even if the wait fails
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    TPRUN_CUDA_CHECK(cudaEventSynchronize(done));
  }

 private:
  // Runs `step`, logging instead of throwing (destructors, error paths).
  template <typename F>
  void best_effort(const char* what, F&& step) noexcept {
    try {
      step();
    } catch (const std::exception& e) {
      spdlog::warn("cuda:{} staging: {}: {}", device_, what, e.what());
    } catch (...) {
      spdlog::warn("cuda:{} staging: {} failed", device_, what);
    }
  }

  cudaEvent_t take_event() {
    if (!free_events_.empty()) {
      const cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    TPRUN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }

  cudaEvent_t event_of(Ticket ticket) const {
    const auto it = pending_.find(ticket);
    if (it == pending_.end()) {
      throw Error(Error::Kind::Internal, fmt::format("cuda:{} staging: unknown copy ticket {}", device_, ticket));
    }
    return it->second;
  }

  int device_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t compute_ready_ = nullptr;
  std::unordered_map<Ticket, cudaEvent_t> pending_;
  std::vector<cudaEvent_t> free_events_;  // reused: a load makes one copy per tensor
  Ticket last_ticket_ = 0;
};

}  // namespace

std::unique_ptr<CopyEngine> make_cuda_copy_engine(int device) { return std::make_unique<CudaCopyEngine>(device); }

#else

std::unique_ptr<CopyEngine> make_cuda_copy_engine(int device) {
  throw DeviceError(fmt::format("cuda:{}: this tprun was built with a libtorch without CUDA; load to cpu "
                                "or rebuild against a CUDA libtorch",
                                device));
}

#endif

}  // namespace tprun::checkpoint
