// `tprun inspect PATH`: what a checkpoint holds and what each TP rank would read.
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "checkpoint/component_checkpoint.h"
#include "checkpoint/pipeline_folder.h"
#include "cli/command.h"
#include "models/model_config.h"
#include "models/model_registry.h"
#include "models/weight_bytes.h"
#include "pipelines/pipeline_layout.h"
#include "runtime/error.h"
#include "runtime/rank_env.h"
#include "runtime/size_string.h"

namespace tprun::cli {
namespace {

namespace fs = std::filesystem;
using models::StoredRow;

bool folder_has_weights(const fs::path& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.find(".safetensors") != std::string::npos || checkpoint::is_pickle_file(n)) return true;
  }
  return false;
}

// The model table's TP plan: one entry per pattern, with its style.
nlohmann::json tp_plan_json(const models::ModelTable& table) {
  nlohmann::json plan = nlohmann::json::array();
  for (const auto& e : table.tp_plan()) {
    nlohmann::json j = {{"pattern", e.pattern}, {"style", checkpoint::shard_style_name(e.style)}};
    if (!e.blocks.empty()) j["blocks"] = e.blocks;
    plan.push_back(std::move(j));
  }
  return plan;
}

// One stored tensor and, with a model table, its TP plan there ("(not
// loaded)" where the table, built with a pipeline's load options, marks it
// optional); a shape other than the table's is a CheckpointError.
nlohmann::json tensor_json(const StoredRow& row, const models::ModelTable* table, const std::string& config_path,
                           bool loads_only) {
  nlohmann::json t;
  t["name"] = row.name;
  t["dtype"] = checkpoint::dtype_name(row.dtype);
  t["shape"] = row.shape;
  t["bytes"] = row.bytes;
  t["file"] = row.file;
  std::string plan = "-";
  if (table) {
    const models::TensorSpec* spec = table->find(row.name);
    if (spec == nullptr) {
      plan = "(not in model)";
    } else {
      if (spec->shape != row.shape) {
        throw CheckpointError(fmt::format("{}: tensor '{}' has wrong shape; expected {} (from {}), got {}", row.file,
                                          row.name, checkpoint::shape_string(spec->shape), config_path,
                                          checkpoint::shape_string(row.shape)));
      }
      plan = spec->style == checkpoint::ShardStyle::Replicated ? "replicated"
                                                                : checkpoint::shard_style_name(spec->style);
      if (loads_only && spec->optional) plan = "(not loaded)";
      if (!spec->plan_key.empty()) t["plan_key"] = spec->plan_key;
      t["kind"] = models::tensor_kind_name(spec->kind);
      t["table_index"] = spec - table->tensors.data();  // declaration (module) order
    }
  }
  t["plan"] = plan;
  return t;
}

// Every tensor the table requires is stored (CheckpointError naming the first missing).
void check_required_tensors(const models::ModelTable& table, const std::set<std::string>& present,
                            const std::string& path) {
  for (const auto& spec : table.tensors) {
    if (!spec.optional && !present.count(spec.name)) {
      throw CheckpointError(fmt::format("{}: tensor '{}' (shape {}) that {} needs is missing", path, spec.name,
                                        checkpoint::shape_string(spec.shape), table.cls));
    }
  }
}

// A component nothing of which is split (no table: every tensor read whole;
// or every tensor replicated): each rank reads the same bytes.
bool splits_nothing(const models::ModelTable* table) {
  if (!table) return true;
  for (const auto& spec : table->tensors) {
    if (spec.style != checkpoint::ShardStyle::Replicated) return false;
  }
  return true;
}

// What each of `tp` ranks would read (with `loads_only`, only what the load
// reads: the table's tensors it does not mark optional); {"valid": false,
// "error"} when the model cannot run at that TP size.

nlohmann::json tp_shares(const std::vector<StoredRow>& rows, const models::ModelTable* table, int tp,
                         const std::string& path, bool loads_only) {
  nlohmann::json j;
  j["size"] = tp;
  try {
    // Validated before any per-rank list is built.
    if (table) models::validate_tp_size(*table, tp, path);
    models::RowFilter loaded;
    if (loads_only && table) {
      loaded = [table](const StoredRow& row) {
        const models::TensorSpec* spec = table->find(row.name);
        return spec != nullptr && !spec->optional;
      };
    }
    j["valid"] = true;
    if (splits_nothing(table)) {
      // One rank's bytes, the same for every rank (not rows x tp slices planned).
      const uint64_t whole = models::bytes_per_rank(rows, table, 1, loaded).at(0);
      j["bytes_per_rank"] = std::vector<uint64_t>(static_cast<size_t>(tp), whole);
    } else {
      j["bytes_per_rank"] = models::bytes_per_rank(rows, table, tp, loaded);
    }
  } catch (const Error& err) {
    j["valid"] = false;
    j["error"] = err.what();
  }
  return j;
}

// One component inspected: its JSON description (without "tp"), and what
// the TP shares are computed from.
struct InspectedComponent {
  nlohmann::json json;
  models::ComponentListing listing;
  std::optional<models::ModelTable> table;
  bool loads_only = false;
  // Its TP share: {"size", "valid", "bytes_per_rank" | "error"}; `refusal`
  // (a pipeline's reason the tp cannot run it) replaces the check.
  void add_tp(int tp, const std::string& refusal) {
    if (refusal.empty()) {
      json["tp"] = tp_shares(listing.rows, table ? &*table : nullptr, tp, json["path"].get<std::string>(), loads_only);
    } else {
      json["tp"] = {{"size", tp}, {"valid", false}, {"error", refusal}};
    }
  }
};

// Inspects one component. Throws on an invalid checkpoint. `load_options`:
// the options a pipeline loads it with (its table then marks what that load
// never reads as not loaded); null for a component on its own.
InspectedComponent inspect_component(const std::string& name, const std::string& path, const std::string& variant,
                                     const models::ModelOptions* load_options) {
  const models::ComponentListing l = models::list_component(path, variant);
  std::optional<models::ModelTable> table;
  if (l.has_config) {
    const models::TensorCensus census(l.names(), path);  // block counts against what the checkpoint holds
    // Under a hidden-layer cut the layers after it may be absent, as the load allows.
    const bool cut = load_options && !load_options->hidden_layers.empty();
    table = models::model_table_for(l.config, l.config_path, load_options ? *load_options : models::ModelOptions{},
                                    cut ? nullptr : &census);
  }
  const models::ModelTable* t = table ? &*table : nullptr;
  const bool loads_only = load_options != nullptr;

  nlohmann::json out;
  out["name"] = name;
  out["path"] = path;
  out["class"] = table ? table->cls : l.config.value("_class_name", std::string());
  out["model_table"] = table.has_value();
  if (table) out["tp_plan"] = tp_plan_json(*table);
  out["index"] = l.index;
  out["files"] = l.files;
  out["tensors"] = nlohmann::json::array();
  std::set<std::string> present;
  for (const auto& row : l.rows) {
    present.insert(row.name);
    out["tensors"].push_back(tensor_json(row, t, l.config_path, loads_only));
  }
  if (table) check_required_tensors(*table, present, path);
  out["total_bytes"] = l.total;
  return {std::move(out), l, std::move(table), loads_only};
}

// Why the pipeline cannot run at `tp` ("" when it can): the first component
// it splits over the TP group whose table refuses the size. Checked before
// any component's per-rank list is built.
std::string pipeline_tp_refusal(const pipelines::PipelineLayout& layout,
                                const std::vector<std::pair<std::string, InspectedComponent>>& parts, int tp) {
  for (const auto& [name, part] : parts) {
    const pipelines::ComponentLayout* c = layout.find(name);
    if (!c || !c->sharded || !part.table) continue;
    try {
      models::validate_tp_size(*part.table, tp, c->path);
    } catch (const Error& e) {
      return fmt::format("the {} cannot run at tp {}: {}", layout.cls, tp, e.what());
    }
  }
  return "";
}

void print_text(const nlohmann::json& comp) {
  std::cout << fmt::format("component {} ({}): {} file(s), {} tensors, {}{}\n", comp["name"].get<std::string>(),
                           comp["class"].get<std::string>().empty() ? "no config" : comp["class"].get<std::string>(),
                           comp["files"].size(), comp["tensors"].size(), format_size(comp["total_bytes"].get<uint64_t>()),
                           comp["model_table"].get<bool>() ? "" : " (no model table: TP plan unknown)");
  size_t w = 4;
  for (const auto& t : comp["tensors"]) w = std::max(w, t["name"].get<std::string>().size());
  std::cout << fmt::format("  {:<{}}  {:<6} {:<16} {:>12}  {:<44} {}\n", "name", w, "dtype", "shape", "bytes", "file",
                           "tp plan");
  for (const auto& t : comp["tensors"]) {
    std::cout << fmt::format("  {:<{}}  {:<6} {:<16} {:>12}  {:<44} {}\n", t["name"].get<std::string>(), w,
                             t["dtype"].get<std::string>(), checkpoint::shape_string(t["shape"].get<std::vector<int64_t>>()),
                             t["bytes"].get<uint64_t>(), t["file"].get<std::string>(), t["plan"].get<std::string>());
  }
  if (comp.contains("tp_plan") && !comp["tp_plan"].empty()) {
    std::cout << "  tp plan:\n";
    for (const auto& e : comp["tp_plan"]) {
      std::cout << fmt::format("    {:<52} {}{}\n", e["pattern"].get<std::string>(), e["style"].get<std::string>(),
                               e.contains("blocks") ? fmt::format(" {}", e["blocks"].dump()) : "");
    }
  }
  if (comp.contains("tp")) {
    const auto& j = comp["tp"];
    if (j["valid"].get<bool>()) {
      std::vector<std::string> parts;
      for (const auto& b : j["bytes_per_rank"]) parts.push_back(format_size(b.get<uint64_t>()));
      std::cout << fmt::format("  tp {}: valid; each rank reads {}\n", j["size"].get<int>(), fmt::join(parts, " / "));
    } else {
      std::cout << fmt::format("  tp {}: NOT valid: {}\n", j["size"].get<int>(), j["error"].get<std::string>());
    }
  }
}

int run_inspect(const std::string& path, int tp, bool json, const std::string& variant) {
  nlohmann::json out;
  out["path"] = path;
  out["components"] = nlohmann::json::array();
  if (checkpoint::is_pipeline_folder(path)) {
    auto pipe = checkpoint::open_pipeline_folder(path);
    out["class"] = pipe.cls;
    // Each component as the pipeline loads it (its hidden-layer cut, the VAE's decoder).
    std::optional<pipelines::PipelineLayout> layout;
    if (pipelines::find_pipeline_spec(pipe.cls)) {
      pipelines::PipelineOptions options;
      options.variant = variant;
      try {
        layout = pipelines::pipeline_layout(path, options);
      } catch (const Error& e) {
        // A folder the pipeline would refuse is still listed, component by component.
        spdlog::warn("{}: the {} would not load it ({}); its components are shown on their own", path, pipe.cls,
                     e.what());
      }
    }
    std::vector<std::pair<std::string, InspectedComponent>> parts;  // by component name
    for (const auto& c : pipe.components) {
      if (!folder_has_weights(c.path)) continue;
      const pipelines::ComponentLayout* loaded = layout ? layout->find(c.name) : nullptr;
      parts.emplace_back(c.name, inspect_component(c.name, c.path, variant, loaded ? &loaded->options : nullptr));
    }
    const std::string refusal = tp > 0 && layout ? pipeline_tp_refusal(*layout, parts, tp) : std::string();
    for (const auto& c : pipe.components) {
      auto it = std::find_if(parts.begin(), parts.end(), [&](const auto& p) { return p.first == c.name; });
      if (it == parts.end()) {
        out["components"].push_back({{"name", c.name}, {"class", c.cls}, {"weights", false}});
        continue;
      }
      if (tp > 0) it->second.add_tp(tp, refusal);
      it->second.json["weights"] = true;
      out["components"].push_back(std::move(it->second.json));
    }
  } else {
    auto comp = inspect_component(fs::path(path).filename().string(), path, variant, nullptr);
    if (tp > 0) comp.add_tp(tp, "");
    comp.json["weights"] = true;
    out["components"].push_back(std::move(comp.json));
  }
  bool tp_ok = true;
  for (const auto& c : out["components"])
    if (c.contains("tp") && !c["tp"]["valid"].get<bool>()) tp_ok = false;
  if (json) {
    std::cout << out.dump(2) << "\n";
  } else {
    if (out.contains("class")) std::cout << fmt::format("pipeline {} ({})\n", path, out["class"].get<std::string>());
    for (const auto& c : out["components"]) {
      if (!c["weights"].get<bool>()) {
        std::cout << fmt::format("component {} ({}): no weights\n", c["name"].get<std::string>(),
                                 c["class"].get<std::string>());
        continue;
      }
      print_text(c);
    }
  }
  return tp_ok ? exit_code::kOk : exit_code::kConfig;
}

}  // namespace

Command inspect_command() {
  Command c;
  c.name = "inspect";
  c.summary = "list a checkpoint's components and tensors, check it, and show what each TP rank would read";
  c.usage = "PATH";
  c.add_options = [](po::options_description& desc, po::positional_options_description& pos) {
    po::options_description o("Inspect");
    o.add_options()
        ("path", po::value<std::string>()->required(), "pipeline folder, component folder, .safetensors or .h5 file")
        ("tp", po::value<int>()->default_value(0), "also check this TP size and show the bytes each rank reads")
        ("json", po::bool_switch(), "print JSON instead of a table")
        ("variant", po::value<std::string>()->default_value(""), "weight variant, e.g. fp16")
        ("log-level", po::value<std::string>()->default_value(""), "trace|debug|info|warn|error");
    desc.add(o);
    pos.add("path", 1);
  };
  c.run = [](const po::variables_map& vm, int*, char***) {
    return run_file_tool(vm["log-level"].as<std::string>(), [&] {
      // Bounded before anything is read: no job has more ranks (runtime/rank_env.h).
      const int tp = vm["tp"].as<int>();
      if (tp < 0 || tp > kMaxWorld) throw ConfigError(fmt::format("--tp {} is outside [0, {}]", tp, kMaxWorld), true);
      return run_inspect(vm["path"].as<std::string>(), tp, vm["json"].as<bool>(), vm["variant"].as<std::string>());
    });
  };
  return c;
}

}  // namespace tprun::cli
