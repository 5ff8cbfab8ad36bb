#pragma once
// MPI has no fp16/bf16 types. Two ways to reduce them, both widening each
// element to fp32 block by block (never a whole-tensor conversion):
//
//  * half_all_reduce (what MpiCommunicator uses): a reduce-scatter done with
//    MPI_Alltoallv, where the owner of each chunk accumulates every rank's
//    contribution in fp32, in rank order, and rounds once to nearest-even;
//    then MPI_Allgatherv of the reduced chunks. Same bytes on the wire as a
//    ring all-reduce, one rounding instead of one per hop, and bitwise
//    identical results on every rank by construction.
//  * mpi_half_op: a committed 2-byte datatype with user-defined commutative
//    MPI ops for MPI_Allreduce (each pairwise combine rounds). Kept as the
//    "bare MPI" baseline of `tprun bench collectives`.

#include <cstdint>

#include <mpi.h>

namespace tprun::dist {

enum class HalfKind { Float16, BFloat16 };
enum class ReduceOp;

// The committed 2-byte datatype used for both 16-bit kinds.
MPI_Datatype mpi_half_datatype();
// The MPI_Op for (kind, op); created once, freed at MPI_Finalize.
MPI_Op mpi_half_op(HalfKind kind, ReduceOp op);

// In place over `comm`: data[0..n) = op over ranks, accumulated in fp32.
void half_all_reduce(MPI_Comm comm, uint16_t* data, int64_t n, HalfKind kind, ReduceOp op);

// The combine kernels, exposed for tests: inout[i] = op(in[i], inout[i]).
void half_combine(HalfKind kind, ReduceOp op, const uint16_t* in, uint16_t* inout, int64_t n);

}  // namespace tprun::dist
