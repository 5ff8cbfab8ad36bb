#pragma once
// The "bare MPI" baseline of `tprun bench collectives`: MPI_Allreduce (sum) in
// place over MPI_COMM_WORLD with nothing of tprun's around it (no watchdog, no
// chunking, no statistics), so the bench can set Communicator::all_reduce
// against what MPI alone offers. fp32 goes as MPI_FLOAT; the 16-bit types
// through the user-defined op on a 2-byte datatype (half_reduce.h,
// mpi_half_op). It lives in dist/ so that no layer above calls MPI itself.
// A benchmark tool only: a peer that never arrives hangs it.

#include <mpi.h>

namespace at {
class Tensor;
}

namespace tprun::dist {

class BareAllReduce {
 public:
  // `tensor`: a contiguous CPU fp32, bf16 or fp16 tensor of fewer than 2^31
  // elements, reduced in place by every call (it must outlive this object).
  explicit BareAllReduce(at::Tensor& tensor);
  // One MPI_Allreduce; collective over MPI_COMM_WORLD.
  void operator()();

 private:
  void* data_ = nullptr;
  int count_ = 0;
  MPI_Datatype type_ = MPI_FLOAT;
  MPI_Op op_ = MPI_SUM;
};

}  // namespace tprun::dist
