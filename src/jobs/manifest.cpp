// Manifest parsing with toml++ (runtime/strict_toml.h): strict keys and types,
// file:line in every message, CLI overrides applied to the document before
// validation.
#include "jobs/manifest.h"

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "jobs/output_folder.h"
#include "lora/lora_choice.h"
#include "memory/memory_table.h"
#include "pipelines/request_checks.h"
#include "runtime/error.h"
#include "runtime/rank_env.h"
#include "runtime/size_string.h"
#include "runtime/strict_toml.h"

namespace tprun::jobs {
namespace fs = std::filesystem;

namespace {

std::string resolve(const std::string& manifest, const std::string& p) {
  if (p.empty() || fs::path(p).is_absolute()) return p;
  return (fs::path(manifest).parent_path() / p).lexically_normal().string();
}

// [parallel]
void read_parallel_table(const TomlDoc& doc, const toml::table& table, Manifest& m) {
  walk_table(doc, table, "parallel.",
             {{"tp", [&](const FieldReader& r, const std::string& f, const toml::node& v) {
                 if (v.is_string()) {
                   if (r.str(f, v) != "auto") doc.fail(r.key(f), v, "must be a whole number or \"auto\"");
                   m.tp = 0;  // chosen at start by the fit planner
                   return;
                 }
                 m.tp = static_cast<int>(r.integer(f, v, 1, 4096));
               }},
              {"dp", [&](const FieldReader& r, const std::string& f, const toml::node& v) {
                 m.dp = static_cast<int>(r.integer(f, v, 0, 1 << 20));
               }},
              {"device", [&](const FieldReader& r, const std::string& f, const toml::node& v) {
                 m.device = r.str(f, v);
                 if (m.device != "auto" && m.device != "cpu" && m.device != "cuda") {
                   doc.fail(r.key(f), v, fmt::format("'{}' is not one of auto, cpu, cuda", m.device));
                 }
               }},
              {"allow_cross_node_tp", [&](const FieldReader& r, const std::string& f, const toml::node& v) {
                 m.allow_cross_node_tp = r.boolean(f, v);
               }},
              {"shard_text_encoders", [&](const FieldReader& r, const std::string& f, const toml::node& v) {
                 m.shard_text_encoders = r.boolean(f, v);
               }},
              {"shard_modulation", [&](const FieldReader& r, const std::string& f, const toml::node& v) {
                 m.shard_modulation = r.boolean(f, v);
               }}});
}

// A --set value TOML cannot hold (1e400, 99999999999999999999) arrives as a
// string: name it a number out of range, not "found a string". A string in
// the file, or one that reads as a number within range, keeps the type message.
void refuse_unreadable_number(const TomlDoc& doc, const FieldReader& r, const std::string& f, const toml::node& v,
                              const pipelines::RequestBound& b) {
  if (!v.is_string() || !doc.overridden.count(r.key(f))) return;
  const std::string& text = v.as_string()->get();
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(text.c_str(), &end);
  if (text.empty() || end == text.c_str() || *end != '\0') return;  // not a number
  if (errno != ERANGE && x >= b.lo && x <= b.hi) return;
  doc.fail(r.key(f), v,
           fmt::format("{} is a number outside [{}, {}]{}", clip_text(text), b.lo, b.hi,
                       b.integer ? " (a whole number)" : ""));
}

// [defaults]: each numeric key within the bound every request is held to
// (pipelines::request_bound); where each was set is kept for the checks
// against the pipeline (check_defaults).
void read_defaults_table(const TomlDoc& doc, const toml::table& table, Manifest& m) {
  pipelines::GenerationRequest& d = m.defaults;
  auto integer = [&](const char* name, std::optional<int64_t>& out) -> FieldHandler {
    return [&doc, &m, &out, name](const FieldReader& r, const std::string& f, const toml::node& v) {
      const pipelines::RequestBound& b = pipelines::request_bound(name);
      refuse_unreadable_number(doc, r, f, v, b);
      out = r.integer(f, v, static_cast<int64_t>(b.lo), static_cast<int64_t>(b.hi));
      m.defaults_where[name] = doc.where(r.key(f), v);
    };
  };
  auto number = [&](const char* name, std::optional<double>& out) -> FieldHandler {
    return [&doc, &m, &out, name](const FieldReader& r, const std::string& f, const toml::node& v) {
      const pipelines::RequestBound& b = pipelines::request_bound(name);
      refuse_unreadable_number(doc, r, f, v, b);
      out = r.number(f, v, b.lo, b.hi);
      m.defaults_where[name] = doc.where(r.key(f), v);
    };
  };
  walk_table(doc, table, "defaults.",
             {{"height", integer("height", d.height)},
              {"width", integer("width", d.width)},
              {"steps", integer("steps", d.steps)},
              {"guidance", number("guidance", d.guidance)},
              {"true_cfg_scale", number("true_cfg_scale", d.true_cfg_scale)},
              {"max_sequence_length", integer("max_sequence_length", d.max_sequence_length)},
              {"frames", integer("frames", d.frames)},
              {"fps", integer("fps", d.fps)},
              {"guidance_2", number("guidance_2", d.guidance_2)},
              {"negative_prompt", [&](const FieldReader& r, const std::string& f, const toml::node& v) {
                 const std::string text = r.str(f, v);
                 // Refused here, not by every request after the load (PNG text cannot carry a NUL).
                 if (const size_t nul = text.find('\0'); nul != std::string::npos)
                   doc.fail(r.key(f), v, fmt::format("holds a NUL character (at byte {})", nul));
                 if (text.empty()) d.negative_prompt.reset();
                 else d.negative_prompt = text;
                 m.defaults_where["negative_prompt"] = doc.where(r.key(f), v);
               }},
              {"seed", [&](const FieldReader& r, const std::string& f, const toml::node& v) {
                 d.seed = static_cast<uint64_t>(r.integer(f, v, 0, INT64_MAX));
               }}});
}

// [output]
void read_output_table(const TomlDoc& doc, const toml::table& table, Manifest& m) {
  walk_table(doc, table, "output.",
             {{"dir", [&](const FieldReader& r, const std::string& f, const toml::node& v) {
                 m.output_dir = r.str(f, v);
                 if (m.output_dir.empty()) doc.fail(r.key(f), v, "must not be empty");
               }},
              {"formats", [&](const FieldReader& r, const std::string& f, const toml::node& v) {
                 if (!v.is_array()) {
                   doc.fail(r.key(f), v, fmt::format("must be an array, found {}", toml_type_name(v)));
                 }
                 m.png = m.hdf5 = m.latents = m.mp4 = m.frame_pngs = false;
                 for (const auto& e : *v.as_array()) {
                   const std::string s = r.str(f, e);
                   if (s == "png") m.png = true;
                   else if (s == "hdf5") m.hdf5 = true;
                   else if (s == "latents") m.latents = true;
                   else if (s == "mp4") m.mp4 = true;
                   else if (s == "frames") m.frame_pngs = true;
                   else doc.fail(r.key(f), e, fmt::format("'{}' is not one of png, mp4, frames, hdf5, latents", clip_text(s)));
                 }
                 if (!m.png && !m.hdf5 && !m.latents && !m.mp4 && !m.frame_pngs) doc.fail(r.key(f), v, "names no format");
               }},
              {"batch_size", [&](const FieldReader& r, const std::string& f, const toml::node& v) {
                 m.batch_size = r.integer(f, v, 1, pipelines::kMaxBatchSize);
               }}});
}

// [schedule]
void read_schedule_table(const TomlDoc& doc, const toml::table& table, Manifest& m) {
  walk_table(doc, table, "schedule.",
             {{"phases", [&](const FieldReader& r, const std::string& f, const toml::node& v) {
                 m.phases = r.str(f, v);
                 if (m.phases != "auto" && m.phases != "together" && m.phases != "staged") {
                   doc.fail(r.key(f), v, fmt::format("'{}' is not one of auto, together, staged", m.phases));
                 }
               }},
              {"experts", [&](const FieldReader& r, const std::string& f, const toml::node& v) {
                 m.experts = r.str(f, v);
                 if (m.experts != "auto" && m.experts != "resident" && m.experts != "staged") {
                   doc.fail(r.key(f), v, fmt::format("'{}' is not one of auto, resident, staged", clip_text(m.experts)));
                 }
               }},
              {"stage_requests", [&](const FieldReader& r, const std::string& f, const toml::node& v) {
                 m.stage_requests = r.integer(f, v, 0, pipelines::kMaxStageRequests);
               }},
              {"device_memory", [&](const FieldReader& r, const std::string& f, const toml::node& v) {
                 const std::string text = r.str(f, v);
                 try {
                   m.device_memory = parse_size(text, r.key(f));
                 } catch (const Error&) {
                   doc.fail(r.key(f), v, fmt::format("'{}' is not a size (e.g. \"80GB\", \"24GiB\")", clip_text(text)));
                 }
                 if (m.device_memory == 0) doc.fail(r.key(f), v, "must be more than 0 bytes");
               }}});
}

// [[loras]]: the job's adapters, each a table {path, scale}; at most
// lora::kMaxLorasPerRequest, each scale finite and within kMaxLoraScale.
void read_loras_array(const TomlDoc& doc, const std::string& key, const toml::node& n, Manifest& m) {
  if (!n.is_array()) {
    doc.fail(key, n, fmt::format("must be an array of tables ([[loras]] with path and scale), found {}",
                                 toml_type_name(n)));
  }
  const toml::array& entries = *n.as_array();
  if (entries.size() > lora::kMaxLorasPerRequest) {
    doc.fail(key, n, fmt::format("{} adapters, more than {} (the most one request stacks)", entries.size(),
                                 lora::kMaxLorasPerRequest));
  }
  std::vector<lora::LoraChoice> set;
  m.lora_written.clear();
  m.lora_where.clear();
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string entry_key = fmt::format("{}[{}]", key, i);
    const toml::table& t = table_at(doc, entry_key, entries[i]);
    lora::LoraChoice c;
    bool have_path = false;
    std::string where = doc.where(entry_key, entries[i]);
    walk_table(doc, t, entry_key + ".",
               {{"path", [&](const FieldReader& r, const std::string& f, const toml::node& v) {
                   c.path = r.str(f, v);
                   if (c.path.empty()) doc.fail(r.key(f), v, "must name a .safetensors file");
                   if (c.path.find('\0') != std::string::npos) doc.fail(r.key(f), v, "holds a NUL character");
                   where = doc.where(r.key(f), v);
                   have_path = true;
                 }},
                {"scale", [&](const FieldReader& r, const std::string& f, const toml::node& v) {
                   c.scale = r.number(f, v, -lora::kMaxLoraScale, lora::kMaxLoraScale);
                 }}});
    if (!have_path) doc.fail(entry_key + ".path", entries[i], "required key is missing");
    m.lora_written.push_back(c.path);
    m.lora_where.push_back(where);
    set.push_back(std::move(c));
  }
  m.defaults.loras = std::move(set);
}

// [lora]: how the adapters apply, and where a request's own may come from.
void read_lora_table(const TomlDoc& doc, const toml::table& table, Manifest& m) {
  walk_table(doc, table, "lora.",
             {{"strict", [&](const FieldReader& r, const std::string& f, const toml::node& v) {
                 m.lora_strict = r.boolean(f, v);
               }},
              {"apply", [&](const FieldReader& r, const std::string& f, const toml::node& v) {
                 m.lora_apply = r.str(f, v);
                 if (m.lora_apply != "auto" && m.lora_apply != "fused" && m.lora_apply != "runtime") {
                   doc.fail(r.key(f), v, fmt::format("'{}' is not one of auto, fused, runtime", clip_text(m.lora_apply)));
                 }
               }},
              {"dirs", [&](const FieldReader& r, const std::string& f, const toml::node& v) {
                 if (!v.is_array()) {
                   doc.fail(r.key(f), v, fmt::format("must be an array of folders, found {}", toml_type_name(v)));
                 }
                 if (v.as_array()->size() > kMaxLoraDirs) {
                   doc.fail(r.key(f), v, fmt::format("{} folders, more than {}", v.as_array()->size(), kMaxLoraDirs));
                 }
                 m.lora_dirs.clear();
                 for (const auto& e : *v.as_array()) {
                   std::string dir = r.str(f, e);
                   if (dir.empty()) doc.fail(r.key(f), e, "names an empty folder");
                   if (dir.find('\0') != std::string::npos) doc.fail(r.key(f), e, "holds a NUL character");
                   m.lora_dirs.push_back(std::move(dir));
                 }
                 m.lora_dirs_where = doc.where(r.key(f), v);
               }}});
}

// The top level: the keys, then the tables; `model` and `requests` are required.
void read_manifest_root(const TomlDoc& doc, const toml::table& root, Manifest& m) {
  bool have_model = false, have_requests = false;
  const std::map<std::string, FieldHandler> top = {
      {"model", [&](const FieldReader& r, const std::string& k, const toml::node& n) {
         m.model = r.str(k, n);
         if (m.model.empty()) doc.fail(k, n, "must name the pipeline folder");
         have_model = true;
       }},
      {"dtype", [&](const FieldReader& r, const std::string& k, const toml::node& n) {
         m.dtype = r.str(k, n);
         if (m.dtype != "fp32" && m.dtype != "bf16" && m.dtype != "fp16") {
           doc.fail(k, n, fmt::format("'{}' is not one of fp32, bf16, fp16", m.dtype));
         }
       }},
      {"requests", [&](const FieldReader& r, const std::string& k, const toml::node& n) {
         m.requests = r.str(k, n);
         if (m.requests.empty()) doc.fail(k, n, "must name the JSONL requests file");
         have_requests = true;
       }},
      {"parallel", [&](const FieldReader&, const std::string& k, const toml::node& n) {
         read_parallel_table(doc, table_at(doc, k, n), m);
       }},
      {"memory", [&](const FieldReader&, const std::string& k, const toml::node& n) {
         memory::read_memory_table(doc, table_at(doc, k, n), m.memory);
       }},
      {"defaults", [&](const FieldReader&, const std::string& k, const toml::node& n) {
         read_defaults_table(doc, table_at(doc, k, n), m);
       }},
      {"output", [&](const FieldReader&, const std::string& k, const toml::node& n) {
         read_output_table(doc, table_at(doc, k, n), m);
       }},
      {"schedule", [&](const FieldReader&, const std::string& k, const toml::node& n) {
         read_schedule_table(doc, table_at(doc, k, n), m);
       }},
      {"loras", [&](const FieldReader&, const std::string& k, const toml::node& n) {
         read_loras_array(doc, k, n, m);
       }},
      {"lora", [&](const FieldReader&, const std::string& k, const toml::node& n) {
         read_lora_table(doc, table_at(doc, k, n), m);
       }},
  };
  walk_table(doc, root, "", top);
  if (!have_model) throw ConfigError(fmt::format("{}: model: required key is missing", doc.path), true);
  if (!have_requests) throw ConfigError(fmt::format("{}: requests: required key is missing", doc.path), true);
  if (m.tp == 0 && m.dp > 0) {
    throw ConfigError(fmt::format("{}: parallel.tp = \"auto\" chooses dp too (the most replicas that fit); leave "
                                  "parallel.dp unset or set parallel.tp to a number",
                                  doc.path),
                      true);
  }
  if (int64_t{m.tp} * m.dp > kMaxWorld) {
    throw ConfigError(fmt::format("{}: parallel.tp {} x parallel.dp {} = {} ranks, more than tprun supports (at most "
                                  "{})",
                                  doc.path, m.tp, m.dp, int64_t{m.tp} * m.dp, kMaxWorld),
                      true);
  }
}

// Paths from the manifest are relative to its folder; from the command line
// (--set, --out: the key or a table above it), to the current folder.
void place_paths(const TomlDoc& doc, Manifest& m) {
  auto from_command_line = [&](const std::string& key) {
    for (const auto& o : doc.overridden) {
      if (key == o || key.rfind(o + ".", 0) == 0) return true;
    }
    return false;
  };
  auto place = [&](const std::string& key, const std::string& value) {
    return doc.overridden.count(key) ? fs::absolute(value).lexically_normal().string() : resolve(doc.path, value);
  };
  m.model = place("model", m.model);
  m.requests = place("requests", m.requests);
  m.output_dir = place("output.dir", m.output_dir);
  // The offload folders, where a table above them may have come from the command line.
  auto place_folder = [&](const std::string& key, std::string& value) {
    if (value.empty()) return;
    value = from_command_line(key) ? fs::absolute(value).lexically_normal().string() : resolve(doc.path, value);
  };
  place_folder("memory.offload.disk_path", m.memory.offload.disk_path);
  place_folder("memory.offload_folder", m.memory.offload_folder);
  // Adapters: absolute, so a request's set names each file one way (jobs/lora_paths.h
  // then resolves the symlinks).
  auto place_absolute = [&](const std::string& key, std::string& value) {
    value = fs::absolute(from_command_line(key) ? fs::path(value) : fs::path(resolve(doc.path, value)))
                .lexically_normal()
                .string();
  };
  if (m.defaults.loras) {
    for (auto& c : *m.defaults.loras) place_absolute("loras", c.path);
  }
  for (auto& dir : m.lora_dirs) place_absolute("lora.dirs", dir);
}

}  // namespace

Override parse_override(const std::string& text) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw ConfigError(fmt::format("--set '{}': expected KEY=VALUE, e.g. defaults.steps=4", text), true);
  }
  return {text.substr(0, eq), text.substr(eq + 1)};
}

Manifest parse_manifest(const std::string& path, const std::vector<Override>& overrides) {
  if (!fs::is_regular_file(path)) throw ConfigError(fmt::format("manifest {}: no such file", path), true);
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) throw ConfigError(fmt::format("manifest {}: cannot read it", path), true);
  return parse_manifest_text(text.str(), path, overrides);
}

Manifest parse_manifest_text(const std::string& text, const std::string& path, const std::vector<Override>& overrides) {
  TomlDoc doc(path, "--set");
  toml::table root = parse_toml_document(text, path);
  for (const auto& o : overrides) apply_override(root, o, doc);
  Manifest m;
  m.path = path;
  read_manifest_root(doc, root, m);
  place_paths(doc, m);
  return m;
}

}  // namespace tprun::jobs
