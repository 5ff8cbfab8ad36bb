#include "dist/half_reduce.h"

#include <cmath>
#include <cstring>
#include <mutex>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "dist/communicator.h"
#include "dist/mpi_world.h"

namespace tprun::dist {
namespace {

constexpr int64_t kBlock = 512;

inline float bf16_to_f32(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN stays NaN
  uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

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

inline float add(float x, float y) { return x + y; }
// Max that propagates NaN like torch.max does.
inline float nanmax(float x, float y) { return (x != x || y != y) ? NAN : (x > y ? x : y); }

inline float fp16_to_f32(uint16_t v) { return c10::detail::fp16_ieee_to_fp32_value(v); }
inline uint16_t f32_to_fp16(float f) { return c10::detail::fp16_ieee_from_fp32_value(f); }

void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  combine_blocks(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(inout), *len,
                 bf16_to_f32, f32_to_bf16, add);
}
void bf16_max(void* in, void* inout, int* len, MPI_Datatype*) {
  combine_blocks(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(inout), *len,
                 bf16_to_f32, f32_to_bf16, nanmax);
}
void fp16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  combine_blocks(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(inout), *len,
                 fp16_to_f32, f32_to_fp16, add);
}
void fp16_max(void* in, void* inout, int* len, MPI_Datatype*) {
  combine_blocks(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(inout), *len,
                 fp16_to_f32, f32_to_fp16, nanmax);
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

}  // namespace

MPI_Datatype mpi_half_datatype() { return half_ops()->type; }

MPI_Op mpi_half_op(HalfKind kind, ReduceOp op) {
  return half_ops()->ops[kind == HalfKind::BFloat16 ? 1 : 0][op == ReduceOp::Max ? 1 : 0];
}

void half_combine(HalfKind kind, ReduceOp op, const uint16_t* in, uint16_t* inout, int64_t n) {
  if (kind == HalfKind::BFloat16) {
    if (op == ReduceOp::Sum)
      combine_blocks(in, inout, n, bf16_to_f32, f32_to_bf16, add);
    else
      combine_blocks(in, inout, n, bf16_to_f32, f32_to_bf16, nanmax);
  } else {
    if (op == ReduceOp::Sum)
      combine_blocks(in, inout, n, fp16_to_f32, f32_to_fp16, add);
    else
      combine_blocks(in, inout, n, fp16_to_f32, f32_to_fp16, nanmax);
  }
}

}  // namespace tprun::dist
