#include "checkpoint/reshard.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/component_checkpoint.h"
#include "checkpoint/pipeline_folder.h"
#include "checkpoint/safetensors_writer.h"
#include "runtime/error.h"

namespace tprun::checkpoint {
namespace {

namespace fs = std::filesystem;

// "diffusion_pytorch_model" or "model" (transformers' name), from the source files.
std::string weight_prefix(const ComponentCheckpoint& ck) {
  const std::string first = fs::path(ck.files().front().file).filename().string();
  return first.rfind("model", 0) == 0 ? "model" : "diffusion_pytorch_model";
}

}  // namespace

ReshardSummary reshard_component(const std::string& src, const std::string& dst, const ReshardOptions& o) {
  if (is_pipeline_folder(src)) {
    throw ConfigError(fmt::format("{} is a pipeline folder; name one component folder (e.g. {}/transformer)", src, src));
  }
  ComponentCheckpoint ck = ComponentCheckpoint::open(src, o.variant);
  std::error_code ec;
  if (fs::exists(dst, ec) && fs::equivalent(src, dst, ec))
    throw ConfigError(fmt::format("source and destination are the same folder: {}", dst));
  if (fs::exists(dst, ec) && !fs::is_empty(dst, ec) && !o.force)
    throw ConfigError(fmt::format("{} exists and is not empty; pass --force to overwrite", dst));
  fs::create_directories(dst, ec);
  if (ec) throw ConfigError(fmt::format("cannot create {}: {}", dst, ec.message()));

  // Source order: file by file, by offset (the order the tensors were saved in).
  struct Item {
    const TensorEntry* entry;
    const SafetensorsHeader* file;
  };
  std::vector<Item> items;
  for (const auto& f : ck.files()) {
    std::vector<const TensorEntry*> es;
    for (const auto& e : f.tensors) es.push_back(&e);
    std::sort(es.begin(), es.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
    for (auto* e : es) items.push_back({e, &f});
  }
  // Greedy fill, as diffusers' max_shard_size does: a tensor that would
  // overflow the current shard starts a new one; a bigger tensor gets its own.
  std::vector<std::vector<Item>> shards(1);
  uint64_t current = 0;
  for (const auto& it : items) {
    const uint64_t n = it.entry->nbytes();
    if (!shards.back().empty() && current + n > o.max_shard_bytes) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(it);
    current += n;
  }
  const std::string prefix = weight_prefix(ck);
  const std::string vdot = o.variant.empty() ? "" : "." + o.variant;
  const size_t count = shards.size();
  std::map<std::string, std::string> metadata{{"format", "pt"}};
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t s = 0; s < count; ++s) {
    const std::string name = count == 1 ? fmt::format("{}{}.safetensors", prefix, vdot)
                                        : fmt::format("{}{}-{:05d}-of-{:05d}.safetensors", prefix, vdot, s + 1, count);
    std::vector<TensorPayload> payload;
    for (const auto& it : shards[s]) {
      TensorPayload p;
      p.name = it.entry->name;
      p.dtype = it.entry->dtype;
      p.shape = it.entry->shape;
      p.src_file = it.file->file;
      p.src_offset = it.file->data_start + it.entry->begin;
      payload.push_back(std::move(p));
      weight_map[it.entry->name] = name;
    }
    write_safetensors((fs::path(dst) / name).string(), std::move(payload), metadata, o.force);
  }
  if (count > 1) {
    nlohmann::json index = {{"metadata", {{"total_size", ck.total_bytes()}}}, {"weight_map", weight_map}};
    write_file_atomically((fs::path(dst) / fmt::format("{}.safetensors.index{}.json", prefix, vdot)).string(),
                          index.dump(2) + "\n", o.force);
  }
  // config.json and other small files of the component travel along.
  if (fs::is_directory(src)) {
    for (const auto& e : fs::directory_iterator(src)) {
      const std::string n = e.path().filename().string();
      if (!e.is_regular_file() || n.find(".safetensors") != std::string::npos || is_pickle_file(n)) continue;
      std::ifstream in(e.path(), std::ios::binary);
      std::ostringstream ss;
      ss << in.rdbuf();
      write_file_atomically((fs::path(dst) / n).string(), ss.str(), o.force);
    }
  }
  return {count, items.size(), ck.total_bytes()};
}


}  // namespace tprun::checkpoint
