#include "pipelines/component_check.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "checkpoint/pipeline_folder.h"
#include "memory/memory_options.h"
#include "pipelines/pipeline_spec.h"
#include "runtime/error.h"
#include "runtime/strict_json.h"

namespace tprun::pipelines {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Which config file holds the component's own class name.
enum class ConfigClass {
  kNone,          // not read here (tokenizers: their loaders check tokenizer_class; unused components)
  kDiffusers,     // config.json "_class_name"
  kScheduler,     // scheduler_config.json "_class_name"
  kTransformers,  // config.json "architectures"[0] (and "_class_name" if a file has one)
};

ConfigClass config_class(const ComponentSpec& c) {
  switch (c.role) {
    case ComponentRole::kTransformer:
    case ComponentRole::kVae: return ConfigClass::kDiffusers;
    case ComponentRole::kScheduler: return ConfigClass::kScheduler;
    case ComponentRole::kTextEncoder: return ConfigClass::kTransformers;
    default: return ConfigClass::kNone;
  }
}

bool accepts(const ComponentSpec& a, const std::string& cls) {
  return std::find(a.classes.begin(), a.classes.end(), cls) != a.classes.end();
}

// The class a component config names, checked against `a`. `field` is
// "_class_name" or "architectures".
void check_config_class(const std::string& pipeline, const std::string& name, const ComponentSpec& a,
                        const json& config, const std::string& file) {
  auto check_value = [&](const json& v, const std::string& field) {
    if (!v.is_string()) {
      throw CheckpointError(fmt::format("{}: {} is not a string (found {}); a {} {} must be {}", file, field,
                                        clip_text(v.dump()), pipeline, name, fmt::join(a.classes, " or ")),
                            true);
    }
    const std::string cls = v.get<std::string>();
    if (!accepts(a, cls)) {
      throw CheckpointError(fmt::format("{}: {} '{}' is not a class a {} accepts for its {} ({})", file, field,
                                        clip_text(cls), pipeline, name, fmt::join(a.classes, ", ")),
                            true);
    }
  };
  if (!config.is_object()) throw CheckpointError(fmt::format("{}: must be a JSON object", file), true);
  if (auto it = config.find("_class_name"); it != config.end()) check_value(*it, "_class_name");
  if (config_class(a) != ConfigClass::kTransformers) return;
  if (auto it = config.find("architectures"); it != config.end() && !it->is_null()) {
    if (!it->is_array() || it->empty()) {
      throw CheckpointError(fmt::format("{}: architectures must be a list of class names (found {})", file,
                                        clip_text(it->dump())),
                            true);
    }
    check_value((*it)[0], "architectures[0]");
  }
}

}  // namespace

void check_pipeline_components(const checkpoint::PipelineFolder& pf) {
  const PipelineSpec* spec = find_pipeline_spec(pf.cls);
  if (!spec) {
    // Only registered classes get here (load_pipeline, tokenize_prompt and the layout refuse the others first).
    throw Error(Error::Kind::Internal,
                fmt::format("{}/model_index.json: the pipeline class '{}' has no spec (TPRUN_REGISTER_PIPELINE_SPEC); "
                            "refusing to load a folder whose components cannot be checked",
                            pf.path, clip_text(pf.cls)),
                true);
  }
  const std::string index_file = (fs::path(pf.path) / "model_index.json").string();
  std::vector<std::string> known;
  for (const auto& c : spec->components) known.push_back(c.name);
  std::sort(known.begin(), known.end());
  for (const auto& c : pf.components) {
    const ComponentSpec* a = spec->find(c.name);
    if (!a) {
      throw CheckpointError(fmt::format("{}: component '{}' ({}) is not one a {} has (known: {})", index_file,
                                        clip_text(c.name), clip_text(c.cls), pf.cls, fmt::join(known, ", ")),
                            true);
    }
    if (c.library != a->library || !accepts(*a, c.cls)) {
      throw CheckpointError(fmt::format("{}: {} is [\"{}\", \"{}\"]; a {} accepts [\"{}\", {}] there", index_file,
                                        c.name, clip_text(c.library), clip_text(c.cls), pf.cls, a->library,
                                        fmt::format("\"{}\"", fmt::join(a->classes, "\" or \""))),
                            true);
    }
    const ConfigClass where = config_class(*a);
    if (where == ConfigClass::kNone) continue;
    const fs::path file = fs::path(c.path) / (where == ConfigClass::kScheduler ? "scheduler_config.json" : "config.json");
    std::error_code ec;
    if (!fs::is_regular_file(file, ec)) continue;  // the loader names the missing file
    json config;
    try {
      config = read_json_file(file.string(), "component config");
    } catch (const Error& e) {
      rethrow_on_all_ranks(e);  // every rank reads the same file
    }
    check_config_class(pf.cls, c.name, *a, config, file.string());
  }
}

void check_vae_tiles(const memory::MemoryOptions& mo, int64_t scale_factor, int64_t sample_size,
                     const std::string& vae_config) {
  if (!mo.vae_tiling) return;
  const bool given = mo.vae_tile_sample_size > 0;
  const int64_t tile = given ? mo.vae_tile_sample_size : sample_size;
  const std::string what =
      given ? fmt::format("[memory] vae_tile_sample_size = {} px", tile)
            : fmt::format("[memory] vae_tiling: the VAE's sample_size {} px ({}; set vae_tile_sample_size)", tile,
                          vae_config);
  // The smallest tile (a multiple of the scale factor) whose stride is a latent pixel at this overlap.
  int64_t k = 1;
  while (k < (int64_t{1} << 20) && static_cast<int64_t>(static_cast<double>(k) * (1 - mo.vae_tile_overlap)) < 1) ++k;
  const std::string fix = fmt::format("use vae_tile_sample_size = a multiple of {} px of at least {} px", scale_factor,
                                      k * scale_factor);
  if (tile % scale_factor != 0) {
    throw ConfigError(fmt::format("{} is not a multiple of the VAE's scale factor, {} px per latent pixel ({}); {}",
                                  what, scale_factor, vae_config, fix),
                      true);
  }
  // models/vae_tiling.h's decode stride, in latent pixels: int(latent tile x (1 - overlap)).
  const auto stride = static_cast<int64_t>(static_cast<double>(tile / scale_factor) * (1 - mo.vae_tile_overlap));
  if (stride < 1) {
    throw ConfigError(
        fmt::format("{} with vae_tile_overlap = {}: a tile advances by {} px, less than one latent pixel ({} px: the "
                    "VAE's scale factor, {}), so tiles cannot move across the image; {} (or a smaller overlap)",
                    what, mo.vae_tile_overlap, static_cast<double>(tile) * (1 - mo.vae_tile_overlap), scale_factor,
                    vae_config, fix),
        true);
  }
}

}  // namespace tprun::pipelines
