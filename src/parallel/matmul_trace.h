#pragma once
// A record of the matrix products one forward runs on this rank, for the step
// benchmark (FLOPs, and a bare replay of the same shapes): every
// ParallelLinear forward and every attention records its shapes while a
// MatmulRecorder is alive on the calling thread. Costs nothing otherwise.

#include <cstdint>
#include <vector>

namespace tprun::parallel {

// [batch x] [m, k] x [k, n]. `tp_share`: how many ranks of the TP group
// compute disjoint parts of this product (tp for split layers and head-split
// attention, 1 for replicated layers): the whole model's FLOPs are the sum
// of flops() * tp_share.
struct MatmulShape {
  int64_t batch = 1, m = 0, k = 0, n = 0;
  bool linear = true;  // a Linear (with its bias) or attention's batched product
  int64_t tp_share = 1;
  double flops() const { return 2.0 * static_cast<double>(batch) * m * k * n; }
};

class MatmulRecorder {
 public:
  MatmulRecorder();
  ~MatmulRecorder();
  MatmulRecorder(const MatmulRecorder&) = delete;
  MatmulRecorder& operator=(const MatmulRecorder&) = delete;

  const std::vector<MatmulShape>& shapes() const { return shapes_; }
  // Appends to the innermost live recorder of this thread; no-op without one.
  static void record(const MatmulShape& shape);

 private:
  MatmulRecorder* outer_ = nullptr;
  std::vector<MatmulShape> shapes_;
};

}  // namespace tprun::parallel
