// `tprun inspect PATH`: what a checkpoint holds and what each TP rank would read.
#include <filesystem>
#include <iostream>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/component_checkpoint.h"
#include "checkpoint/hdf5_source.h"
#include "checkpoint/pipeline_folder.h"
#include "cli/command.h"
#include "models/model_config.h"
#include "models/model_registry.h"
#include "runtime/error.h"
#include "runtime/size_string.h"

namespace tprun::cli {
namespace {

namespace fs = std::filesystem;
using checkpoint::ComponentCheckpoint;

bool folder_has_weights(const fs::path& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.find(".safetensors") != std::string::npos || checkpoint::is_pickle_file(n)) return true;
  }
  return false;
}

struct Row {
  std::string name;
  checkpoint::Dtype dtype;
  std::vector<int64_t> shape;
  uint64_t bytes;
  std::string file;
};

// What a component holds, from either format.
struct Listing {
  nlohmann::json config = nlohmann::json::object();
  bool has_config = false;
  std::string config_path;
  std::string index;
  std::vector<std::string> files;
  std::vector<Row> rows;  // by name
  uint64_t total = 0;
};

Listing list_component(const std::string& path, const std::string& variant) {
  Listing l;
  if (checkpoint::is_hdf5_file(path)) {
    checkpoint::Hdf5Source src(path);
    l.config = src.config();
    l.has_config = src.has_config();
    l.config_path = path + ":config.json";
    l.files.push_back(fs::path(path).filename().string());
    for (const auto& n : src.tensor_names()) {
      const auto t = src.describe(n);
      l.rows.push_back({n, t.dtype, t.shape, t.nbytes(), l.files[0]});
    }
  } else {
    ComponentCheckpoint ck = ComponentCheckpoint::open(path, variant);
    l.config = ck.config();
    l.has_config = ck.has_config();
    l.config_path = (fs::path(path) / "config.json").string();
    l.index = ck.index_path();
    for (const auto& f : ck.files()) l.files.push_back(fs::path(f.file).filename().string());
    for (const auto& n : ck.tensor_names()) {
      const auto loc = ck.locate(n);
      l.rows.push_back({n, loc.entry->dtype, loc.entry->shape, loc.entry->nbytes(),
                        fs::path(ck.files()[loc.file].file).filename().string()});
    }
  }
  for (const auto& r : l.rows) l.total += r.bytes;
  return l;
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

// One stored tensor and, with a model table, its TP plan there; a shape other
// than the table's is a CheckpointError.
nlohmann::json tensor_json(const Row& row, const models::ModelTable* table, const std::string& config_path) {
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

// What each of `tp` ranks would read; {"valid": false, "error"} when the
// model cannot run at that TP size.
nlohmann::json tp_shares(const std::vector<Row>& rows, const models::ModelTable* table, int tp,
                         const std::string& path) {
  nlohmann::json j;
  j["size"] = tp;
  try {
    if (table) models::validate_tp_size(*table, tp, path);
    std::vector<uint64_t> per_rank(static_cast<size_t>(tp), 0);
    for (int r = 0; r < tp; ++r) {
      for (const auto& row : rows) {
        checkpoint::ShardRequest req;  // tensors the model does not know are read whole
        if (table && table->find(row.name)) req = table->request(row.name, r, tp);
        req.tp_rank = r;
        req.tp_size = tp;
        per_rank[static_cast<size_t>(r)] +=
            checkpoint::plan_slice(row.name, row.shape, checkpoint::dtype_bits(row.dtype), req).bytes;
      }
    }
    j["valid"] = true;
    j["bytes_per_rank"] = per_rank;
  } catch (const Error& err) {
    j["valid"] = false;
    j["error"] = err.what();
  }
  return j;
}

// Inspects one component; returns its JSON description. Throws on an invalid checkpoint.
nlohmann::json inspect_component(const std::string& name, const std::string& path, const std::string& variant,
                                 int tp) {
  const Listing l = list_component(path, variant);
  std::optional<models::ModelTable> table;
  if (l.has_config) {
    std::vector<std::string> names;
    for (const auto& row : l.rows) names.push_back(row.name);
    const models::TensorCensus census(std::move(names), path);  // block counts against what the checkpoint holds
    table = models::model_table_for(l.config, l.config_path, {}, &census);
  }
  const models::ModelTable* t = table ? &*table : nullptr;

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
    out["tensors"].push_back(tensor_json(row, t, l.config_path));
  }
  if (table) check_required_tensors(*table, present, path);
  out["total_bytes"] = l.total;
  if (tp > 0) out["tp"] = tp_shares(l.rows, t, tp, path);
  return out;
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
    for (const auto& c : pipe.components) {
      if (!folder_has_weights(c.path)) {
        out["components"].push_back({{"name", c.name}, {"class", c.cls}, {"weights", false}});
        continue;
      }
      auto comp = inspect_component(c.name, c.path, variant, tp);
      comp["weights"] = true;
      out["components"].push_back(std::move(comp));
    }
  } else {
    auto comp = inspect_component(fs::path(path).filename().string(), path, variant, tp);
    comp["weights"] = true;
    out["components"].push_back(std::move(comp));
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
      const int tp = vm["tp"].as<int>();
      if (tp < 0) throw ConfigError(fmt::format("--tp {} must be positive", tp), true);
      return run_inspect(vm["path"].as<std::string>(), tp, vm["json"].as<bool>(), vm["variant"].as<std::string>());
    });
  };
  return c;
}

}  // namespace tprun::cli
