#include "dist/mpi_communicator.h"

#include <algorithm>
#include <climits>

#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <fmt/format.h>

#include "dist/comm_watchdog.h"
#include "dist/half_reduce.h"
#include "dist/mpi_world.h"
#include "runtime/error.h"

namespace tprun::dist {
namespace {

// Elements per MPI call: keeps counts inside int for any tensor size.
constexpr int64_t kMaxChunk = int64_t{1} << 30;

struct MpiReduceType {
  MPI_Datatype type;
  MPI_Op op;
};

MpiReduceType reduce_type_for(const at::Tensor& t, ReduceOp op, const std::string& group) {
  const MPI_Op builtin = op == ReduceOp::Sum ? MPI_SUM : MPI_MAX;
  switch (t.scalar_type()) {
    case at::kFloat: return {MPI_FLOAT, builtin};
    case at::kDouble: return {MPI_DOUBLE, builtin};
    case at::kHalf: return {mpi_half_datatype(), mpi_half_op(HalfKind::Float16, op)};
    case at::kBFloat16: return {mpi_half_datatype(), mpi_half_op(HalfKind::BFloat16, op)};
    case at::kInt: return {MPI_INT32_T, builtin};
    case at::kLong: return {MPI_INT64_T, builtin};
    case at::kShort: return {MPI_INT16_T, builtin};
    case at::kChar: return {MPI_INT8_T, builtin};
    case at::kByte: return {MPI_UINT8_T, builtin};
    default: break;
  }
  throw CommError(fmt::format("all_reduce on group {}: dtype {} is not supported by the MPI backend",
                              group, c10::toString(t.scalar_type())));
}

void require_cpu(const at::Tensor& t, const char* what, const std::string& group) {
  if (!t.defined()) throw CommError(fmt::format("{} on group {}: tensor is undefined", what, group));
  if (!t.device().is_cpu()) {
    throw CommError(fmt::format(
        "{} on group {}: the MPI backend takes CPU tensors, got one on {}; use the device "
        "communicator (NCCL) for CUDA tensors",
        what, group, t.device().str()));
  }
}

uint64_t nbytes(const at::Tensor& t) { return static_cast<uint64_t>(t.numel()) * t.element_size(); }

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name, CommWatchdog* watchdog)
    : Communicator(std::move(name)), comm_(comm), watchdog_(watchdog) {
  check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  if (comm_ != MPI_COMM_WORLD) MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
}

MpiCommunicator::~MpiCommunicator() {
  if (comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_NULL && !mpi_is_finalized()) {
    MPI_Comm_free(&comm_);
  }
}

void MpiCommunicator::all_reduce(at::Tensor& tensor, const AllReduceOptions& options) {
  require_cpu(tensor, "all_reduce", name_);
  const MpiReduceType rt = reduce_type_for(tensor, options.op, name_);
  stats_.record(CollectiveKind::AllReduce, nbytes(tensor));
  if (size_ == 1 || tensor.numel() == 0) return;
  at::Tensor work = tensor.is_contiguous() ? tensor : tensor.contiguous();
  auto* base = static_cast<char*>(work.data_ptr());
  const int64_t n = work.numel();
  const size_t elem = static_cast<size_t>(work.element_size());
  auto armed = CommWatchdog::Armed(watchdog_, "all_reduce", name_);
  if (work.scalar_type() == at::kHalf || work.scalar_type() == at::kBFloat16) {
    const HalfKind kind = work.scalar_type() == at::kHalf ? HalfKind::Float16 : HalfKind::BFloat16;
    // Segments of 4M elements: bounded scratch memory (8 MiB per rank) and
    // a working set that stays in cache; MPI counts stay in int.
    const int64_t step = int64_t{1} << 22;
    for (int64_t start = 0; start < n; start += step) {
      half_all_reduce(comm_, reinterpret_cast<uint16_t*>(base) + start, std::min(step, n - start),
                      kind, options.op);
    }
    if (!work.is_same(tensor)) tensor.copy_(work);
    return;
  }
  for (int64_t start = 0; start < n; start += kMaxChunk) {
    const int count = static_cast<int>(std::min(kMaxChunk, n - start));
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, base + static_cast<size_t>(start) * elem, count, rt.type,
                            rt.op, comm_),
              "MPI_Allreduce");
  }
  if (!work.is_same(tensor)) tensor.copy_(work);
}

at::Tensor MpiCommunicator::all_gather(const at::Tensor& tensor, const AllGatherOptions& options) {
  require_cpu(tensor, "all_gather", name_);
  const int64_t dim = options.dim < 0 ? options.dim + tensor.dim() : options.dim;
  if (tensor.dim() == 0 || dim < 0 || dim >= tensor.dim()) {
    throw CommError(fmt::format("all_gather on group {}: dim {} is out of range for a {}-d tensor",
                                name_, options.dim, tensor.dim()));
  }
  stats_.record(CollectiveKind::AllGather, nbytes(tensor));
  at::Tensor src = tensor.contiguous();
  std::vector<int64_t> stacked_shape{size_};
  for (auto s : src.sizes()) stacked_shape.push_back(s);
  at::Tensor stacked = at::empty(stacked_shape, src.options());
  const uint64_t bytes = nbytes(src);
  if (bytes > static_cast<uint64_t>(INT_MAX)) {
    throw CommError(fmt::format("all_gather on group {}: {} bytes per rank exceed the 2 GiB a "
                                "single MPI call takes; gather in pieces",
                                name_, bytes));
  }
  if (size_ == 1) {
    stacked.select(0, 0).copy_(src);
  } else {
    auto armed = CommWatchdog::Armed(watchdog_, "all_gather", name_);
    check_mpi(MPI_Allgather(src.data_ptr(), static_cast<int>(bytes), MPI_BYTE, stacked.data_ptr(),
                            static_cast<int>(bytes), MPI_BYTE, comm_),
              "MPI_Allgather");
  }
  if (dim == 0) {
    std::vector<int64_t> out_shape(src.sizes().begin(), src.sizes().end());
    out_shape[0] *= size_;
    return stacked.reshape(out_shape);
  }
  return at::cat(stacked.unbind(0), dim);
}

void MpiCommunicator::broadcast(at::Tensor& tensor, const BroadcastOptions& options) {
  require_cpu(tensor, "broadcast", name_);
  if (options.root < 0 || options.root >= size_) {
    throw CommError(fmt::format("broadcast on group {}: root {} is not a rank of a group of {}",
                                name_, options.root, size_));
  }
  stats_.record(CollectiveKind::Broadcast, nbytes(tensor));
  if (size_ == 1 || tensor.numel() == 0) return;
  at::Tensor work = tensor.is_contiguous() ? tensor : tensor.contiguous();
  auto* base = static_cast<char*>(work.data_ptr());
  const int64_t total = static_cast<int64_t>(nbytes(work));
  auto armed = CommWatchdog::Armed(watchdog_, "broadcast", name_);
  for (int64_t start = 0; start < total; start += kMaxChunk) {
    const int count = static_cast<int>(std::min(kMaxChunk, total - start));
    check_mpi(MPI_Bcast(base + start, count, MPI_BYTE, options.root, comm_), "MPI_Bcast");
  }
  if (!work.is_same(tensor)) tensor.copy_(work);
}

void MpiCommunicator::barrier() {
  stats_.record(CollectiveKind::Barrier, 0);
  if (size_ == 1) return;
  auto armed = CommWatchdog::Armed(watchdog_, "barrier", name_);
  check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
}

}  // namespace tprun::dist
