// `tprun shard SRC DST`: re-shard a component's safetensors weights.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/component_checkpoint.h"
#include "checkpoint/pipeline_folder.h"
#include "checkpoint/safetensors_writer.h"
#include "cli/command.h"
#include "runtime/error.h"
#include "runtime/logging.h"
#include "runtime/rank_env.h"
#include "runtime/size_string.h"

namespace tprun::cli {
namespace {

namespace fs = std::filesystem;
using namespace tprun::checkpoint;

struct ShardOptions {
  std::string src, dst, variant;
  uint64_t max_shard_bytes = 5000000000ull;
  bool force = false;
};

// "diffusion_pytorch_model" or "model" (transformers' name), from the source files.
std::string weight_prefix(const ComponentCheckpoint& ck) {
  const std::string first = fs::path(ck.files().front().file).filename().string();
  return first.rfind("model", 0) == 0 ? "model" : "diffusion_pytorch_model";
}

int run_shard(const ShardOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  if (is_pipeline_folder(o.src)) {
    throw ConfigError(fmt::format("{} is a pipeline folder; name one component folder (e.g. {}/transformer)", o.src, o.src),
                      true);
  }
  ComponentCheckpoint ck = ComponentCheckpoint::open(o.src, o.variant);
  std::error_code ec;
  if (fs::exists(o.dst, ec) && fs::equivalent(o.src, o.dst, ec))
    throw ConfigError(fmt::format("source and destination are the same folder: {}", o.dst), true);
  if (fs::exists(o.dst, ec) && !fs::is_empty(o.dst, ec) && !o.force)
    throw ConfigError(fmt::format("{} exists and is not empty; pass --force to overwrite", o.dst), true);
  fs::create_directories(o.dst, ec);
  if (ec) throw ConfigError(fmt::format("cannot create {}: {}", o.dst, ec.message()), true);

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
    write_safetensors((fs::path(o.dst) / name).string(), std::move(payload), metadata, o.force);
  }
  if (count > 1) {
    nlohmann::json index = {{"metadata", {{"total_size", ck.total_bytes()}}}, {"weight_map", weight_map}};
    write_file_atomically((fs::path(o.dst) / fmt::format("{}.safetensors.index{}.json", prefix, vdot)).string(),
                          index.dump(2) + "\n", o.force);
  }
  // config.json and other small files of the component travel along.
  if (fs::is_directory(o.src)) {
    for (const auto& e : fs::directory_iterator(o.src)) {
      const std::string n = e.path().filename().string();
      if (!e.is_regular_file() || n.find(".safetensors") != std::string::npos || is_pickle_file(n)) continue;
      std::ifstream in(e.path(), std::ios::binary);
      std::ostringstream ss;
      ss << in.rdbuf();
      write_file_atomically((fs::path(o.dst) / n).string(), ss.str(), o.force);
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << fmt::format("wrote {} shard(s) of at most {} ({} tensors, {}) to {} in {:.1f} s\n", count,
                           format_size(o.max_shard_bytes), items.size(), format_size(ck.total_bytes()), o.dst, secs);
  return 0;
}

}  // namespace

Command shard_command() {
  Command c;
  c.name = "shard";
  c.summary = "re-shard a component's safetensors weights (diffusers file names and index)";
  c.usage = "SRC DST";
  c.add_options = [](po::options_description& desc, po::positional_options_description& pos) {
    po::options_description o("Shard");
    o.add_options()
        ("src", po::value<std::string>()->required(), "component folder or .safetensors file")
        ("dst", po::value<std::string>()->required(), "output folder")
        ("max-shard-size", po::value<std::string>()->default_value("5GB"), "largest shard: 5GB, 500MB, 10GiB, ...")
        ("variant", po::value<std::string>()->default_value(""), "read and write this weight variant, e.g. fp16")
        ("force", po::bool_switch(), "overwrite existing files in DST");
    desc.add(o);
    pos.add("src", 1).add("dst", 1);
  };
  c.run = [](const po::variables_map& vm, int*, char***) {
    auto env = rank_env_from_variables(process_env());
    init_logging({env ? env->rank : 0, env ? env->world : 1, "", ""});
    ShardOptions o;
    o.src = vm["src"].as<std::string>();
    o.dst = vm["dst"].as<std::string>();
    o.variant = vm["variant"].as<std::string>();
    o.max_shard_bytes = parse_size(vm["max-shard-size"].as<std::string>(), "--max-shard-size");
    o.force = vm["force"].as<bool>();
    if (env && env->rank != 0) return 0;  // one writer; the others have nothing to do
    return run_shard(o);
  };
  return c;
}

}  // namespace tprun::cli
