#include <cstring>
#include <random>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <gtest/gtest.h>

#include "dist/communicator.h"
#include "dist/half_reduce.h"

namespace tprun::dist {
namespace {

template <typename T>
uint16_t bits_of(T v) {
  uint16_t b;
  std::memcpy(&b, &v, 2);
  return b;
}

template <typename T>
T from_bits(uint16_t b) {
  T v;
  std::memcpy(&v, &b, 2);
  return v;
}

template <typename T>
void check_kind(HalfKind kind) {
  std::mt19937 gen(7);
  std::normal_distribution<float> dist(0.f, 3.f);
  const int n = 1537;  // not a multiple of the kernel's block
  std::vector<uint16_t> a(n), b(n), sum(n), mx(n);
  for (int i = 0; i < n; ++i) {
    a[i] = bits_of(T(dist(gen)));
    b[i] = bits_of(T(dist(gen)));
  }
  sum = b;
  mx = b;
  half_combine(kind, ReduceOp::Sum, a.data(), sum.data(), n);
  half_combine(kind, ReduceOp::Max, a.data(), mx.data(), n);
  for (int i = 0; i < n; ++i) {
    const float fa = static_cast<float>(from_bits<T>(a[i]));
    const float fb = static_cast<float>(from_bits<T>(b[i]));
    // fp32 accumulation, one rounding: exactly what c10 gives for T(fa + fb).
    ASSERT_EQ(sum[i], bits_of(T(fa + fb))) << i;
    ASSERT_EQ(mx[i], bits_of(T(std::max(fa, fb)))) << i;
  }
}

TEST(HalfReduce, BFloat16MatchesFp32AccumulateThenRound) { check_kind<c10::BFloat16>(HalfKind::BFloat16); }
TEST(HalfReduce, Float16MatchesFp32AccumulateThenRound) { check_kind<c10::Half>(HalfKind::Float16); }

TEST(HalfReduce, NaNPropagatesThroughMax) {
  uint16_t a = bits_of(c10::BFloat16(std::numeric_limits<float>::quiet_NaN()));
  uint16_t b = bits_of(c10::BFloat16(1.0f));
  half_combine(HalfKind::BFloat16, ReduceOp::Max, &a, &b, 1);
  EXPECT_TRUE(std::isnan(static_cast<float>(from_bits<c10::BFloat16>(b))));
}

}  // namespace
}  // namespace tprun::dist
