// `tprun inspect PATH`: what a checkpoint holds and what each TP rank would read.
#include <filesystem>
#include <iostream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/component_checkpoint.h"
#include "checkpoint/pipeline_folder.h"
#include "cli/command.h"
#include "models/model_table.h"
#include "runtime/error.h"
#include "runtime/logging.h"
#include "runtime/rank_env.h"
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

// Inspects one component; returns its JSON description. Throws on an invalid checkpoint.
nlohmann::json inspect_component(const std::string& name, const std::string& path, const std::string& variant,
                                 int tp) {
  ComponentCheckpoint ck = ComponentCheckpoint::open(path, variant);
  const std::string config_path = (fs::path(path) / "config.json").string();
  std::optional<models::ModelTable> table;
  if (ck.has_config()) table = models::model_table_for(ck.config(), config_path);

  nlohmann::json out;
  out["name"] = name;
  out["path"] = path;
  out["class"] = ck.config().value("_class_name", "");
  out["model_table"] = table.has_value();
  out["index"] = ck.index_path();
  for (const auto& f : ck.files()) out["files"].push_back(fs::path(f.file).filename().string());
  out["tensors"] = nlohmann::json::array();
  for (const auto& tname : ck.tensor_names()) {
    const auto loc = ck.locate(tname);
    const auto* e = loc.entry;
    nlohmann::json t;
    t["name"] = tname;
    t["dtype"] = checkpoint::dtype_name(e->dtype);
    t["shape"] = e->shape;
    t["bytes"] = e->nbytes();
    t["file"] = fs::path(ck.files()[loc.file].file).filename().string();
    std::string plan = "-";
    if (table) {
      const models::TensorSpec* spec = table->find(tname);
      if (spec == nullptr) {
        plan = "(not in model)";
      } else {
        if (spec->shape != e->shape) {
          throw CheckpointError(fmt::format("{}: tensor '{}' has wrong shape; expected {} (from {}), got {}",
                                            ck.files()[loc.file].file, tname, checkpoint::shape_string(spec->shape),
                                            config_path, checkpoint::shape_string(e->shape)));
        }
        plan = spec->style == checkpoint::ShardStyle::Replicated ? "replicated"
                                                                  : checkpoint::shard_style_name(spec->style);
      }
    }
    t["plan"] = plan;
    out["tensors"].push_back(std::move(t));
  }
  if (table) {
    for (const auto& spec : table->tensors) {
      if (!spec.optional && !ck.contains(spec.name)) {
        throw CheckpointError(fmt::format("{}: tensor '{}' (shape {}) that {} needs is missing", path, spec.name,
                                          checkpoint::shape_string(spec.shape), table->cls));
      }
    }
  }
  out["total_bytes"] = ck.total_bytes();
  if (tp > 0) {
    nlohmann::json j;
    j["size"] = tp;
    try {
      if (table && table->num_attention_heads % tp != 0) {
        throw ConfigError(fmt::format("tp {} does not divide num_attention_heads {}", tp, table->num_attention_heads));
      }
      std::vector<uint64_t> per_rank(static_cast<size_t>(tp), 0);
      for (int r = 0; r < tp; ++r) {
        for (const auto& tname : ck.tensor_names()) {
          const auto* e = ck.locate(tname).entry;
          checkpoint::ShardRequest req;
          if (table) req = table->request(tname, r, tp);
          req.tp_rank = r;
          req.tp_size = tp;
          per_rank[static_cast<size_t>(r)] +=
              checkpoint::plan_slice(tname, e->shape, checkpoint::dtype_bits(e->dtype), req).bytes;
        }
      }
      j["valid"] = true;
      j["bytes_per_rank"] = per_rank;
    } catch (const Error& err) {
      j["valid"] = false;
      j["error"] = err.what();
    }
    out["tp"] = j;
  }
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
        ("path", po::value<std::string>()->required(), "pipeline folder, component folder or .safetensors file")
        ("tp", po::value<int>()->default_value(0), "also check this TP size and show the bytes each rank reads")
        ("json", po::bool_switch(), "print JSON instead of a table")
        ("variant", po::value<std::string>()->default_value(""), "weight variant, e.g. fp16")
        ("log-level", po::value<std::string>()->default_value(""), "trace|debug|info|warn|error");
    desc.add(o);
    pos.add("path", 1);
  };
  c.run = [](const po::variables_map& vm, int*, char***) {
    auto env = rank_env_from_variables(process_env());
    const int rank = env ? env->rank : 0;
    init_logging({rank, env ? env->world : 1, vm["log-level"].as<std::string>(), ""});
    const int tp = vm["tp"].as<int>();
    if (tp < 0) throw ConfigError(fmt::format("--tp {} must be positive", tp), true);
    // A file tool: every rank checks (so every rank fails alike), rank 0 prints.
    std::streambuf* saved = nullptr;
    std::ostringstream sink;
    if (rank != 0) saved = std::cout.rdbuf(sink.rdbuf());
    int rc = exit_code::kOk;
    try {
      rc = run_inspect(vm["path"].as<std::string>(), tp, vm["json"].as<bool>(), vm["variant"].as<std::string>());
    } catch (const Error& e) {
      if (saved) std::cout.rdbuf(saved);
      // Identical on every rank: a clean exit everywhere, no MPI_Abort.
      if (e.kind() == Error::Kind::Checkpoint) throw CheckpointError(e.what(), true);
      if (e.kind() == Error::Kind::Config) throw ConfigError(e.what(), true);
      throw;
    }
    if (saved) std::cout.rdbuf(saved);
    return rc;
  };
  return c;
}

}  // namespace tprun::cli
