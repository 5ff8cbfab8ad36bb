#include "dist/nccl_communicator.h"

#include <fmt/format.h>

#include "dist/mpi_communicator.h"
#include "runtime/error.h"

#ifdef TPRUN_HAVE_NCCL

#include <chrono>
#include <deque>
#include <mutex>
#include <thread>

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <spdlog/spdlog.h>

#include "dist/comm_watchdog.h"
#include "dist/mpi_world.h"
#include "dist/nccl_check.h"
#include "runtime/cuda_check.h"

namespace tprun::dist {
namespace {

using Clock = std::chrono::steady_clock;

// An enqueued NCCL call as the checked-call messages name it.
#define TPRUN_NCCL_ENQUEUE(call) enqueue(__FILE__, __LINE__, #call, call)

// Cleanup on a failure path or in a destructor: never throws; a failure is
// only logged, since an error is being reported already.
void abort_quietly(ncclComm_t comm) noexcept {
  const ncclResult_t rc = ncclCommAbort(comm);
  if (rc != ncclSuccess)
    spdlog::warn("{}", nccl_failure_text(__FILE__, __LINE__, "ncclCommAbort(comm)", rc, nullptr));
}

void destroy_event_quietly(cudaEvent_t ev) noexcept {
  const cudaError_t rc = cudaEventDestroy(ev);
  if (rc != cudaSuccess) {
    spdlog::debug("{}", cuda_failure_text(__FILE__, __LINE__, "cudaEventDestroy(ev)", rc));
    (void)cudaGetLastError();
  }
}

ncclDataType_t nccl_type(const at::Tensor& t, const std::string& group) {
  switch (t.scalar_type()) {
    case at::kFloat: return ncclFloat32;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kDouble: return ncclFloat64;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kChar: return ncclInt8;
    case at::kByte: return ncclUint8;
    default: break;
  }
  throw CommError(fmt::format("NCCL on group {}: dtype {} is not supported", group,
                              c10::toString(t.scalar_type())));
}

uint64_t nbytes(const at::Tensor& t) { return static_cast<uint64_t>(t.numel()) * t.element_size(); }

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(MpiCommunicator& bootstrap, int device, CommWatchdog* watchdog)
      : Communicator(bootstrap.name()), device_(device), watchdog_(watchdog) {
    rank_ = bootstrap.rank();
    size_ = bootstrap.size();
    timeout_ = watchdog != nullptr && watchdog->timeout().count() > 0
                   ? watchdog->timeout()
                   : std::chrono::milliseconds(30LL * 60 * 1000);
    TPRUN_CUDA_CHECK(cudaSetDevice(device_));
    ncclUniqueId id;
    if (rank_ == 0) TPRUN_NCCL_CHECK(ncclGetUniqueId(&id), nullptr);
    check_mpi(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, bootstrap.handle()), "MPI_Bcast(ncclUniqueId)");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    // Non-blocking: ncclInProgress is the normal answer; wait_ready waits for it.
    TPRUN_NCCL_ENQUEUE(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config));
    if (watchdog_ != nullptr) poll_id_ = watchdog_->add_poll([this] { return poll(); });
    spdlog::debug("NCCL communicator {} ready: rank {}/{} on cuda:{}", name_, rank_, size_, device_);
  }

  ~NcclCommunicator() override {
    if (watchdog_ != nullptr && poll_id_ != 0) watchdog_->remove_poll(poll_id_);
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& w : pending_) destroy_event_quietly(w.event);
    pending_.clear();
    if (comm_ != nullptr) {
      // Finalize flushes outstanding work; on a broken communicator abort
      // instead. Nothing here throws: a failed query counts as broken.
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &async) != ncclSuccess) async = ncclInternalError;
      if (async == ncclSuccess && ncclCommFinalize(comm_) == ncclSuccess) {
        auto start = Clock::now();
        do {
          if (ncclCommGetAsyncError(comm_, &async) != ncclSuccess) async = ncclInternalError;
        } while (async == ncclInProgress && Clock::now() - start < std::chrono::seconds(10));
      }
      if (async == ncclSuccess) {
        const ncclResult_t rc = ncclCommDestroy(comm_);
        if (rc != ncclSuccess)
          spdlog::warn("{}", nccl_failure_text(__FILE__, __LINE__, "ncclCommDestroy(comm_)", rc, nullptr));
      } else {
        abort_quietly(comm_);
      }
      comm_ = nullptr;
    }
  }

  const char* backend() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce(at::Tensor& tensor, const AllReduceOptions& options) override {
    require_cuda(tensor, "all_reduce");
    stats_.record(CollectiveKind::AllReduce, nbytes(tensor));
    if (tensor.numel() == 0) return;
    at::Tensor work = tensor.is_contiguous() ? tensor : tensor.contiguous();
    auto stream = at::cuda::getCurrentCUDAStream(device_);
    const ncclDataType_t type = nccl_type(work, name_);
    const ncclRedOp_t op = options.op == ReduceOp::Sum ? ncclSum : ncclMax;
    const size_t count = static_cast<size_t>(work.numel());
    TPRUN_NCCL_ENQUEUE(ncclAllReduce(work.data_ptr(), work.data_ptr(), count, type, op, comm_, stream.stream()));
    track(stream.stream(), "all_reduce");
    if (!work.is_same(tensor)) tensor.copy_(work);
  }

  at::Tensor all_gather(const at::Tensor& tensor, const AllGatherOptions& options) override {
    require_cuda(tensor, "all_gather");
    const int64_t dim = options.dim < 0 ? options.dim + tensor.dim() : options.dim;
    if (tensor.dim() == 0 || dim < 0 || dim >= tensor.dim())
      throw CommError(fmt::format("all_gather on group {}: dim {} is out of range", name_, options.dim));
    stats_.record(CollectiveKind::AllGather, nbytes(tensor));
    at::Tensor src = tensor.contiguous();
    std::vector<int64_t> stacked_shape{size_};
    for (auto s : src.sizes()) stacked_shape.push_back(s);
    at::Tensor stacked = at::empty(stacked_shape, src.options());
    if (src.numel() > 0) {
      auto stream = at::cuda::getCurrentCUDAStream(device_);
      const ncclDataType_t type = nccl_type(src, name_);
      const size_t count = static_cast<size_t>(src.numel());
      TPRUN_NCCL_ENQUEUE(ncclAllGather(src.data_ptr(), stacked.data_ptr(), count, type, comm_, stream.stream()));
      track(stream.stream(), "all_gather");
    }
    if (dim == 0) {
      std::vector<int64_t> out(src.sizes().begin(), src.sizes().end());
      out[0] *= size_;
      return stacked.reshape(out);
    }
    return at::cat(stacked.unbind(0), dim);
  }

  void broadcast(at::Tensor& tensor, const BroadcastOptions& options) override {
    require_cuda(tensor, "broadcast");
    if (options.root < 0 || options.root >= size_)
      throw CommError(fmt::format("broadcast on group {}: root {} out of range", name_, options.root));
    stats_.record(CollectiveKind::Broadcast, nbytes(tensor));
    if (tensor.numel() == 0) return;
    at::Tensor work = tensor.is_contiguous() ? tensor : tensor.contiguous();
    auto stream = at::cuda::getCurrentCUDAStream(device_);
    const ncclDataType_t type = nccl_type(work, name_);
    const size_t count = static_cast<size_t>(work.numel());
    TPRUN_NCCL_ENQUEUE(
        ncclBroadcast(work.data_ptr(), work.data_ptr(), count, type, options.root, comm_, stream.stream()));
    track(stream.stream(), "broadcast");
    if (!work.is_same(tensor)) tensor.copy_(work);
  }

  void barrier() override {
    stats_.record(CollectiveKind::Barrier, 0);
    at::Tensor one = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, device_));
    auto stream = at::cuda::getCurrentCUDAStream(device_);
    TPRUN_NCCL_ENQUEUE(ncclAllReduce(one.data_ptr(), one.data_ptr(), 1, ncclFloat32, ncclSum, comm_, stream.stream()));
    // Wait on the host, polling for asynchronous errors with the deadline.
    auto start = Clock::now();
    while (true) {
      const cudaError_t q = cudaStreamQuery(stream.stream());
      if (q == cudaSuccess) break;
      // Not ready is the answer the loop waits through, not an error.
      if (q != cudaErrorNotReady) throw_cuda_failure(__FILE__, __LINE__, "cudaStreamQuery(stream.stream())", q);
      std::string err = async_error();
      if (!err.empty()) throw CommError(err);
      if (Clock::now() - start > timeout_) {
        abort_quietly(comm_);
        comm_ = nullptr;
        throw CommError(fmt::format("barrier on group {} timed out after {} s; communicator aborted",
                                    name_, timeout_.count() / 1000));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  struct Work {
    cudaEvent_t event;
    Clock::time_point start;
    const char* what;
  };

  void require_cuda(const at::Tensor& t, const char* what) const {
    if (!t.defined() || !t.is_cuda() || t.get_device() != device_) {
      throw CommError(fmt::format("{} on group {}: the NCCL backend takes tensors on cuda:{}", what,
                                  name_, device_));
    }
    if (comm_ == nullptr) throw CommError(fmt::format("{} on group {}: communicator was aborted", what, name_));
  }

  // Non-blocking communicators may answer ncclInProgress; wait for the
  // enqueue. Failures are reported like TPRUN_NCCL_CHECK's, naming the call.
  void enqueue(const char* file, int line, const char* call, ncclResult_t rc) {
    if (rc == ncclSuccess) return;
    if (rc != ncclInProgress) {
      throw CommError(fmt::format("group {}: {}", name_,
                                  nccl_failure_text(file, line, call, rc, nccl_last_error(comm_))));
    }
    wait_ready(file, line, call);
  }

  void wait_ready(const char* file, int line, const char* call) {
    auto start = Clock::now();
    while (true) {
      ncclResult_t state = ncclInProgress;
      TPRUN_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state), comm_);
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) {
        std::string text = nccl_failure_text(file, line, call, state, nccl_last_error(comm_));
        abort_quietly(comm_);
        comm_ = nullptr;
        throw CommError(fmt::format("group {}: {}", name_, text));
      }
      if (Clock::now() - start > timeout_) {
        abort_quietly(comm_);
        comm_ = nullptr;
        throw CommError(fmt::format("group {}: {}", name_,
                                    failed_call_message(file, line, call,
                                                        fmt::format("did not complete within {} s; "
                                                                    "communicator aborted",
                                                                    timeout_.count() / 1000))));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  void track(cudaStream_t stream, const char* what) {
    if (watchdog_ == nullptr) return;
    cudaEvent_t ev;
    TPRUN_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    try {
      TPRUN_CUDA_CHECK(cudaEventRecord(ev, stream));
    } catch (...) {
      destroy_event_quietly(ev);
      throw;
    }
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back({ev, Clock::now(), what});
  }

  // "" while healthy, else the error as text. Never throws: the watchdog
  // thread calls it too.
  std::string async_error() {
    if (comm_ == nullptr) return fmt::format("NCCL communicator {} was aborted", name_);
    ncclResult_t state = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm_, &state);
    if (rc != ncclSuccess) {
      return fmt::format("NCCL communicator {}: {}", name_,
                         nccl_failure_text(__FILE__, __LINE__, "ncclCommGetAsyncError(comm_, &state)", rc,
                                           nccl_last_error(comm_)));
    }
    if (state == ncclSuccess || state == ncclInProgress) return "";
    return fmt::format("NCCL communicator {} reported: {}", name_,
                       nccl_failure_text(__FILE__, __LINE__, "ncclCommGetAsyncError(comm_, &state)", state,
                                         nccl_last_error(comm_)));
  }

  // Called from the watchdog thread.
  std::string poll() {
    std::lock_guard<std::mutex> lock(mu_);
    if (comm_ == nullptr) return "";
    std::string err = async_error();
    if (!err.empty()) {
      abort_quietly(comm_);
      comm_ = nullptr;
      return err;
    }
    while (!pending_.empty()) {
      Work& w = pending_.front();
      const cudaError_t q = cudaEventQuery(w.event);
      if (q == cudaSuccess) {
        destroy_event_quietly(w.event);
        pending_.pop_front();
        continue;
      }
      if (q != cudaErrorNotReady) {
        (void)cudaGetLastError();  // reported here; keep it from a later, unrelated check
        return fmt::format("while waiting for {} on group {}: {}", w.what, name_,
                           cuda_failure_text(__FILE__, __LINE__, "cudaEventQuery(w.event)", q));
      }
      if (Clock::now() - w.start > timeout_) {
        abort_quietly(comm_);
        comm_ = nullptr;
        return fmt::format("{} on group {} did not complete within {} s: a peer is stuck or dead; "
                           "communicator aborted",
                           w.what, name_, timeout_.count() / 1000);
      }
      break;
    }
    return "";
  }

  int device_;
  CommWatchdog* watchdog_;
  int rank_ = 0;
  int size_ = 1;
  std::chrono::milliseconds timeout_;
  ncclComm_t comm_ = nullptr;
  int poll_id_ = 0;
  std::mutex mu_;
  std::deque<Work> pending_;
};

}  // namespace

bool nccl_compiled() { return true; }

std::unique_ptr<Communicator> make_nccl_communicator(MpiCommunicator& bootstrap, int cuda_device,
                                                     CommWatchdog* watchdog) {
  return std::make_unique<NcclCommunicator>(bootstrap, cuda_device, watchdog);
}

}  // namespace tprun::dist

#else  // !TPRUN_HAVE_NCCL

namespace tprun::dist {

bool nccl_compiled() { return false; }

std::unique_ptr<Communicator> make_nccl_communicator(MpiCommunicator& bootstrap, int, CommWatchdog*) {
  throw CommError(fmt::format(
      "group {} needs NCCL for CUDA tensors, but this tprun was built without NCCL (libtorch "
      "without CUDA, or nccl.h not found at configure time)",
      bootstrap.name()));
}

}  // namespace tprun::dist

#endif
