// Manifest parsing with toml++: strict keys and types, file:line in every
// message, CLI overrides applied to the document before validation.
#include "jobs/manifest.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <cstring>
#include <map>
#include <set>

#include <fmt/format.h>
// toml++'s internal assertions are off in every build, as in a release build
// (NDEBUG): 3.3 asserts on some malformed headers ("[\n[x]") that its parser
// then reports as ordinary parse errors.
#define TOML_ASSERT(expr) static_cast<void>(0)
#include <toml++/toml.h>

#include "jobs/output_folder.h"
#include "memory/memory_options.h"
#include "runtime/error.h"
#include "runtime/size_string.h"
#include "runtime/user_pattern.h"

namespace tprun::jobs {
namespace fs = std::filesystem;

namespace {

void refuse_non_ascii_outside_strings(const std::string& text, const std::string& where);

struct Doc {
  std::string path;
  std::set<std::string> overridden;  // dotted keys set from the command line
  // The flag that set them, and the key prefix it leaves out ("--memory
  // vae_tiling" for memory.vae_tiling).
  std::string flag = "--set";
  std::string flag_prefix;

  std::string flag_key(const std::string& key) const {
    const bool strip = !flag_prefix.empty() && key.rfind(flag_prefix, 0) == 0;
    return fmt::format("{} {}", flag, strip ? key.substr(flag_prefix.size()) : key);
  }
  std::string where(const std::string& key, const toml::node& node) const {
    if (overridden.count(key)) return flag_key(key);
    // A key inside a table the flag set ("--memory layerwise_casting={...}").
    for (const auto& o : overridden) {
      if (key.size() > o.size() && key.compare(0, o.size(), o) == 0 && key[o.size()] == '.') return flag_key(key);
    }
    // A table the flag created on the way to its key ("--set a.b.c.d=1"
    // makes a, a.b, a.b.c; none is in the file): the flag and its full key.
    if (node.source().begin.line == 0) {
      for (const auto& o : overridden) {
        if (o.size() > key.size() && o.compare(0, key.size(), key) == 0 && o[key.size()] == '.') return flag_key(o);
      }
    }
    return fmt::format("{}:{}: {}", path, node.source().begin.line, key);
  }
  [[noreturn]] void fail(const std::string& key, const toml::node& node, const std::string& what) const {
    throw ConfigError(fmt::format("{}: {}", where(key, node), what), true);
  }
};

const char* type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    default: return "a date/time";
  }
}

// Field readers: each checks the type and the range, naming file:line and key.
struct Reader {
  const Doc& doc;
  std::string prefix;  // "defaults." or ""

  std::string key(const std::string& k) const { return prefix + k; }
  std::string str(const std::string& k, const toml::node& n) const {
    if (!n.is_string()) doc.fail(key(k), n, fmt::format("must be a string, found {}", type_name(n)));
    return n.as_string()->get();
  }
  int64_t integer(const std::string& k, const toml::node& n, int64_t lo, int64_t hi) const {
    if (!n.is_integer()) doc.fail(key(k), n, fmt::format("must be an integer, found {}", type_name(n)));
    const int64_t v = n.as_integer()->get();
    if (v < lo || v > hi) doc.fail(key(k), n, fmt::format("{} is outside [{}, {}]", v, lo, hi));
    return v;
  }
  double number(const std::string& k, const toml::node& n, double lo, double hi) const {
    double v = 0;
    if (n.is_integer()) {
      v = static_cast<double>(n.as_integer()->get());
    } else if (n.is_floating_point()) {
      v = n.as_floating_point()->get();
    } else {
      doc.fail(key(k), n, fmt::format("must be a number, found {}", type_name(n)));
    }
    if (!(v >= lo && v <= hi)) {
      // An integer as written (INT64_MAX, not its double 9.223372036854776e+18).
      const std::string shown = n.is_integer() ? std::to_string(n.as_integer()->get()) : fmt::format("{}", v);
      doc.fail(key(k), n, fmt::format("{} is outside [{}, {}]", shown, lo, hi));
    }
    return v;
  }
  bool boolean(const std::string& k, const toml::node& n) const {
    if (!n.is_boolean()) doc.fail(key(k), n, fmt::format("must be true or false, found {}", type_name(n)));
    return n.as_boolean()->get();
  }
};

using Handler = std::function<void(const Reader&, const std::string&, const toml::node&)>;

// Runs the handler of every key of `table`; an unknown key is an error that
// lists the known ones.
void walk(const Doc& doc, const toml::table& table, const std::string& prefix,
          const std::map<std::string, Handler>& handlers) {
  Reader r{doc, prefix};
  for (const auto& [k, node] : table) {
    const std::string name(k.str());
    auto it = handlers.find(name);
    if (it == handlers.end()) {
      std::vector<std::string> known;
      for (const auto& [h, _] : handlers) known.push_back(prefix + h);
      doc.fail(prefix + name, node, fmt::format("unknown key (known: {})", fmt::join(known, ", ")));
    }
    it->second(r, name, node);
  }
}

const toml::table& as_table(const Doc& doc, const std::string& key, const toml::node& n) {
  if (!n.is_table()) doc.fail(key, n, fmt::format("must be a table ([{}]), found {}", key, type_name(n)));
  return *n.as_table();
}

// memory.offload: "model" | "sequential" | { type, blocks_per_group, to, disk_path, prefetch }.
void walk_offload(const Doc& doc, const std::string& key, const toml::node& v, memory::OffloadOptions& o) {
  o = memory::OffloadOptions{};
  if (v.is_string()) {
    const std::string s = v.as_string()->get();
    if (s == "model") {
      o.type = "model_level";
    } else if (s == "sequential") {
      o.type = "leaf_level";
    } else {
      doc.fail(key, v, fmt::format("'{}' is not \"model\" or \"sequential\" (or a table: {{ type = \"block_level\", "
                                   "blocks_per_group = 1, to = \"disk\", disk_path = \"...\", prefetch = true }})",
                                   s));
    }
    return;
  }
  if (!v.is_table()) doc.fail(key, v, fmt::format("must be \"model\", \"sequential\" or a table, found {}", type_name(v)));
  walk(doc, *v.as_table(), key + ".",
       {{"type", [&](const Reader& r, const std::string& f, const toml::node& n) {
           o.type = r.str(f, n);
           const auto& ok = memory::offload_types();
           if (std::find(ok.begin(), ok.end(), o.type) == ok.end()) {
             doc.fail(r.key(f), n, fmt::format("'{}' is not one of {}", o.type, fmt::join(ok, ", ")));
           }
         }},
        {"blocks_per_group", [&](const Reader& r, const std::string& f, const toml::node& n) {
           o.blocks_per_group = r.integer(f, n, 1, memory::kMaxBlocksPerGroup);
         }},
        {"to", [&](const Reader& r, const std::string& f, const toml::node& n) {
           o.to = r.str(f, n);
           if (o.to != "cpu" && o.to != "disk") doc.fail(r.key(f), n, fmt::format("'{}' is not \"cpu\" or \"disk\"", o.to));
         }},
        {"disk_path", [&](const Reader& r, const std::string& f, const toml::node& n) {
           o.disk_path = r.str(f, n);
           if (o.disk_path.empty()) doc.fail(r.key(f), n, "must name a folder");
         }},
        {"prefetch", [&](const Reader& r, const std::string& f, const toml::node& n) { o.prefetch = r.boolean(f, n); }}});
  if (o.type.empty()) doc.fail(key + ".type", v, "required key is missing (block_level, leaf_level or model_level)");
  if (o.to == "disk" && o.disk_path.empty()) doc.fail(key + ".disk_path", v, "required when to = \"disk\"");
  if (o.to != "disk" && !o.disk_path.empty()) doc.fail(key + ".disk_path", v, "only with to = \"disk\"");
}

// memory.device_map as a table; dotted keys written bare in TOML
// (transformer.single_transformer_blocks.1 = "cpu") arrive as nested tables.
void flatten_device_map(const Doc& doc, const std::string& key, const std::string& prefix, const toml::table& t,
                        std::vector<memory::DevicePlacement>& out) {
  for (const auto& [k, node] : t) {
    const std::string name = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (node.is_table()) {
      flatten_device_map(doc, key, name, *node.as_table(), out);
      continue;
    }
    if (!node.is_string()) doc.fail(key + "." + name, node, fmt::format("must be a device string, found {}", type_name(node)));
    const std::string dev = node.as_string()->get();
    if (!memory::device_map_target(dev)) {
      doc.fail(key + "." + name, node,
               fmt::format("'{}' is not a device (\"cpu\", \"disk\", an accelerator index \"0\" or \"cuda:0\")", dev));
    }
    if (out.size() >= memory::kMaxDeviceMapEntries) doc.fail(key, node, "has too many entries");
    out.emplace_back(name, dev);
  }
}

// The [memory] table (memory/memory_options.h).
void walk_memory(const Doc& doc, const toml::table& table, memory::MemoryOptions& mo) {
  std::map<std::string, Handler> handlers = {
      {"vae_slicing", [&](const Reader& r, const std::string& f, const toml::node& v) { mo.vae_slicing = r.boolean(f, v); }},
      {"vae_tiling", [&](const Reader& r, const std::string& f, const toml::node& v) { mo.vae_tiling = r.boolean(f, v); }},
      {"vae_tile_sample_size", [&](const Reader& r, const std::string& f, const toml::node& v) {
         mo.vae_tile_sample_size = r.integer(f, v, memory::kMinVaeTile, memory::kMaxVaeTile);
       }},
      {"vae_tile_overlap", [&](const Reader& r, const std::string& f, const toml::node& v) {
         mo.vae_tile_overlap = r.number(f, v, 0.0, 0.75);
       }},
      {"attention_chunk", [&](const Reader& r, const std::string& f, const toml::node& v) {
         mo.attention_chunk = r.integer(f, v, 0, memory::kMaxAttentionChunk);
       }},
      {"layerwise_casting", [&](const Reader& r, const std::string& f, const toml::node& v) {
         const std::string key = r.key(f);
         if (!v.is_table()) {
           doc.fail(key, v,
                    fmt::format("must be a table ({{ storage = \"float8_e4m3fn\" }}), found {}", type_name(v)));
         }
         bool have_storage = false;
         mo.layerwise_skip.reset();
         walk(doc, *v.as_table(), key + ".",
              {{"storage", [&](const Reader& r2, const std::string& f2, const toml::node& v2) {
                  const std::string s = r2.str(f2, v2);
                  const auto& ok = memory::layerwise_storage_dtypes();
                  if (std::find(ok.begin(), ok.end(), s) == ok.end()) {
                    doc.fail(r2.key(f2), v2, fmt::format("'{}' is not one of {}", s, fmt::join(ok, ", ")));
                  }
                  mo.layerwise_storage = s;
                  have_storage = true;
                }},
               {"skip", [&](const Reader& r2, const std::string& f2, const toml::node& v2) {
                  if (!v2.is_array()) {
                    doc.fail(r2.key(f2), v2, fmt::format("must be an array of strings, found {}", type_name(v2)));
                  }
                  std::vector<std::string> patterns;
                  for (const auto& e : *v2.as_array()) {
                    const std::string p = r2.str(f2, e);
                    if (auto why = user_pattern_problem(p)) doc.fail(r2.key(f2), e, *why);
                    patterns.push_back(p);
                  }
                  mo.layerwise_skip = std::move(patterns);
                }}});
         if (!have_storage) doc.fail(key + ".storage", v, "required key is missing");
       }}};
  handlers["offload"] = [&](const Reader& r, const std::string& f, const toml::node& v) {
    walk_offload(doc, r.key(f), v, mo.offload);
  };
  const toml::node* offload_folder_node = nullptr;
  handlers["offload_folder"] = [&](const Reader& r, const std::string& f, const toml::node& v) {
    mo.offload_folder = r.str(f, v);
    if (mo.offload_folder.empty()) doc.fail(r.key(f), v, "must name a folder");
    offload_folder_node = &v;
  };
  handlers["device_map"] = [&](const Reader& r, const std::string& f, const toml::node& v) {
    const std::string key = r.key(f);
    mo.device_map_strategy.clear();
    mo.device_map.clear();
    if (v.is_string()) {
      if (v.as_string()->get() != "balanced") {
        doc.fail(key, v, fmt::format("'{}' is not a strategy tprun has (\"balanced\", or a table of module = device)",
                                     v.as_string()->get()));
      }
      mo.device_map_strategy = "balanced";
      return;
    }
    if (!v.is_table()) doc.fail(key, v, fmt::format("must be \"balanced\" or a table, found {}", type_name(v)));
    flatten_device_map(doc, key, "", *v.as_table(), mo.device_map);
    if (mo.device_map.empty()) doc.fail(key, v, "is an empty table");
  };
  handlers["max_memory"] = [&](const Reader& r, const std::string& f, const toml::node& v) {
    const std::string key = r.key(f);
    const toml::table& t = as_table(doc, key, v);
    mo.max_memory.clear();
    for (const auto& [k, node] : t) {
      const std::string dev(k.str());
      const std::string at = key + "." + dev;
      if (!memory::device_map_target(dev) || dev == "disk") {
        doc.fail(at, node, "a device is \"cpu\", an accelerator index (\"0\") or \"cuda:0\"");
      }
      uint64_t bytes = 0;
      if (node.is_integer() && node.as_integer()->get() >= 0) {
        bytes = static_cast<uint64_t>(node.as_integer()->get());
      } else if (node.is_string()) {
        try {
          bytes = parse_size(node.as_string()->get(), at);
        } catch (const Error& e) {
          doc.fail(at, node, e.what());
        }
      } else {
        doc.fail(at, node, fmt::format("must be a size (\"20GB\", \"512MiB\") or bytes, found {}", type_name(node)));
      }
      mo.max_memory.emplace_back(dev, bytes);
    }
  };
  walk(doc, table, "memory.", handlers);
  // Only a device map's "disk" entries use it: alone it would be ignored without a word.
  if (offload_folder_node != nullptr && !mo.offload_folder.empty() && !mo.device_mapped()) {
    doc.fail("memory.offload_folder", *offload_folder_node,
             "is only used with memory.device_map (its \"disk\" entries); for group offload to disk set "
             "memory.offload.disk_path");
  }
}

std::string resolve(const std::string& manifest, const std::string& p) {
  if (p.empty() || fs::path(p).is_absolute()) return p;
  return (fs::path(manifest).parent_path() / p).lexically_normal().string();
}

void apply_override(toml::table& root, const Override& o, Doc& doc) {
  const std::string& dotted = o.first;
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t dot = dotted.find('.', start);
    parts.push_back(dotted.substr(start, dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  for (const auto& p : parts) {
    if (p.empty()) throw ConfigError(fmt::format("{}: empty key component", doc.flag_key(dotted)), true);
  }
  toml::table* t = &root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    toml::node* n = t->get(parts[i]);
    if (!n) {
      t->insert(parts[i], toml::table{});
      n = t->get(parts[i]);
    }
    if (!n->is_table()) {
      throw ConfigError(fmt::format("{}: '{}' is not a table", doc.flag_key(dotted), parts[i]), true);
    }
    t = n->as_table();
  }
  // The value as TOML; a bare word that is not TOML is a string.
  toml::table parsed;
  try {
    refuse_non_ascii_outside_strings("v = " + o.second, doc.flag_key(dotted));
    parsed = toml::parse("v = " + o.second);
  } catch (const std::exception&) {
    parsed = toml::table{};
    parsed.insert("v", o.second);
  }
  t->insert_or_assign(parts.back(), *parsed.get("v"));
  doc.overridden.insert(dotted);
}

// toml++ 3.3 (Debian 12) reaches __builtin_unreachable() in its Unicode
// whitespace test for some non-ASCII code points outside strings (e.g.
// U+02C9), which is undefined behaviour. TOML allows non-ASCII text only in
// strings and comments, so such input is refused here, before toml++ sees it;
// likewise control characters outside strings (TOML forbids them; toml++ 3.3
// asserts on some, e.g. "[\r\0").
void refuse_non_ascii_outside_strings(const std::string& text, const std::string& where) {
  int64_t line = 1;
  size_t i = 0;
  const size_t n = text.size();
  auto starts = [&](const char* s) { return text.compare(i, std::strlen(s), s) == 0; };
  while (i < n) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
      ++i;
    } else if (c == '#') {
      while (i < n && text[i] != '\n') ++i;
    } else if (starts("\"\"\"") || starts("\'\'\'")) {
      const std::string close = text.substr(i, 3);
      i += 3;
      while (i < n && !starts(close.c_str())) {
        if (text[i] == '\n') ++line;
        if (close[0] == '"' && text[i] == '\\') ++i;
        ++i;
      }
      i += 3;
    } else if (c == '"' || c == '\'') {
      ++i;
      while (i < n && text[i] != c && text[i] != '\n') {
        if (c == '"' && text[i] == '\\') ++i;
        ++i;
      }
      ++i;
    } else if (static_cast<unsigned char>(c) >= 0x80) {
      throw ConfigError(fmt::format("{}:{}: a non-ASCII character outside a string or comment", where, line), true);
    } else if ((static_cast<unsigned char>(c) < 0x20 && c != '\t' && !(c == '\r' && i + 1 < n && text[i + 1] == '\n')) ||
               c == 0x7f) {
      throw ConfigError(fmt::format("{}:{}: a control character (0x{:02x}) outside a string", where, line,
                                    static_cast<unsigned>(static_cast<unsigned char>(c))),
                        true);
    } else {
      ++i;
    }
  }
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

// The offload folders like the other paths: from the manifest's folder, or
// the current one when --set gave them (the key or a table above it).
static void place_offload_folders(const Doc& doc, const std::string& path, memory::MemoryOptions& mo) {
  auto from_command_line = [&](const std::string& key) {
    for (const auto& o : doc.overridden) {
      if (key == o || key.rfind(o + ".", 0) == 0) return true;
    }
    return false;
  };
  auto place_folder = [&](const std::string& key, std::string& value) {
    if (value.empty()) return;
    value = from_command_line(key) ? fs::absolute(value).lexically_normal().string() : resolve(path, value);
  };
  place_folder("memory.offload.disk_path", mo.offload.disk_path);
  place_folder("memory.offload_folder", mo.offload_folder);
}

Manifest parse_manifest_text(const std::string& text, const std::string& path, const std::vector<Override>& overrides) {
  Doc doc{path, {}};
  toml::table root;
  refuse_non_ascii_outside_strings(text, path);
  try {
    root = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    throw ConfigError(fmt::format("{}:{}:{}: {}", path, e.source().begin.line, e.source().begin.column,
                                  e.description()),
                      true);
  }
  for (const auto& o : overrides) apply_override(root, o, doc);

  Manifest m;
  m.path = path;
  bool have_model = false, have_requests = false;
  std::map<std::string, Handler> top = {
      {"model", [&](const Reader& r, const std::string& k, const toml::node& n) {
         m.model = r.str(k, n);
         if (m.model.empty()) doc.fail(k, n, "must name the pipeline folder");
         have_model = true;
       }},
      {"dtype", [&](const Reader& r, const std::string& k, const toml::node& n) {
         m.dtype = r.str(k, n);
         if (m.dtype != "fp32" && m.dtype != "bf16" && m.dtype != "fp16") {
           doc.fail(k, n, fmt::format("'{}' is not one of fp32, bf16, fp16", m.dtype));
         }
       }},
      {"requests", [&](const Reader& r, const std::string& k, const toml::node& n) {
         m.requests = r.str(k, n);
         if (m.requests.empty()) doc.fail(k, n, "must name the JSONL requests file");
         have_requests = true;
       }},
      {"parallel", [&](const Reader&, const std::string& k, const toml::node& n) {
         walk(doc, as_table(doc, k, n), "parallel.",
              {{"tp", [&](const Reader& r, const std::string& f, const toml::node& v) {
                  m.tp = static_cast<int>(r.integer(f, v, 1, 4096));
                }},
               {"dp", [&](const Reader& r, const std::string& f, const toml::node& v) {
                  m.dp = static_cast<int>(r.integer(f, v, 0, 1 << 20));
                }},
               {"device", [&](const Reader& r, const std::string& f, const toml::node& v) {
                  m.device = r.str(f, v);
                  if (m.device != "auto" && m.device != "cpu" && m.device != "cuda") {
                    doc.fail(r.key(f), v, fmt::format("'{}' is not one of auto, cpu, cuda", m.device));
                  }
                }},
               {"allow_cross_node_tp", [&](const Reader& r, const std::string& f, const toml::node& v) {
                  m.allow_cross_node_tp = r.boolean(f, v);
                }},
               {"shard_text_encoders", [&](const Reader& r, const std::string& f, const toml::node& v) {
                  m.shard_text_encoders = r.boolean(f, v);
                }},
               {"shard_modulation", [&](const Reader& r, const std::string& f, const toml::node& v) {
                  m.shard_modulation = r.boolean(f, v);
                }}});
       }},
      {"memory", [&](const Reader&, const std::string& k, const toml::node& n) {
         walk_memory(doc, as_table(doc, k, n), m.memory);
       }},
      {"defaults", [&](const Reader&, const std::string& k, const toml::node& n) {
         auto& d = m.defaults;
         walk(doc, as_table(doc, k, n), "defaults.",
              {{"height", [&](const Reader& r, const std::string& f, const toml::node& v) {
                  d.height = r.integer(f, v, 1, 16384);
                }},
               {"width", [&](const Reader& r, const std::string& f, const toml::node& v) {
                  d.width = r.integer(f, v, 1, 16384);
                }},
               {"steps", [&](const Reader& r, const std::string& f, const toml::node& v) {
                  d.steps = r.integer(f, v, 1, 10000);
                }},
               {"guidance", [&](const Reader& r, const std::string& f, const toml::node& v) {
                  d.guidance = r.number(f, v, 0, 1000);
                }},
               {"true_cfg_scale", [&](const Reader& r, const std::string& f, const toml::node& v) {
                  d.true_cfg_scale = r.number(f, v, 0, 1000);
                }},
               {"negative_prompt", [&](const Reader& r, const std::string& f, const toml::node& v) {
                  const std::string text = r.str(f, v);
                  // Refused here, not by every request after the load (PNG text cannot carry a NUL).
                  if (const size_t nul = text.find('\0'); nul != std::string::npos)
                    doc.fail(r.key(f), v, fmt::format("holds a NUL character (at byte {})", nul));
                  if (text.empty()) d.negative_prompt.reset();
                  else d.negative_prompt = text;
                }},
               {"max_sequence_length", [&](const Reader& r, const std::string& f, const toml::node& v) {
                  d.max_sequence_length = r.integer(f, v, 1, 512);
                }},
               {"seed", [&](const Reader& r, const std::string& f, const toml::node& v) {
                  d.seed = static_cast<uint64_t>(r.integer(f, v, 0, INT64_MAX));
                }}});
       }},
      {"output", [&](const Reader&, const std::string& k, const toml::node& n) {
         walk(doc, as_table(doc, k, n), "output.",
              {{"dir", [&](const Reader& r, const std::string& f, const toml::node& v) {
                  m.output_dir = r.str(f, v);
                  if (m.output_dir.empty()) doc.fail(r.key(f), v, "must not be empty");
                }},
               {"formats", [&](const Reader& r, const std::string& f, const toml::node& v) {
                  if (!v.is_array()) doc.fail(r.key(f), v, fmt::format("must be an array, found {}", type_name(v)));
                  m.png = m.hdf5 = m.latents = false;
                  for (const auto& e : *v.as_array()) {
                    const std::string s = r.str(f, e);
                    if (s == "png") m.png = true;
                    else if (s == "hdf5") m.hdf5 = true;
                    else if (s == "latents") m.latents = true;
                    else doc.fail(r.key(f), e, fmt::format("'{}' is not one of png, hdf5, latents", s));
                  }
                  if (!m.png && !m.hdf5 && !m.latents) doc.fail(r.key(f), v, "names no format");
                }},
               {"batch_size", [&](const Reader& r, const std::string& f, const toml::node& v) {
                  m.batch_size = r.integer(f, v, 1, 1024);
                }}});
       }},
  };
  walk(doc, root, "", top);
  if (!have_model) throw ConfigError(fmt::format("{}: model: required key is missing", path), true);
  if (!have_requests) throw ConfigError(fmt::format("{}: requests: required key is missing", path), true);
  // Paths from the manifest are relative to its folder; from the command line
  // (--set, --out), to the current folder.
  auto place = [&](const std::string& key, const std::string& value) {
    return doc.overridden.count(key) ? fs::absolute(value).lexically_normal().string() : resolve(path, value);
  };
  m.model = place("model", m.model);
  m.requests = place("requests", m.requests);
  m.output_dir = place("output.dir", m.output_dir);
  place_offload_folders(doc, path, m.memory);
  return m;
}

void check_paths(const Manifest& m) {
  if (!fs::is_regular_file(fs::path(m.model) / "model_index.json")) {
    throw ConfigError(fmt::format("{}: model: {} is not a pipeline folder (no model_index.json)", m.path, m.model),
                      true);
  }
  if (!fs::is_regular_file(m.requests)) {
    throw ConfigError(fmt::format("{}: requests: {}: no such file", m.path, m.requests), true);
  }
  // The offload folders are written to: never inside the model folder, never an input.
  check_offload_folders(m.memory, m.path, job_inputs(m));
}

memory::MemoryOptions parse_memory_overrides(const std::vector<Override>& settings) {
  Doc doc{"--memory", {}};
  doc.flag = "--memory";
  doc.flag_prefix = "memory.";
  toml::table root;
  root.insert("memory", toml::table{});
  for (const auto& [key, value] : settings) apply_override(root, {"memory." + key, value}, doc);
  memory::MemoryOptions mo;
  walk_memory(doc, *root.get("memory")->as_table(), mo);
  return mo;
}

}  // namespace tprun::jobs
