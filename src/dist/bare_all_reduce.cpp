#include "dist/bare_all_reduce.h"

#include <climits>

#include <ATen/core/Tensor.h>
#include <fmt/format.h>

#include "dist/communicator.h"
#include "dist/half_reduce.h"
#include "runtime/error.h"

namespace tprun::dist {

BareAllReduce::BareAllReduce(at::Tensor& tensor) {
  const at::ScalarType dt = tensor.scalar_type();
  if (!tensor.device().is_cpu() || !tensor.is_contiguous() || tensor.numel() > INT_MAX ||
      (dt != at::kFloat && dt != at::kBFloat16 && dt != at::kHalf)) {
    throw Error(Error::Kind::Internal,
                fmt::format("bare all_reduce: takes a contiguous CPU fp32, bf16 or fp16 tensor of under 2^31 "
                            "elements, got {} on {}",
                            c10::toString(dt), tensor.device().str()));
  }
  data_ = tensor.data_ptr();
  count_ = static_cast<int>(tensor.numel());
  if (dt != at::kFloat) {
    type_ = mpi_half_datatype();
    op_ = mpi_half_op(dt == at::kHalf ? HalfKind::Float16 : HalfKind::BFloat16, ReduceOp::Sum);
  }
}

void BareAllReduce::operator()() { MPI_Allreduce(MPI_IN_PLACE, data_, count_, type_, op_, MPI_COMM_WORLD); }

}  // namespace tprun::dist
