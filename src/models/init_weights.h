#pragma once
// Random weights for a model table, seeded, the way the committed reference cases
// in tests/data were made, so activations stay O(1):
//   - embedding tables (TensorKind::Embedding: token / position embeddings,
//     T5's shared and relative attention bias tables): N(0, 0.02)
//   - other weights with ndim >= 2: N(0, clamp(1/sqrt(fan_in), 0.02, 0.2)),
//     fan_in = prod(shape[1:]) (in_ch * kh * kw for convolutions)
//   - 1-D weights (LayerNorm, GroupNorm, RMSNorm scales): N(1, 0.1)
//   - biases (TensorKind::Bias, norms' too): N(0, 0.05)
// Normals come from a CPU at::Generator (mt19937) seeded with the seed: two
// 53-bit uniforms per pair of normals (Box-Muller in double, then float), in
// table order, so a seed gives the same bytes on any machine and torch build.

#include <cstdint>
#include <string>
#include <vector>

#include "models/model_table.h"

namespace tprun::models {

struct InitDistribution {
  double mean = 0.0;
  double std = 0.0;
};

// The distribution of one tensor by the rules above.
InitDistribution init_distribution(const TensorSpec& spec);

struct RandomTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
  bool counter = false;  // TensorKind::Counter: written as I64 zeros
};

// Every tensor of `table` that save_pretrained writes (TensorSpec::saved), in
// table order; counters are zeros.
std::vector<RandomTensor> random_tensors(const ModelTable& table, uint64_t seed);

// Writes random_tensors(table, seed) to `path` as F32 safetensors (counters I64) with
// __metadata__ {"format": "pt"}, atomically. Returns the bytes of tensor data.
// CheckpointError naming `path` on I/O failure or when it exists.
int64_t write_random_weights(const ModelTable& table, uint64_t seed, const std::string& path);

// The seed of one component of a pipeline ("transformer", "vae", ...), so
// each component's weights depend only on the seed and its own table.
uint64_t component_seed(uint64_t seed, const std::string& component);

}  // namespace tprun::models
