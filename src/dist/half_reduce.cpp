#include "dist/half_reduce.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "dist/communicator.h"
#include "dist/mpi_world.h"

namespace tprun::dist {
namespace {

constexpr int64_t kBlock = 512;

// Functors (not function pointers) so that the block loops inline and vectorise.
struct Bf16ToF32 {
  float operator()(uint16_t v) const {
    uint32_t bits = static_cast<uint32_t>(v) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
  }
};

struct F32ToBf16 {
  uint16_t operator()(float f) const {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof(bits));
    // Round to nearest even; NaN stays a (quiet) NaN.
    const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
    return static_cast<uint16_t>(nan ? 0x7fc0u : rounded);
  }
};

struct Fp16ToF32 {
  float operator()(uint16_t v) const { return c10::detail::fp16_ieee_to_fp32_value(v); }
};
struct F32ToFp16 {
  uint16_t operator()(float f) const { return c10::detail::fp16_ieee_from_fp32_value(f); }
};

struct Add {
  float operator()(float x, float y) const { return x + y; }
};
// Max that propagates NaN like torch.max does.
struct NanMax {
  float operator()(float x, float y) const {
    return (x != x || y != y) ? NAN : (x > y ? x : y);
  }
};

template <typename Widen, typename Narrow, typename Combine>
inline void combine_blocks(const uint16_t* in, uint16_t* inout, int64_t n, Widen widen,
                           Narrow narrow, Combine combine) {
  float a[kBlock];
  float b[kBlock];
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t m = std::min(kBlock, n - start);
    for (int64_t i = 0; i < m; ++i) a[i] = widen(in[start + i]);
    for (int64_t i = 0; i < m; ++i) b[i] = widen(inout[start + i]);
    for (int64_t i = 0; i < m; ++i) b[i] = combine(a[i], b[i]);
    for (int64_t i = 0; i < m; ++i) inout[start + i] = narrow(b[i]);
  }
}

void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  combine_blocks(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(inout), *len,
                 Bf16ToF32{}, F32ToBf16{}, Add{});
}
void bf16_max(void* in, void* inout, int* len, MPI_Datatype*) {
  combine_blocks(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(inout), *len,
                 Bf16ToF32{}, F32ToBf16{}, NanMax{});
}
void fp16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  combine_blocks(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(inout), *len,
                 Fp16ToF32{}, F32ToFp16{}, Add{});
}
void fp16_max(void* in, void* inout, int* len, MPI_Datatype*) {
  combine_blocks(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(inout), *len,
                 Fp16ToF32{}, F32ToFp16{}, NanMax{});
}

struct HalfOps {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Op ops[2][2] = {{MPI_OP_NULL, MPI_OP_NULL}, {MPI_OP_NULL, MPI_OP_NULL}};
};

// Freed by MPI_Finalize through a keyval delete callback on MPI_COMM_SELF.
int free_half_ops(MPI_Comm, int, void* attr, void*) {
  auto* ops = static_cast<HalfOps*>(attr);
  for (auto& row : ops->ops)
    for (auto& op : row)
      if (op != MPI_OP_NULL) MPI_Op_free(&op);
  if (ops->type != MPI_DATATYPE_NULL) MPI_Type_free(&ops->type);
  delete ops;
  return MPI_SUCCESS;
}

HalfOps* half_ops() {
  static std::once_flag once;
  static HalfOps* ops = nullptr;
  std::call_once(once, [] {
    ops = new HalfOps();
    check_mpi(MPI_Type_contiguous(2, MPI_BYTE, &ops->type), "MPI_Type_contiguous(half)");
    check_mpi(MPI_Type_commit(&ops->type), "MPI_Type_commit(half)");
    check_mpi(MPI_Op_create(&fp16_sum, 1, &ops->ops[0][0]), "MPI_Op_create(fp16 sum)");
    check_mpi(MPI_Op_create(&fp16_max, 1, &ops->ops[0][1]), "MPI_Op_create(fp16 max)");
    check_mpi(MPI_Op_create(&bf16_sum, 1, &ops->ops[1][0]), "MPI_Op_create(bf16 sum)");
    check_mpi(MPI_Op_create(&bf16_max, 1, &ops->ops[1][1]), "MPI_Op_create(bf16 max)");
    int key = MPI_KEYVAL_INVALID;
    MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &free_half_ops, &key, nullptr);
    MPI_Comm_set_attr(MPI_COMM_SELF, key, ops);
  });
  return ops;
}

// out[i] = narrow(op over j of widen(src[j][i])), j in rank order.
template <typename Widen, typename Narrow, typename Combine>
void accumulate_sources(const std::vector<const uint16_t*>& src, uint16_t* out, int64_t n,
                        Widen widen, Narrow narrow, Combine combine) {
  float acc[kBlock];
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t m = std::min(kBlock, n - start);
    const uint16_t* s0 = src[0] + start;
    for (int64_t i = 0; i < m; ++i) acc[i] = widen(s0[i]);
    for (size_t j = 1; j < src.size(); ++j) {
      const uint16_t* sj = src[j] + start;
      for (int64_t i = 0; i < m; ++i) acc[i] = combine(acc[i], widen(sj[i]));
    }
    for (int64_t i = 0; i < m; ++i) out[start + i] = narrow(acc[i]);
  }
}

void accumulate(HalfKind kind, ReduceOp op, const std::vector<const uint16_t*>& src, uint16_t* out,
                int64_t n) {
  if (kind == HalfKind::BFloat16) {
    if (op == ReduceOp::Sum)
      accumulate_sources(src, out, n, Bf16ToF32{}, F32ToBf16{}, Add{});
    else
      accumulate_sources(src, out, n, Bf16ToF32{}, F32ToBf16{}, NanMax{});
  } else {
    if (op == ReduceOp::Sum)
      accumulate_sources(src, out, n, Fp16ToF32{}, F32ToFp16{}, Add{});
    else
      accumulate_sources(src, out, n, Fp16ToF32{}, F32ToFp16{}, NanMax{});
  }
}

}  // namespace

void half_all_reduce(MPI_Comm comm, uint16_t* data, int64_t n, HalfKind kind, ReduceOp op) {
  int rank = 0, size = 1;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  if (size == 1 || n == 0) return;
  // Chunk c = [offset[c], offset[c] + count[c]) is reduced by rank c.
  std::vector<int> count(static_cast<size_t>(size)), offset(static_cast<size_t>(size));
  const int64_t base = n / size, extra = n % size;
  int64_t pos = 0;
  for (int c = 0; c < size; ++c) {
    const int64_t len = base + (c < extra ? 1 : 0);
    if (pos > INT32_MAX || len > INT32_MAX) throw std::length_error("half_all_reduce chunk too large");
    count[static_cast<size_t>(c)] = static_cast<int>(len);
    offset[static_cast<size_t>(c)] = static_cast<int>(pos);
    pos += len;
  }
  const int mine = count[static_cast<size_t>(rank)];
  // Receive every rank's copy of my chunk, in rank order, into a buffer kept
  // between calls (a fresh allocation per call costs page faults).
  thread_local std::vector<uint16_t> recv_buffer;
  const size_t need = static_cast<size_t>(mine) * static_cast<size_t>(size);
  if (recv_buffer.size() < need) recv_buffer.resize(need);
  uint16_t* recv = recv_buffer.data();
  std::vector<int> rcount(static_cast<size_t>(size), mine), roffset(static_cast<size_t>(size));
  for (int j = 0; j < size; ++j) roffset[static_cast<size_t>(j)] = j * mine;
  MPI_Datatype t = mpi_half_datatype();
  check_mpi(MPI_Alltoallv(data, count.data(), offset.data(), t, recv, rcount.data(),
                          roffset.data(), t, comm),
            "MPI_Alltoallv(reduce-scatter)");
  std::vector<const uint16_t*> src(static_cast<size_t>(size));
  for (int j = 0; j < size; ++j) src[static_cast<size_t>(j)] = recv + static_cast<size_t>(j) * mine;
  accumulate(kind, op, src, data + offset[static_cast<size_t>(rank)], mine);
  check_mpi(MPI_Allgatherv(MPI_IN_PLACE, 0, t, data, count.data(), offset.data(), t, comm),
            "MPI_Allgatherv(all-gather)");
}

MPI_Datatype mpi_half_datatype() { return half_ops()->type; }

MPI_Op mpi_half_op(HalfKind kind, ReduceOp op) {
  return half_ops()->ops[kind == HalfKind::BFloat16 ? 1 : 0][op == ReduceOp::Max ? 1 : 0];
}

void half_combine(HalfKind kind, ReduceOp op, const uint16_t* in, uint16_t* inout, int64_t n) {
  if (kind == HalfKind::BFloat16) {
    if (op == ReduceOp::Sum)
      combine_blocks(in, inout, n, Bf16ToF32{}, F32ToBf16{}, Add{});
    else
      combine_blocks(in, inout, n, Bf16ToF32{}, F32ToBf16{}, NanMax{});
  } else {
    if (op == ReduceOp::Sum)
      combine_blocks(in, inout, n, Fp16ToF32{}, F32ToFp16{}, Add{});
    else
      combine_blocks(in, inout, n, Fp16ToF32{}, F32ToFp16{}, NanMax{});
  }
}

}  // namespace tprun::dist
