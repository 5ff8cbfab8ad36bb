#include "dist/staged_mpi_communicator.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "dist/mpi_communicator.h"
#include "runtime/error.h"

#ifdef TPRUN_TORCH_HAS_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "runtime/cuda_check.h"
#endif

namespace tprun::dist {
namespace {

uint64_t nbytes(const at::Tensor& t) { return static_cast<uint64_t>(t.numel()) * t.element_size(); }

// The pinned buffer grows in whole MiB, so slowly growing tensors (a longer
// prompt) do not reallocate it on every call.
constexpr size_t kGrain = size_t{1} << 20;

bool on_cuda(const at::Tensor& t) { return t.defined() && t.is_cuda(); }

#ifdef TPRUN_TORCH_HAS_CUDA
// Copies `bytes` between a CUDA tensor and host memory on the CUDA tensor's
// current stream and waits for the copy.
void copy_and_wait(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, const at::Tensor& cuda_tensor) {
  if (bytes == 0) return;
  c10::cuda::CUDAGuard guard(cuda_tensor.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(cuda_tensor.get_device()).stream();
  TPRUN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream));
  TPRUN_CUDA_CHECK(cudaStreamSynchronize(stream));
}
#endif

void copy_to_host(const at::Tensor& device, at::Tensor& host) {
#ifdef TPRUN_TORCH_HAS_CUDA
  copy_and_wait(host.data_ptr(), device.data_ptr(), nbytes(device), cudaMemcpyDeviceToHost, device);
#else
  throw CommError("staged MPI communicator: CUDA tensor in a build without CUDA");
#endif
}

void copy_to_device(const at::Tensor& host, at::Tensor& device) {
#ifdef TPRUN_TORCH_HAS_CUDA
  copy_and_wait(device.data_ptr(), host.data_ptr(), nbytes(host), cudaMemcpyHostToDevice, device);
#else
  throw CommError("staged MPI communicator: CUDA tensor in a build without CUDA");
#endif
}

}  // namespace

StagedMpiCommunicator::StagedMpiCommunicator(std::unique_ptr<MpiCommunicator> mpi)
    : Communicator(mpi ? mpi->name() : std::string()), mpi_(std::move(mpi)) {
  if (!mpi_) throw Error(Error::Kind::Internal, "StagedMpiCommunicator needs an MPI communicator");
}

StagedMpiCommunicator::~StagedMpiCommunicator() {
#ifdef TPRUN_TORCH_HAS_CUDA
  if (pinned_ != nullptr) {
    // Never throws: at process exit the CUDA runtime may be unloading already.
    const cudaError_t rc = cudaFreeHost(pinned_);
    if (rc != cudaSuccess) {
      spdlog::debug("{}", cuda_failure_text(__FILE__, __LINE__, "cudaFreeHost(pinned_)", rc));
      (void)cudaGetLastError();
    }
  }
#endif
}

int StagedMpiCommunicator::rank() const { return mpi_->rank(); }
int StagedMpiCommunicator::size() const { return mpi_->size(); }

at::Tensor StagedMpiCommunicator::host_view(const at::Tensor& like) {
  const auto cpu = at::TensorOptions().dtype(like.scalar_type()).device(at::kCPU);
  const size_t bytes = nbytes(like);
  if (bytes == 0) return at::empty(like.sizes(), cpu);
#ifdef TPRUN_TORCH_HAS_CUDA
  if (bytes > capacity_) {
    // Every copy out of the buffer was waited for, so nothing reads it now.
    if (pinned_ != nullptr) TPRUN_CUDA_CHECK(cudaFreeHost(pinned_));
    pinned_ = nullptr;
    capacity_ = 0;
    const size_t grown = (bytes + kGrain - 1) / kGrain * kGrain;
    TPRUN_CUDA_CHECK(cudaHostAlloc(&pinned_, grown, cudaHostAllocPortable));
    capacity_ = grown;
    spdlog::debug("group {}: {} MiB of pinned host memory for staged collectives", name_, capacity_ >> 20);
  }
  return at::from_blob(pinned_, like.sizes(), cpu);
#else
  throw CommError(fmt::format("group {}: CUDA tensor in a build without CUDA", name_));
#endif
}

void StagedMpiCommunicator::all_reduce(at::Tensor& tensor, const AllReduceOptions& options) {
  if (!on_cuda(tensor)) {
    mpi_->all_reduce(tensor, options);
  } else {
    at::Tensor work = tensor.contiguous();
    at::Tensor host = host_view(work);
    copy_to_host(work, host);
    mpi_->all_reduce(host, options);
    copy_to_device(host, work);
    if (!work.is_same(tensor)) tensor.copy_(work);
  }
  stats_.record(CollectiveKind::AllReduce, nbytes(tensor));
}

at::Tensor StagedMpiCommunicator::all_gather(const at::Tensor& tensor, const AllGatherOptions& options) {
  at::Tensor out;
  if (!on_cuda(tensor)) {
    out = mpi_->all_gather(tensor, options);
  } else {
    at::Tensor src = tensor.contiguous();
    at::Tensor host = host_view(src);
    copy_to_host(src, host);
    // The gathered tensor is the MPI communicator's own (pageable) host
    // tensor: the buffer holds one tensor, and the result is size() times larger.
    const at::Tensor gathered = mpi_->all_gather(host, options).contiguous();
    out = at::empty(gathered.sizes(), tensor.options());
    copy_to_device(gathered, out);
  }
  stats_.record(CollectiveKind::AllGather, nbytes(tensor));
  return out;
}

void StagedMpiCommunicator::broadcast(at::Tensor& tensor, const BroadcastOptions& options) {
  if (!on_cuda(tensor)) {
    mpi_->broadcast(tensor, options);
  } else {
    const bool root = mpi_->rank() == options.root;
    at::Tensor work = tensor.contiguous();
    at::Tensor host = host_view(work);
    // Only the root's bytes travel; the other ranks' are overwritten, and
    // the root's tensor is already the result.
    if (root) copy_to_host(work, host);
    mpi_->broadcast(host, options);
    if (!root) {
      copy_to_device(host, work);
      if (!work.is_same(tensor)) tensor.copy_(work);
    }
  }
  stats_.record(CollectiveKind::Broadcast, nbytes(tensor));
}

void StagedMpiCommunicator::barrier() {
  mpi_->barrier();
  stats_.record(CollectiveKind::Barrier, 0);
}

}  // namespace tprun::dist
