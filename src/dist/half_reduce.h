#pragma once
// MPI has no fp16/bf16 types. tprun reduces them with a committed 2-byte MPI
// datatype and user-defined, commutative MPI ops that widen each element to
// fp32, combine, and round back to nearest-even, element block by element
// block: no whole-tensor conversion, no extra copy.

#include <cstdint>

#include <mpi.h>

namespace tprun::dist {

enum class HalfKind { Float16, BFloat16 };
enum class ReduceOp;

// The committed 2-byte datatype used for both 16-bit kinds.
MPI_Datatype mpi_half_datatype();
// The MPI_Op for (kind, op); created once, freed at MPI_Finalize.
MPI_Op mpi_half_op(HalfKind kind, ReduceOp op);

// The combine kernels, exposed for tests: inout[i] = op(in[i], inout[i]).
void half_combine(HalfKind kind, ReduceOp op, const uint16_t* in, uint16_t* inout, int64_t n);

}  // namespace tprun::dist
