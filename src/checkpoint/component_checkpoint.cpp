#include "checkpoint/component_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <regex>
#include <set>

#include <fmt/format.h>

#include "runtime/error.h"
#include "runtime/strict_json.h"

namespace tprun::checkpoint {
namespace fs = std::filesystem;
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Weight-file families of one folder: "<prefix>.safetensors" (plain),
// "<prefix>.<variant>.safetensors", shards "<prefix>[.<variant>]-0000i-of-0000N.safetensors"
// and the index "<prefix>.safetensors.index[.<variant>].json".
struct Candidates {
  std::vector<std::string> singles;  // file names
  std::vector<std::string> indexes;
  std::vector<std::string> pickles;
  std::vector<std::string> all_safetensors;
};

Candidates scan(const fs::path& dir, const std::string& variant) {
  Candidates c;
  const std::string vdot = variant.empty() ? "" : "." + variant;
  static const std::regex shard_re(R"(.*-\d{5}-of-\d{5}\.safetensors$)");
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const std::string name = e.path().filename().string();
    if (is_pickle_file(name)) c.pickles.push_back(name);
    if (ends_with(name, ".safetensors")) c.all_safetensors.push_back(name);
    if (variant.empty()) {
      if (ends_with(name, ".safetensors.index.json")) c.indexes.push_back(name);
      else if (ends_with(name, ".safetensors") && !std::regex_match(name, shard_re) &&
               std::count(name.begin(), name.end(), '.') == 1)
        c.singles.push_back(name);
    } else {
      if (ends_with(name, ".safetensors.index" + vdot + ".json")) c.indexes.push_back(name);
      else if (ends_with(name, vdot + ".safetensors") && !std::regex_match(name, shard_re))
        c.singles.push_back(name);
    }
  }
  std::sort(c.singles.begin(), c.singles.end());
  std::sort(c.indexes.begin(), c.indexes.end());
  std::sort(c.all_safetensors.begin(), c.all_safetensors.end());
  return c;
}

}  // namespace

bool is_pickle_file(const std::string& path) {
  for (const char* ext : {".bin", ".pt", ".pth", ".ckpt", ".pkl"})
    if (ends_with(path, ext)) return true;
  return false;
}

void refuse_pickle(const std::string& path) {
  throw CheckpointError(fmt::format(
      "{}: pickle checkpoints are refused (they can run code when loaded and cannot be read in "
      "slices). Convert once with Python: `from safetensors.torch import save_file; import torch; "
      "save_file(torch.load(path, map_location='cpu', weights_only=True), "
      "'diffusion_pytorch_model.safetensors')`, or load the model in diffusers and call "
      "save_pretrained(dir, safe_serialization=True)",
      path));
}

namespace {

// The index's weight_map: tensor -> shard file of this folder. `shards`: the
// files it names.
std::map<std::string, std::string> read_weight_map(const std::string& index_path, std::set<std::string>& shards) {
  nlohmann::json idx = read_json_file(index_path, "the safetensors index");
  if (!idx.is_object() || !idx.contains("weight_map") || !idx["weight_map"].is_object())
    throw CheckpointError(fmt::format("{}: the index needs a \"weight_map\" object", index_path));
  std::map<std::string, std::string> weight_map;
  for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) {
    if (!it.value().is_string())
      throw CheckpointError(fmt::format("{}: weight_map entry '{}' must name a file", index_path, it.key()));
    const std::string shard = it.value().get<std::string>();
    if (shard.find('/') != std::string::npos || shard == ".." || shard.empty())
      throw CheckpointError(fmt::format("{}: weight_map entry '{}' names '{}', not a file of this folder",
                                        index_path, it.key(), shard));
    weight_map[it.key()] = shard;
    shards.insert(shard);
  }
  // The index's "metadata" (total_size) is informational in diffusers; a
  // mismatch is not an error there either, so it is not read.
  return weight_map;
}

// Every shard's validated header, in name order; a missing shard is named
// with one tensor the index puts in it.
void read_shards(const fs::path& dir, const std::string& index_path,
                 const std::map<std::string, std::string>& weight_map, const std::set<std::string>& shards,
                 std::vector<SafetensorsHeader>& files) {
  for (const auto& shard : shards) {
    const fs::path sp = dir / shard;
    if (!fs::exists(sp)) {
      std::string example;
      for (auto& [t, s] : weight_map)
        if (s == shard) { example = t; break; }
      throw CheckpointError(fmt::format("{}: shard '{}' (holding tensor '{}' among others) is missing",
                                        index_path, shard, example));
    }
    files.push_back(read_safetensors_header(sp.string()));
  }
}

// Each tensor of the shards, in the one shard the index maps it to; every
// tensor the index maps, found. `where` points into `files`.
void locate_indexed(const std::string& index_path, const std::map<std::string, std::string>& weight_map,
                    const std::vector<SafetensorsHeader>& files, std::map<std::string, TensorLocation>& where) {
  for (size_t f = 0; f < files.size(); ++f) {
    const std::string shard = fs::path(files[f].file).filename().string();
    for (const auto& e : files[f].tensors) {
      auto it = weight_map.find(e.name);
      if (it == weight_map.end())
        throw CheckpointError(fmt::format("{}: tensor '{}' in shard '{}' is not in the index's weight_map",
                                          index_path, e.name, shard));
      if (it->second != shard)
        throw CheckpointError(fmt::format("{}: tensor '{}' is in shard '{}' but the index maps it to '{}' "
                                          "(a tensor in two shards?)",
                                          index_path, e.name, shard, it->second));
      if (where.count(e.name))
        throw CheckpointError(fmt::format("{}: tensor '{}' appears in two shards", index_path, e.name));
      where[e.name] = {f, &e};
    }
  }
  for (const auto& [t, shard] : weight_map) {
    if (!where.count(t))
      throw CheckpointError(fmt::format("{}: tensor '{}' is mapped to shard '{}', which does not contain it",
                                        index_path, t, shard));
  }
}

// A shard file of the index's family ("<prefix>[.<variant>]-...") that the
// index never mentions.
void check_unlisted_shards(const std::string& index_path, const std::string& index_name, const std::string& variant,
                           const std::vector<std::string>& all_safetensors, const std::set<std::string>& shards) {
  const std::string family =
      index_name.substr(0, index_name.find(".safetensors.index")) + (variant.empty() ? "" : "." + variant);
  for (const auto& name : all_safetensors) {
    if (name.rfind(family + "-", 0) == 0 && !shards.count(name))
      throw CheckpointError(fmt::format("{}: shard '{}' is in the folder but no tensor of the index refers to it",
                                        index_path, name));
  }
}

// The one unsharded weight file of the folder (for the variant), by name.
std::string single_weight_file(const fs::path& dir, const std::string& path, const std::string& vdesc,
                               const Candidates& cand) {
  if (cand.singles.size() > 1) {
    throw CheckpointError(fmt::format("{}: several weight files{} ({}); pass --variant or keep one", path, vdesc,
                                      fmt::join(cand.singles, ", ")));
  }
  if (cand.singles.empty()) {
    if (!cand.pickles.empty()) refuse_pickle((dir / cand.pickles[0]).string());
    throw CheckpointError(fmt::format("{}: no safetensors weights{} (expected "
                                      "diffusion_pytorch_model.safetensors, model.safetensors, or shards with "
                                      "an index)",
                                      path, vdesc));
  }
  return (dir / cand.singles[0]).string();
}

}  // namespace

ComponentCheckpoint ComponentCheckpoint::open(const std::string& path, const std::string& variant) {
  ComponentCheckpoint c;
  c.path_ = path;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw CheckpointError(fmt::format("{}: no such file or folder", path));
  if (fs::is_regular_file(path, ec)) {
    if (is_pickle_file(path)) refuse_pickle(path);
    if (!ends_with(path, ".safetensors"))
      throw CheckpointError(fmt::format("{}: not a .safetensors file or a component folder", path));
    c.files_.push_back(read_safetensors_header(path));
  } else {
    const fs::path dir(path);
    if (fs::exists(dir / "config.json")) {
      c.config_ = read_json_file((dir / "config.json").string(), "config.json");
      if (!c.config_.is_object())
        throw CheckpointError(fmt::format("{}: config.json must be a JSON object", (dir / "config.json").string()));
      c.has_config_ = true;
    }
    Candidates cand = scan(dir, variant);
    const std::string vdesc = variant.empty() ? "" : fmt::format(" for variant '{}'", variant);
    if (cand.indexes.size() > 1) {
      throw CheckpointError(fmt::format("{}: several safetensors indexes{} ({}); keep one", path, vdesc,
                                        fmt::join(cand.indexes, ", ")));
    }
    if (cand.indexes.size() == 1) {
      c.index_path_ = (dir / cand.indexes[0]).string();
      std::set<std::string> shards;
      const auto weight_map = read_weight_map(c.index_path_, shards);
      read_shards(dir, c.index_path_, weight_map, shards, c.files_);
      locate_indexed(c.index_path_, weight_map, c.files_, c.where_);
      check_unlisted_shards(c.index_path_, cand.indexes[0], variant, cand.all_safetensors, shards);
      return c;
    }
    c.files_.push_back(read_safetensors_header(single_weight_file(dir, path, vdesc, cand)));
  }
  for (size_t f = 0; f < c.files_.size(); ++f)
    for (const auto& e : c.files_[f].tensors) c.where_[e.name] = {f, &e};
  return c;
}

std::vector<std::string> ComponentCheckpoint::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(where_.size());
  for (const auto& [n, loc] : where_) names.push_back(n);
  return names;
}

TensorLocation ComponentCheckpoint::locate(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end())
    throw CheckpointError(fmt::format("{}: tensor '{}' is not in this checkpoint", path_, name));
  return it->second;
}

uint64_t ComponentCheckpoint::total_bytes() const {
  uint64_t n = 0;
  for (const auto& f : files_)
    for (const auto& e : f.tensors) n += e.nbytes();
  return n;
}

}  // namespace tprun::checkpoint
