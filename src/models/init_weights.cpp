#include "models/init_weights.h"

#include <algorithm>
#include <cmath>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include "checkpoint/safetensors_writer.h"
#include "runtime/error.h"

namespace tprun::models {
InitDistribution init_distribution(const TensorSpec& spec) {
  if (spec.kind == TensorKind::Bias) return {0.0, 0.05};
  if (spec.kind == TensorKind::Embedding) return {0.0, 0.02};
  if (spec.shape.size() >= 2) {
    double fan_in = 1.0;
    for (size_t i = 1; i < spec.shape.size(); ++i) fan_in *= static_cast<double>(spec.shape[i]);
    return {0.0, std::clamp(1.0 / std::sqrt(std::max(fan_in, 1.0)), 0.02, 0.2)};
  }
  return {1.0, 0.1};  // 1-D scales: LayerNorm / GroupNorm / RMSNorm weights
}

std::vector<RandomTensor> random_tensors(const ModelTable& table, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto* impl = at::check_generator<at::CPUGeneratorImpl>(gen);
  // Uniform in (0, 1] from the top 53 bits.
  auto uniform = [&] { return (static_cast<double>(impl->random64() >> 11) + 1.0) * 0x1.0p-53; };
  constexpr double kTwoPi = 6.283185307179586476925286766559;

  std::vector<RandomTensor> out;
  for (const auto& spec : table.tensors) {
    if (!spec.saved) continue;
    int64_t n = 1;
    for (auto d : spec.shape) {
      if (d < 0) throw ConfigError(fmt::format("{}: tensor '{}' has a negative dimension", table.cls, spec.name));
      n *= d;
    }
    RandomTensor t{spec.name, spec.shape, std::vector<float>(static_cast<size_t>(n)), spec.kind == TensorKind::Counter};
    if (t.counter) {  // an integer counter starts at 0
      out.push_back(std::move(t));
      continue;
    }
    const InitDistribution dist = init_distribution(spec);
    for (int64_t i = 0; i < n; i += 2) {
      const double radius = std::sqrt(-2.0 * std::log(uniform())), angle = kTwoPi * uniform();
      t.values[static_cast<size_t>(i)] = static_cast<float>(dist.mean + dist.std * radius * std::cos(angle));
      if (i + 1 < n)
        t.values[static_cast<size_t>(i + 1)] = static_cast<float>(dist.mean + dist.std * radius * std::sin(angle));
    }
    out.push_back(std::move(t));
  }
  return out;
}

int64_t write_random_weights(const ModelTable& table, uint64_t seed, const std::string& path) {
  const std::vector<RandomTensor> tensors = random_tensors(table, seed);
  std::vector<checkpoint::TensorPayload> payloads;
  std::vector<std::vector<int64_t>> counters;  // I64 storage of the counters (zeros)
  counters.reserve(tensors.size());
  int64_t bytes = 0;
  for (const auto& t : tensors) {
    checkpoint::TensorPayload p;
    p.name = t.name;
    p.shape = t.shape;
    if (t.counter) {
      counters.emplace_back(t.values.size(), 0);
      p.dtype = checkpoint::Dtype::I64;
      p.data = counters.back().data();
    } else {
      p.dtype = checkpoint::Dtype::F32;
      p.data = t.values.data();
    }
    bytes += static_cast<int64_t>(p.nbytes());
    payloads.push_back(std::move(p));
  }
  checkpoint::write_safetensors(path, std::move(payloads), {{"format", "pt"}}, /*overwrite=*/false);
  return bytes;
}

uint64_t component_seed(uint64_t seed, const std::string& component) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the name
  for (unsigned char c : component) h = (h ^ c) * 1099511628211ull;
  uint64_t z = seed ^ h;  // splitmix64 finaliser
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace tprun::models
