#include "lora/lora_file_map.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint/component_checkpoint.h"
#include "lora/lora_key_format.h"
#include "lora/lora_metadata.h"
#include "lora/lora_module_index.h"
#include "models/model_table.h"
#include "runtime/error.h"

namespace tprun::lora {
namespace {

using checkpoint::Dtype;
using checkpoint::TensorEntry;

constexpr size_t kKeysNamed = 5;  // keys an error lists before "and N more"

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw CheckpointError(fmt::format("{}: {}", file, what), true);
}

bool is_float(Dtype d) { return d == Dtype::F16 || d == Dtype::BF16 || d == Dtype::F32 || d == Dtype::F64; }

std::string first_keys(const std::vector<std::string>& keys) {
  std::vector<std::string> shown;
  for (size_t i = 0; i < keys.size() && i < kKeysNamed; ++i) shown.push_back("'" + clip_text(keys[i], 160) + "'");
  std::string out = fmt::format("{}", fmt::join(shown, ", "));
  if (keys.size() > kKeysNamed) out += fmt::format(" and {} more", keys.size() - kKeysNamed);
  return out;
}

// ---- the alpha scalars ------------------------------------------------------

float half_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) return (sign ? -1.0f : 1.0f) * std::ldexp(static_cast<float>(mant), -24);
  if (exp == 31) return mant ? NAN : (sign ? -INFINITY : INFINITY);
  const uint32_t bits = sign | ((exp + 112) << 23) | (mant << 13);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// A little-endian scalar of `dtype` (one of F16, BF16, F32, F64, I32, I64).
double scalar_value(Dtype dtype, const unsigned char* bytes) {
  switch (dtype) {
    case Dtype::F16: {
      uint16_t h;
      std::memcpy(&h, bytes, 2);
      return half_to_float(h);
    }
    case Dtype::BF16: {
      const uint32_t bits = static_cast<uint32_t>(bytes[0] | (bytes[1] << 8)) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case Dtype::F32: {
      float f;
      std::memcpy(&f, bytes, 4);
      return f;
    }
    case Dtype::I32: {
      int32_t i;
      std::memcpy(&i, bytes, 4);
      return i;
    }
    case Dtype::I64: {
      int64_t i;
      std::memcpy(&i, bytes, 8);
      return static_cast<double>(i);
    }
    default: {
      double d;
      std::memcpy(&d, bytes, 8);
      return d;
    }
  }
}

// The value of a one-element alpha tensor (float or integer), read from the file.
double read_alpha(const std::string& path, const checkpoint::SafetensorsHeader& header, const TensorEntry& e) {
  if (e.numel() != 1 || e.shape.size() > 1) {
    fail(path, fmt::format("alpha '{}' must be one number (shape [] or [1]), got {}", e.name,
                           checkpoint::shape_string(e.shape)));
  }
  if (!is_float(e.dtype) && e.dtype != Dtype::I32 && e.dtype != Dtype::I64) {
    fail(path, fmt::format("alpha '{}' has dtype {}; a float or integer scalar is expected", e.name,
                           checkpoint::dtype_name(e.dtype)));
  }
  unsigned char bytes[8] = {};
  if (e.nbytes() > sizeof(bytes)) fail(path, fmt::format("alpha '{}' has {} bytes", e.name, e.nbytes()));
  std::ifstream in(path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(header.data_start + e.begin));
  in.read(reinterpret_cast<char*>(bytes), static_cast<std::streamsize>(e.nbytes()));
  if (!in) fail(path, fmt::format("cannot read alpha '{}'", e.name));
  const double v = scalar_value(e.dtype, bytes);
  if (!std::isfinite(v) || v <= 0) {
    fail(path, fmt::format("alpha '{}' is {}; it must be a finite positive number", e.name, v));
  }
  return v;
}

// ---- keys grouped by module ---------------------------------------------------

struct Pair {
  LoraKey key;  // of the first key seen
  const TensorEntry* down = nullptr;
  const TensorEntry* up = nullptr;
  const TensorEntry* alpha = nullptr;
  LoraKeyStyle style = LoraKeyStyle::Peft;  // the down's (else the up's)
  std::vector<std::string> keys() const {
    std::vector<std::string> out;
    for (const TensorEntry* e : {down, up, alpha}) {
      if (e) out.push_back(e->name);
    }
    return out;
  }
};

void add_to_pair(const std::string& path, Pair& p, const LoraKey& k, const TensorEntry& e) {
  const TensorEntry** slot = k.role == LoraRole::Down ? &p.down : k.role == LoraRole::Up ? &p.up : &p.alpha;
  if (*slot) {
    fail(path, fmt::format("keys '{}' and '{}' both give the {} of the same module: a module adapted twice",
                           (*slot)->name, e.name, k.role == LoraRole::Alpha ? "alpha" : "down / up matrix"));
  }
  *slot = &e;
  if (k.role == LoraRole::Down || (k.role == LoraRole::Up && !p.down)) p.style = k.style;
}

// ---- one pair onto its modules --------------------------------------------------

struct Context {
  const std::string& path;
  const checkpoint::SafetensorsHeader& header;
  const std::map<std::string, LoraMetadata>& metadata;
  std::vector<std::string>& skipped;
};

void check_matrix(const std::string& path, const TensorEntry& e) {
  if (!is_float(e.dtype)) {
    fail(path, fmt::format("'{}' has dtype {}; adapter matrices must be F16, BF16, F32 or F64", e.name,
                           checkpoint::dtype_name(e.dtype)));
  }
  if (e.shape.size() != 2) {
    fail(path,
         fmt::format("'{}' has shape {}; adapter matrices must be 2-D", e.name, checkpoint::shape_string(e.shape)));
  }
}

std::string modules_text(const std::vector<ResolvedTarget>& targets) {
  std::vector<std::string> names;
  for (const auto& t : targets) names.push_back(fmt::format("'{}' [{}, {}]", t.module, t.out, t.in));
  return fmt::format("{}", fmt::join(names, " + "));
}

// The shape checks; returns the rank.
int64_t check_shapes(const std::string& path, const Pair& p, const std::vector<ResolvedTarget>& targets) {
  check_matrix(path, *p.down);
  check_matrix(path, *p.up);
  const int64_t r = p.down->shape[0], in = targets.front().in;
  int64_t rows = 0;
  for (const auto& t : targets) rows += t.rows;
  if (p.down->shape[1] != in) {
    fail(path, fmt::format("'{}' has shape {} but {} takes {} inputs: the down matrix must be [rank, {}]",
                           p.down->name, checkpoint::shape_string(p.down->shape), modules_text(targets), in, in));
  }
  if (p.up->shape[1] != r) {
    fail(path, fmt::format("'{}' has shape {} but its down matrix '{}' has shape {}: the up matrix must be [{}, {}]",
                           p.up->name, checkpoint::shape_string(p.up->shape), p.down->name,
                           checkpoint::shape_string(p.down->shape), rows, r));
  }
  if (p.up->shape[0] != rows) {
    fail(path, fmt::format("'{}' has shape {} but {} gives {} output rows: the up matrix must be [{}, rank]",
                           p.up->name, checkpoint::shape_string(p.up->shape), modules_text(targets), rows, rows));
  }
  if (r < 1) {
    fail(path, fmt::format("'{}' has shape {}: rank 0", p.down->name, checkpoint::shape_string(p.down->shape)));
  }
  if (r > std::min(in, rows)) {
    fail(path, fmt::format("'{}' has rank {}, a rank larger than the layer ({}: at most {})", p.down->name, r,
                           modules_text(targets), std::min(in, rows)));
  }
  return r;
}

// alpha_scale of each target.
std::vector<double> scales_of(const Context& c, const Pair& p, const LoraModuleIndex& index, int64_t rank,
                              const std::vector<ResolvedTarget>& targets) {
  std::vector<double> out(targets.size(), 1.0);
  auto meta = c.metadata.find(p.key.component);
  if (p.style == LoraKeyStyle::Peft && meta != c.metadata.end()) {
    if (p.alpha) {
      fail(c.path, fmt::format("'{}' is an alpha tensor but the header's '{}' gives the scales too (diffusers refuses "
                               "both)", p.alpha->name, kLoraMetadataKey));
    }
    for (size_t i = 0; i < targets.size(); ++i) {
      const int64_t r = meta->second.rank_for(targets[i].module);
      if (r != rank) {
        fail(c.path, fmt::format("'{}' has rank {} but the header's '{}' gives module '{}' rank {}", p.down->name,
                                 rank, kLoraMetadataKey, targets[i].module, r));
      }
      out[i] = meta->second.scale_for(targets[i].module);
    }
    return out;
  }
  if (!p.alpha) return out;
  if (p.style == LoraKeyStyle::Peft && index.names().peft_alpha_ignored) {
    c.skipped.push_back(p.alpha->name);  // diffusers' loader for the family drops it unread
    return out;
  }
  const double alpha = read_alpha(c.path, c.header, *p.alpha);
  std::fill(out.begin(), out.end(), alpha / static_cast<double>(rank));
  return out;
}

struct ComponentState {
  const LoraComponentTarget* target = nullptr;
  std::unique_ptr<LoraModuleIndex> index;
  LoraComponentLayout layout;
};

std::string families_text(const std::map<std::string, ComponentState>& states) {
  std::vector<std::string> parts;
  for (const auto& [name, s] : states) {
    std::vector<std::string> examples = s.index->example_names(3);
    std::string text = fmt::format("{} ({})", name, s.target->table->cls);
    if (!examples.empty()) text += fmt::format(", whose original names are like '{}'", fmt::join(examples, "', '"));
    parts.push_back(text);
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

struct PairedKeys {
  std::map<std::string, Pair> pairs;
  std::vector<std::string> order;  // pair ids in the file's key order
};

// The header's keys grouped into (down, up, alpha) pairs, in the file's
// order: keys a component drops go to `skipped`, keys of no adapter form to
// `unmapped`.
PairedKeys pair_keys(const std::string& path, const checkpoint::SafetensorsHeader& header,
                     const std::vector<LoraComponentTarget>& components, std::vector<std::string>& skipped,
                     std::vector<std::string>& unmapped) {
  PairedKeys out;
  for (const TensorEntry& e : header.tensors) {
    const bool dropped = std::any_of(components.begin(), components.end(), [&](const LoraComponentTarget& t) {
      return std::any_of(t.dropped_prefixes.begin(), t.dropped_prefixes.end(),
                         [&](const std::string& prefix) { return !prefix.empty() && e.name.rfind(prefix, 0) == 0; });
    });
    if (dropped) {
      skipped.push_back(e.name);
      continue;
    }
    std::optional<LoraKey> k = parse_lora_key(e.name);
    if (!k) {
      unmapped.push_back(e.name);
      continue;
    }
    auto [it, inserted] = out.pairs.emplace(k->pair_id(), Pair{});
    if (inserted) {
      it->second.key = *k;
      out.order.push_back(k->pair_id());
    }
    add_to_pair(path, it->second, *k, e);
  }
  return out;
}

LoraLayout map_checked(const checkpoint::ComponentCheckpoint& file, const std::vector<LoraComponentTarget>& components,
                       bool strict) {
  const std::string& path = file.path();
  if (file.has_config() || file.files().size() != 1) {
    fail(path, "an adapter is one .safetensors file, not a folder");
  }
  const checkpoint::SafetensorsHeader& header = file.files().front();
  if (header.tensors.size() > kMaxLoraKeys) {
    fail(path, fmt::format("{} tensors, more than an adapter may hold ({})", header.tensors.size(), kMaxLoraKeys));
  }
  const std::map<std::string, LoraMetadata> metadata = read_lora_metadata(path, header.metadata);

  std::map<std::string, ComponentState> states;
  for (const LoraComponentTarget& t : components) {
    if (!t.table || !t.config) throw Error(Error::Kind::Internal, "map_lora_file: a component without table or config");
    ComponentState& s = states[t.component];
    s.target = &t;
    s.index = std::make_unique<LoraModuleIndex>(*t.table, *t.config, t.component + "/config.json");
    s.layout.component = t.component;
  }

  LoraLayout layout;
  layout.path = path;
  layout.file_bytes = header.file_size;
  std::vector<std::string> unmapped;
  const PairedKeys paired = pair_keys(path, header, components, layout.skipped_keys, unmapped);
  const std::map<std::string, Pair>& pairs = paired.pairs;
  const std::vector<std::string>& order = paired.order;

  Context context{path, header, metadata, layout.skipped_keys};
  std::map<std::string, std::string> adapted;  // module (component-qualified) -> the key adapting it
  for (const std::string& id : order) {
    const Pair& p = pairs.at(id);
    auto state = states.find(p.key.component);
    std::optional<std::vector<ResolvedTarget>> targets;
    if (state != states.end()) targets = state->second.index->resolve(p.key.name, p.key.underscored);
    if (!targets) {
      for (const std::string& key : p.keys()) unmapped.push_back(key);
      continue;
    }
    if (!p.down || !p.up) {
      const TensorEntry* have = p.down ? p.down : p.up ? p.up : p.alpha;
      fail(path, fmt::format("'{}' has no {}: every adapted module needs its down (lora_A / lora_down) and up "
                             "(lora_B / lora_up) matrices",
                             have->name, p.down ? "up matrix" : p.up ? "down matrix" : "down and up matrices"));
    }
    const int64_t rank = check_shapes(path, p, *targets);
    const std::vector<double> scales = scales_of(context, p, *state->second.index, rank, *targets);
    for (size_t i = 0; i < targets->size(); ++i) {
      const ResolvedTarget& t = (*targets)[i];
      auto [seen, fresh] = adapted.emplace(p.key.component + "." + t.module, p.down->name);
      if (!fresh) {
        fail(path, fmt::format("'{}' and '{}' both adapt module '{}' of the {}: a module adapted twice in one file",
                               seen->second, p.down->name, t.module, p.key.component));
      }
      LoraModulePart part;
      part.module = t.module;
      part.down_key = p.down->name;
      part.up_key = p.up->name;
      part.up_row_offset = t.row_offset;
      part.up_rows = t.rows;
      part.up_halves_swapped = t.halves_swapped;
      part.rank = rank;
      part.alpha_scale = scales[i];
      state->second.layout.parts.push_back(std::move(part));
    }
  }

  if (!unmapped.empty()) {
    if (strict) {
      fail(path, fmt::format("{} key(s) map to no module of {}: {}. The file may be for another model family, or "
                             "adapt a module tprun does not load; lora_strict = false skips such keys",
                             unmapped.size(), families_text(states), first_keys(unmapped)));
    }
    layout.skipped_keys.insert(layout.skipped_keys.end(), unmapped.begin(), unmapped.end());
  }
  for (const LoraComponentTarget& t : components) {
    ComponentState& s = states.at(t.component);
    if (!s.layout.parts.empty() && s.target == &t) layout.components.push_back(std::move(s.layout));
  }
  if (layout.components.empty()) {
    fail(path, fmt::format("no key adapts a module of {} ({} key(s){})", families_text(states), header.tensors.size(),
                           layout.skipped_keys.empty() ? "" : ", skipped: " + first_keys(layout.skipped_keys)));
  }
  return layout;
}

}  // namespace

LoraLayout map_lora_file(const checkpoint::ComponentCheckpoint& file,
                         const std::vector<LoraComponentTarget>& components, bool strict) {
  try {
    return map_checked(file, components, strict);
  } catch (const Error& e) {
    if (e.all_ranks()) throw;
    rethrow_on_all_ranks(e);
  }
}

}  // namespace tprun::lora
