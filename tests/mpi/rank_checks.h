#pragma once
// Checks shared by the multi-rank model tests.
#include <ATen/core/Tensor.h>
#include <ATen/ops/equal.h>
#include <gtest/gtest.h>

#include "dist/communicator.h"

namespace tprun::test {

// Every rank's `out` equals rank 0's, bit for bit (compared as fp32).
inline void expect_identical_across_ranks(dist::Communicator& comm, const at::Tensor& out) {
  at::Tensor mine = out.to(at::kFloat).contiguous();
  at::Tensor root = mine.clone();
  comm.broadcast(root, {0});
  EXPECT_TRUE(at::equal(mine, root)) << "rank " << comm.rank() << " differs from rank 0";
}

}  // namespace tprun::test
