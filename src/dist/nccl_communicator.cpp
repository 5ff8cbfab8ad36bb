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

namespace tprun::dist {
namespace {

using Clock = std::chrono::steady_clock;

std::string nccl_error_text(ncclComm_t comm, ncclResult_t rc) {
  std::string text = ncclGetErrorString(rc);
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && *last != '\0') text += fmt::format(" ({})", last);
  }
  return text;
}

void check_cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw CommError(fmt::format("{} failed: {}", what, cudaGetErrorString(rc)));
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
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    ncclUniqueId id;
    if (rank_ == 0) {
      ncclResult_t rc = ncclGetUniqueId(&id);
      if (rc != ncclSuccess)
        throw CommError(fmt::format("ncclGetUniqueId failed: {}", ncclGetErrorString(rc)));
    }
    check_mpi(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, bootstrap.handle()), "MPI_Bcast(ncclUniqueId)");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t rc = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
    if (rc != ncclSuccess && rc != ncclInProgress) {
      throw CommError(fmt::format("ncclCommInitRankConfig on group {} failed: {}", name_,
                                  nccl_error_text(comm_, rc)));
    }
    wait_ready("ncclCommInitRankConfig");
    if (watchdog_ != nullptr) poll_id_ = watchdog_->add_poll([this] { return poll(); });
    spdlog::debug("NCCL communicator {} ready: rank {}/{} on cuda:{}", name_, rank_, size_, device_);
  }

  ~NcclCommunicator() override {
    if (watchdog_ != nullptr && poll_id_ != 0) watchdog_->remove_poll(poll_id_);
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& w : pending_) cudaEventDestroy(w.event);
    pending_.clear();
    if (comm_ != nullptr) {
      // Finalize flushes outstanding work; on a broken communicator abort instead.
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async == ncclSuccess && ncclCommFinalize(comm_) == ncclSuccess) {
        auto start = Clock::now();
        do {
          ncclCommGetAsyncError(comm_, &async);
        } while (async == ncclInProgress && Clock::now() - start < std::chrono::seconds(10));
      }
      if (async == ncclSuccess)
        ncclCommDestroy(comm_);
      else
        ncclCommAbort(comm_);
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
    enqueue("ncclAllReduce", ncclAllReduce(work.data_ptr(), work.data_ptr(),
                                           static_cast<size_t>(work.numel()), nccl_type(work, name_),
                                           options.op == ReduceOp::Sum ? ncclSum : ncclMax, comm_,
                                           stream.stream()));
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
      enqueue("ncclAllGather",
              ncclAllGather(src.data_ptr(), stacked.data_ptr(), static_cast<size_t>(src.numel()),
                            nccl_type(src, name_), comm_, stream.stream()));
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
    enqueue("ncclBroadcast", ncclBroadcast(work.data_ptr(), work.data_ptr(),
                                           static_cast<size_t>(work.numel()), nccl_type(work, name_),
                                           options.root, comm_, stream.stream()));
    track(stream.stream(), "broadcast");
    if (!work.is_same(tensor)) tensor.copy_(work);
  }

  void barrier() override {
    stats_.record(CollectiveKind::Barrier, 0);
    at::Tensor one = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, device_));
    auto stream = at::cuda::getCurrentCUDAStream(device_);
    enqueue("ncclAllReduce(barrier)", ncclAllReduce(one.data_ptr(), one.data_ptr(), 1, ncclFloat32,
                                                    ncclSum, comm_, stream.stream()));
    // Wait on the host, polling for asynchronous errors with the deadline.
    auto start = Clock::now();
    while (true) {
      cudaError_t q = cudaStreamQuery(stream.stream());
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) check_cuda(q, "cudaStreamQuery(barrier)");
      std::string err = async_error();
      if (!err.empty()) throw CommError(err);
      if (Clock::now() - start > timeout_) {
        ncclCommAbort(comm_);
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

  // Non-blocking communicators may answer ncclInProgress; wait for the enqueue.
  void enqueue(const char* what, ncclResult_t rc) {
    if (rc == ncclSuccess) return;
    if (rc != ncclInProgress)
      throw CommError(fmt::format("{} on group {} failed: {}", what, name_, nccl_error_text(comm_, rc)));
    wait_ready(what);
  }

  void wait_ready(const char* what) {
    auto start = Clock::now();
    ncclResult_t state = ncclInProgress;
    while (true) {
      ncclCommGetAsyncError(comm_, &state);
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) {
        std::string text = nccl_error_text(comm_, state);
        ncclCommAbort(comm_);
        comm_ = nullptr;
        throw CommError(fmt::format("{} on group {} failed: {}", what, name_, text));
      }
      if (Clock::now() - start > timeout_) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        throw CommError(fmt::format("{} on group {} did not complete within {} s; communicator "
                                    "aborted",
                                    what, name_, timeout_.count() / 1000));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  void track(cudaStream_t stream, const char* what) {
    if (watchdog_ == nullptr) return;
    cudaEvent_t ev;
    check_cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventRecord(ev, stream), "cudaEventRecord");
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back({ev, Clock::now(), what});
  }

  std::string async_error() {
    if (comm_ == nullptr) return fmt::format("NCCL communicator {} was aborted", name_);
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm_, &state);
    if (state == ncclSuccess || state == ncclInProgress) return "";
    return fmt::format("NCCL communicator {} reported: {}", name_, nccl_error_text(comm_, state));
  }

  // Called from the watchdog thread.
  std::string poll() {
    std::lock_guard<std::mutex> lock(mu_);
    if (comm_ == nullptr) return "";
    std::string err = async_error();
    if (!err.empty()) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
      return err;
    }
    while (!pending_.empty()) {
      Work& w = pending_.front();
      cudaError_t q = cudaEventQuery(w.event);
      if (q == cudaSuccess) {
        cudaEventDestroy(w.event);
        pending_.pop_front();
        continue;
      }
      if (q != cudaErrorNotReady) return fmt::format("CUDA error while waiting for {} on group {}: {}", w.what, name_, cudaGetErrorString(q));
      if (Clock::now() - w.start > timeout_) {
        ncclCommAbort(comm_);
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
