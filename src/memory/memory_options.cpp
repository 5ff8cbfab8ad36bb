#include "memory/memory_options.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tprun::memory {

const std::vector<std::string>& offload_types() {
  static const std::vector<std::string> types = {"block_level", "leaf_level", "model_level"};
  return types;
}

std::optional<int> device_map_target(const std::string& d) {
  if (d == "cpu") return -1;
  if (d == "disk") return -2;
  const std::string digits = d.rfind("cuda:", 0) == 0 ? d.substr(5) : d;
  if (digits.empty() || digits.size() > 4) return std::nullopt;
  for (char c : digits)
    if (c < '0' || c > '9') return std::nullopt;
  return std::stoi(digits);
}

const std::vector<std::string>& layerwise_storage_dtypes() {
  static const std::vector<std::string> dtypes = {"float8_e4m3fn", "float8_e5m2"};
  return dtypes;
}

std::string describe(const MemoryOptions& m) {
  std::vector<std::string> on;
  if (m.vae_slicing) on.push_back("vae_slicing (one image at a time)");
  if (m.vae_tiling) {
    on.push_back(fmt::format("vae_tiling (tiles of {}, overlap {})",
                             m.vae_tile_sample_size > 0 ? fmt::format("{} px", m.vae_tile_sample_size)
                                                        : std::string("the VAE's sample_size"),
                             m.vae_tile_overlap));
  }
  if (m.attention_chunk > 0) on.push_back(fmt::format("attention_chunk {} query tokens", m.attention_chunk));
  if (!m.layerwise_storage.empty()) {
    on.push_back(fmt::format("layerwise_casting (Linear/Conv/Embedding weights stored in {}, skip {} + {})",
                             m.layerwise_storage,
                             m.layerwise_skip ? fmt::format("[{}]", fmt::join(*m.layerwise_skip, ", "))
                                              : std::string("diffusers' defaults"),
                             "each model class's own"));
  }
  if (m.offload.enabled()) {
    on.push_back(fmt::format("offload ({}{}, to {}{}{})", m.offload.type,
                             m.offload.type == "block_level" ? fmt::format(" {} per group", m.offload.blocks_per_group)
                                                             : std::string(),
                             m.offload.to, m.offload.to == "disk" ? " " + m.offload.disk_path : std::string(),
                             m.offload.prefetch ? ", prefetch" : ""));
  }
  if (!m.device_map_strategy.empty()) on.push_back(fmt::format("device_map {}", m.device_map_strategy));
  if (!m.device_map.empty()) on.push_back(fmt::format("device_map of {} entries", m.device_map.size()));
  if (on.empty()) return "memory: none";
  return fmt::format("memory: {}", fmt::join(on, ", "));
}

}  // namespace tprun::memory
