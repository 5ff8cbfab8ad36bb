#include "memory/memory_table.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/error.h"
#include "runtime/size_string.h"
#include "runtime/user_pattern.h"

namespace tprun::memory {

namespace {

// What the readers of one [memory] table share: the options they fill, and
// the offload_folder node, checked once the whole table is read.
struct MemoryTable {
  const TomlDoc& doc;
  MemoryOptions& mo;
  const toml::node* offload_folder_node = nullptr;
};

using KeyReader = void (*)(MemoryTable&, const FieldReader&, const std::string& field, const toml::node&);

// memory.layerwise_casting = { storage, skip }.
void read_layerwise_casting(MemoryTable& t, const FieldReader& r, const std::string& f, const toml::node& v) {
  const TomlDoc& doc = t.doc;
  const std::string key = r.key(f);
  if (!v.is_table()) {
    doc.fail(key, v, fmt::format("must be a table ({{ storage = \"float8_e4m3fn\" }}), found {}", toml_type_name(v)));
  }
  bool have_storage = false;
  t.mo.layerwise_skip.reset();
  walk_table(doc, *v.as_table(), key + ".",
             {{"storage", [&](const FieldReader& r2, const std::string& f2, const toml::node& v2) {
                 const std::string s = r2.str(f2, v2);
                 const auto& ok = layerwise_storage_dtypes();
                 if (std::find(ok.begin(), ok.end(), s) == ok.end()) {
                   doc.fail(r2.key(f2), v2, fmt::format("'{}' is not one of {}", s, fmt::join(ok, ", ")));
                 }
                 t.mo.layerwise_storage = s;
                 have_storage = true;
               }},
              {"skip", [&](const FieldReader& r2, const std::string& f2, const toml::node& v2) {
                 if (!v2.is_array()) {
                   doc.fail(r2.key(f2), v2, fmt::format("must be an array of strings, found {}", toml_type_name(v2)));
                 }
                 std::vector<std::string> patterns;
                 for (const auto& e : *v2.as_array()) {
                   const std::string p = r2.str(f2, e);
                   if (auto why = user_pattern_problem(p)) doc.fail(r2.key(f2), e, *why);
                   patterns.push_back(p);
                 }
                 t.mo.layerwise_skip = std::move(patterns);
               }}});
  if (!have_storage) doc.fail(key + ".storage", v, "required key is missing");
}

// memory.offload as a table: { type, blocks_per_group, to, disk_path, prefetch }.
void read_offload_table(const TomlDoc& doc, const std::string& key, const toml::node& v, OffloadOptions& o) {
  walk_table(doc, *v.as_table(), key + ".",
             {{"type", [&](const FieldReader& r, const std::string& f, const toml::node& n) {
                 o.type = r.str(f, n);
                 const auto& ok = offload_types();
                 if (std::find(ok.begin(), ok.end(), o.type) == ok.end()) {
                   doc.fail(r.key(f), n, fmt::format("'{}' is not one of {}", o.type, fmt::join(ok, ", ")));
                 }
               }},
              {"blocks_per_group", [&](const FieldReader& r, const std::string& f, const toml::node& n) {
                 o.blocks_per_group = r.integer(f, n, 1, kMaxBlocksPerGroup);
               }},
              {"to", [&](const FieldReader& r, const std::string& f, const toml::node& n) {
                 o.to = r.str(f, n);
                 if (o.to != "cpu" && o.to != "disk") {
                   doc.fail(r.key(f), n, fmt::format("'{}' is not \"cpu\" or \"disk\"", o.to));
                 }
               }},
              {"disk_path", [&](const FieldReader& r, const std::string& f, const toml::node& n) {
                 o.disk_path = r.str(f, n);
                 if (o.disk_path.empty()) doc.fail(r.key(f), n, "must name a folder");
               }},
              {"prefetch",
               [&](const FieldReader& r, const std::string& f, const toml::node& n) { o.prefetch = r.boolean(f, n); }}});
  if (o.type.empty()) doc.fail(key + ".type", v, "required key is missing (block_level, leaf_level or model_level)");
  if (o.to == "disk" && o.disk_path.empty()) doc.fail(key + ".disk_path", v, "required when to = \"disk\"");
  if (o.to != "disk" && !o.disk_path.empty()) doc.fail(key + ".disk_path", v, "only with to = \"disk\"");
}

// memory.offload: "model" | "sequential" | a table.
void read_offload(MemoryTable& t, const FieldReader& r, const std::string& f, const toml::node& v) {
  const std::string key = r.key(f);
  OffloadOptions& o = t.mo.offload;
  o = OffloadOptions{};
  if (v.is_string()) {
    const std::string s = v.as_string()->get();
    if (s == "model") {
      o.type = "model_level";
    } else if (s == "sequential") {
      o.type = "leaf_level";
    } else {
      t.doc.fail(key, v, fmt::format("'{}' is not \"model\" or \"sequential\" (or a table: {{ type = \"block_level\", "
                                     "blocks_per_group = 1, to = \"disk\", disk_path = \"...\", prefetch = true }})",
                                     s));
    }
    return;
  }
  if (!v.is_table()) {
    t.doc.fail(key, v, fmt::format("must be \"model\", \"sequential\" or a table, found {}", toml_type_name(v)));
  }
  read_offload_table(t.doc, key, v, o);
}

// memory.device_map as a table; dotted keys written bare in TOML
// (transformer.single_transformer_blocks.1 = "cpu") arrive as nested tables.
void flatten_device_map(const TomlDoc& doc, const std::string& key, const std::string& prefix, const toml::table& t,
                        std::vector<DevicePlacement>& out) {
  for (const auto& [k, node] : t) {
    const std::string name = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (node.is_table()) {
      flatten_device_map(doc, key, name, *node.as_table(), out);
      continue;
    }
    if (!node.is_string()) {
      doc.fail(key + "." + name, node, fmt::format("must be a device string, found {}", toml_type_name(node)));
    }
    const std::string dev = node.as_string()->get();
    if (!device_map_target(dev)) {
      doc.fail(key + "." + name, node,
               fmt::format("'{}' is not a device (\"cpu\", \"disk\", an accelerator index \"0\" or \"cuda:0\")", dev));
    }
    if (out.size() >= kMaxDeviceMapEntries) doc.fail(key, node, "has too many entries");
    out.emplace_back(name, dev);
  }
}

// memory.device_map: "balanced" | a table of module = device.
void read_device_map(MemoryTable& t, const FieldReader& r, const std::string& f, const toml::node& v) {
  const std::string key = r.key(f);
  MemoryOptions& mo = t.mo;
  mo.device_map_strategy.clear();
  mo.device_map.clear();
  if (v.is_string()) {
    if (v.as_string()->get() != "balanced") {
      t.doc.fail(key, v, fmt::format("'{}' is not a strategy tprun has (\"balanced\", or a table of module = device)",
                                     v.as_string()->get()));
    }
    mo.device_map_strategy = "balanced";
    return;
  }
  if (!v.is_table()) t.doc.fail(key, v, fmt::format("must be \"balanced\" or a table, found {}", toml_type_name(v)));
  flatten_device_map(t.doc, key, "", *v.as_table(), mo.device_map);
  if (mo.device_map.empty()) t.doc.fail(key, v, "is an empty table");
}

// memory.max_memory = { device = size, ... }.
void read_max_memory(MemoryTable& t, const FieldReader& r, const std::string& f, const toml::node& v) {
  const TomlDoc& doc = t.doc;
  const std::string key = r.key(f);
  const toml::table& table = table_at(doc, key, v);
  t.mo.max_memory.clear();
  for (const auto& [k, node] : table) {
    const std::string dev(k.str());
    const std::string at = key + "." + dev;
    if (!device_map_target(dev) || dev == "disk") {
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
      doc.fail(at, node, fmt::format("must be a size (\"20GB\", \"512MiB\") or bytes, found {}", toml_type_name(node)));
    }
    t.mo.max_memory.emplace_back(dev, bytes);
  }
}

void read_offload_folder(MemoryTable& t, const FieldReader& r, const std::string& f, const toml::node& v) {
  t.mo.offload_folder = r.str(f, v);
  if (t.mo.offload_folder.empty()) t.doc.fail(r.key(f), v, "must name a folder");
  t.offload_folder_node = &v;
}

// Only a device map's "disk" entries use offload_folder: alone it would be
// ignored without a word.
void check_offload_folder_use(const MemoryTable& t) {
  if (t.offload_folder_node != nullptr && !t.mo.offload_folder.empty() && !t.mo.device_mapped()) {
    t.doc.fail("memory.offload_folder", *t.offload_folder_node,
               "is only used with memory.device_map (its \"disk\" entries); for group offload to disk set "
               "memory.offload.disk_path");
  }
}

struct MemoryKey {
  const char* name;
  KeyReader read;
};

// Every key of the table, in the order --memory's help lists them, with its reader.
const MemoryKey kMemoryKeys[] = {
    {"layerwise_casting", read_layerwise_casting},
    {"offload", read_offload},
    {"device_map", read_device_map},
    {"max_memory", read_max_memory},
    {"offload_folder", read_offload_folder},
    {"vae_slicing",
     [](MemoryTable& t, const FieldReader& r, const std::string& f, const toml::node& v) {
       t.mo.vae_slicing = r.boolean(f, v);
     }},
    {"vae_tiling",
     [](MemoryTable& t, const FieldReader& r, const std::string& f, const toml::node& v) {
       t.mo.vae_tiling = r.boolean(f, v);
     }},
    {"vae_tile_sample_size",
     [](MemoryTable& t, const FieldReader& r, const std::string& f, const toml::node& v) {
       t.mo.vae_tile_sample_size = r.integer(f, v, kMinVaeTile, kMaxVaeTile);
     }},
    {"vae_tile_overlap",
     [](MemoryTable& t, const FieldReader& r, const std::string& f, const toml::node& v) {
       t.mo.vae_tile_overlap = r.number(f, v, 0.0, 0.75);
     }},
    {"attention_chunk",
     [](MemoryTable& t, const FieldReader& r, const std::string& f, const toml::node& v) {
       t.mo.attention_chunk = r.integer(f, v, 0, kMaxAttentionChunk);
     }},
};

// The manifest's override rule reads a value that is not TOML as a plain string (so that
// `offload.disk_path=/scratch/x` needs no quotes). A value that opens a table, an array or a quoted
// string was meant as TOML, though: a syntax error there must be reported as one, with its column,
// not as the string it fell back to ("'{a=1' is not a strategy").
void check_toml_value(const std::string& option_text, const std::string& key, const std::string& value) {
  const size_t first = value.find_first_not_of(" \t");
  if (first == std::string::npos || std::string("{[\"'").find(value[first]) == std::string::npos) return;
  // Only printable ASCII reaches toml++ here (the manifest's reader guards the rest: toml++ 3.3
  // misbehaves on some non-ASCII input outside strings).
  for (unsigned char c : value) {
    if (c < 0x20 || c >= 0x7f) return;
  }
  const std::string prefix = "v = ";
  try {
    (void)toml::parse(prefix + value);
  } catch (const toml::parse_error& e) {
    const auto column = static_cast<long>(e.source().begin.column) - static_cast<long>(prefix.size());
    throw ConfigError(fmt::format("--memory '{}': the value of {} is not valid TOML: {} (at column {} of the value)",
                                  clip_text(option_text, 200), key, e.description(), std::max(1L, column)),
                      true);
  }
}

}  // namespace

const std::vector<std::string>& memory_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k;
    for (const auto& key : kMemoryKeys) k.emplace_back(key.name);
    return k;
  }();
  return keys;
}

void read_memory_table(const TomlDoc& doc, const toml::table& table, MemoryOptions& mo) {
  MemoryTable state{doc, mo};
  std::map<std::string, FieldHandler> handlers;
  for (const auto& key : kMemoryKeys) {
    handlers[key.name] = [&state, read = key.read](const FieldReader& r, const std::string& f, const toml::node& v) {
      read(state, r, f, v);
    };
  }
  walk_table(doc, table, "memory.", handlers);
  check_offload_folder_use(state);
}

MemoryOptions parse_memory_flags(const std::vector<std::string>& texts) {
  std::vector<TomlOverride> settings;
  for (const auto& text : texts) {
    const size_t eq = text.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw ConfigError(fmt::format("--memory '{}': expected KEY=VALUE, e.g. vae_tiling=true", text), true);
    }
    settings.emplace_back(text.substr(0, eq), text.substr(eq + 1));
    check_toml_value(text, settings.back().first, settings.back().second);
  }
  TomlDoc doc("--memory", "--memory", "memory.");
  toml::table root;
  root.insert("memory", toml::table{});
  for (const auto& [key, value] : settings) apply_override(root, {"memory." + key, value}, doc);
  MemoryOptions mo;
  read_memory_table(doc, *root.get("memory")->as_table(), mo);
  return mo;
}

}  // namespace tprun::memory
