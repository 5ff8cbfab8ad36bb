#include "lora/lora_adapters.h"

#include <map>
#include <set>

#include <ATen/TensorOperators.h>
#include <ATen/ops/mm.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "checkpoint/component_checkpoint.h"
#include "lora/lora_file_check.h"
#include "lora/lora_file_map.h"
#include "lora/lora_slices.h"
#include "parallel/lora_slot.h"
#include "runtime/error.h"
#include "runtime/size_string.h"

namespace tprun::lora {

LoraApply parse_lora_apply(const std::string& value, const std::string& where) {
  if (value == "auto") return LoraApply::Auto;
  if (value == "fused") return LoraApply::Fused;
  if (value == "runtime") return LoraApply::Runtime;
  throw ConfigError(fmt::format("{}: '{}' is not a way to apply adapters (auto, fused, runtime)", where,
                                clip_text(value)),
                    true);
}

const char* lora_apply_name(LoraApply apply) {
  switch (apply) {
    case LoraApply::Auto: return "auto";
    case LoraApply::Fused: return "fused";
    case LoraApply::Runtime: return "runtime";
  }
  return "?";
}

struct LoraAdapters::Impl {
  std::vector<LoraComponent> components;
  bool strict = true;
  bool prepared = false;
  std::map<std::string, LoraFileSlices> files;  // by path
  LoraStats stats;
  std::optional<std::string> in_force;  // the set key in force; unset before the first activate
  std::vector<LoraChoice> in_force_set;

  const LoraComponent* find(const std::string& name) const {
    for (const auto& c : components)
      if (c.component == name) return &c;
    return nullptr;
  }

  // A file as a run reads it: a regular file (never a folder, a fifo or a
  // device), mapped by its header, then this rank's slices.
  const LoraFileSlices& load(const std::string& path) {
    auto it = files.find(path);
    if (it != files.end()) return it->second;
    check_lora_file(path, "adapter");
    // Every rank reads the same header: its refusal is every rank's.
    const auto ckpt = [&] {
      try {
        return checkpoint::ComponentCheckpoint::open(path);
      } catch (const Error& e) {
        rethrow_on_all_ranks(e);
      }
    }();
    std::vector<LoraComponentTarget> targets;
    std::vector<LoraModel> models;
    for (const auto& c : components) {
      if (!c.model) {
        throw Error(Error::Kind::Internal, fmt::format("adapter {} read while {} is not held", path, c.component));
      }
      targets.push_back({c.component, &c.model->table(), c.config, c.dropped_prefixes});
      models.push_back({c.component, c.model});
    }
    const LoraLayout layout = map_lora_file(ckpt, targets, strict);
    for (const auto& k : layout.skipped_keys) spdlog::debug("adapter {}: key '{}' left out", path, k);
    if (!layout.skipped_keys.empty()) {
      spdlog::warn("adapter {}: {} keys left out (no module of this pipeline takes them), the first '{}'", path,
                   layout.skipped_keys.size(), layout.skipped_keys.front());
    }
    LoraFileSlices slices = read_lora_slices(layout, models);
    stats.files += 1;
    stats.bytes_read += slices.bytes_read;
    stats.bytes_resident += slices.bytes_resident;
    return files.emplace(path, std::move(slices)).first->second;
  }

  void clear_slots() {
    for (const auto& c : components) {
      if (!c.model || !c.model->lora_targets()) continue;
      for (auto& [name, target] : c.model->lora_targets()->modules) target.slot->deltas.clear();
    }
  }

  // The set's terms into the slots of `only` (every component when empty).
  void fill_slots(const std::vector<LoraChoice>& set, const std::string& only = "") {
    for (const auto& choice : set) {
      const LoraFileSlices& f = load(choice.path);
      for (const auto& comp : f.components) {
        if (!only.empty() && comp.component != only) continue;
        const LoraComponent* c = find(comp.component);
        if (!c->model || !c->model->lora_targets()) continue;  // not held now: rebind fills it
        const auto& modules = c->model->lora_targets()->modules;
        for (const auto& m : comp.modules) {
          modules.at(m.module).slot->deltas.push_back({m.down, m.up, choice.scale * m.alpha_scale});
        }
      }
    }
  }

  // Why the set cannot be fused into the weights ("" when it can).
  std::string unfusable(const std::vector<LoraChoice>& set) {
    for (const auto& choice : set) {
      const LoraFileSlices& f = load(choice.path);
      for (const auto& comp : f.components) {
        const LoraComponent* c = find(comp.component);
        if (c->reloads) return fmt::format("{} is loaded again during the run (staged experts)", comp.component);
        const auto& modules = c->model->lora_targets()->modules;
        for (const auto& m : comp.modules) {
          if (!modules.at(m.module).weight.kept_as_computed()) {
            return fmt::format("{}'s '{}' is not kept resident in the compute dtype (fp8 storage or offload)",
                               comp.component, m.module);
          }
        }
      }
    }
    return {};
  }

  // W += sum scale B A, in fp32, rounded once into the weight's dtype, in
  // place; one module at a time, so the fp32 terms never exceed one layer's.
  void fuse(const std::vector<LoraChoice>& set) {
    struct Term {
      const LoraModuleSlice* slice;
      double scale;
    };
    std::map<const models::LoraTarget*, std::vector<Term>> terms;
    for (const auto& choice : set) {
      const LoraFileSlices& f = load(choice.path);
      for (const auto& comp : f.components) {
        const auto& modules = find(comp.component)->model->lora_targets()->modules;
        for (const auto& m : comp.modules) terms[&modules.at(m.module)].push_back({&m, choice.scale * m.alpha_scale});
      }
    }
    for (const auto& [target, list] : terms) {
      at::Tensor w = target->weight.get();
      at::Tensor sum = w.to(at::kFloat);
      for (const Term& t : list) sum.add_(at::mm(t.slice->up.to(at::kFloat), t.slice->down.to(at::kFloat)), t.scale);
      w.copy_(sum);
    }
    files.clear();  // the slices live on in the weights
    stats.bytes_resident = 0;
  }
};

LoraAdapters::LoraAdapters(std::vector<LoraComponent> components) : impl_(std::make_unique<Impl>()) {
  impl_->components = std::move(components);
}

LoraAdapters::~LoraAdapters() = default;

void LoraAdapters::prepare(const std::vector<std::vector<LoraChoice>>& sets, bool strict, LoraApply apply) {
  Impl& s = *impl_;
  if (s.prepared) throw Error(Error::Kind::Internal, "LoraAdapters::prepare called twice");
  s.strict = strict;
  s.prepared = true;
  std::set<std::string> keys;
  for (const auto& set : sets) {
    keys.insert(lora_set_key(set));
    for (const auto& choice : set) s.load(choice.path);
  }
  const bool one_set = keys.size() == 1 && !sets.front().empty();
  std::string why;
  if (!one_set) {
    why = keys.size() > 1 ? fmt::format("{} adapter sets in this run", keys.size()) : "no adapters";
  } else {
    why = s.unfusable(sets.front());
  }
  if (apply == LoraApply::Fused && !why.empty()) {
    throw ConfigError(fmt::format("lora_apply = fused: {}; fusing needs one adapter set for the whole run, on weights "
                                  "kept resident in the compute dtype (use runtime or auto)",
                                  why),
                      true);
  }
  s.stats.fused = apply != LoraApply::Runtime && why.empty();
  s.stats.why = apply == LoraApply::Runtime ? "lora_apply = runtime"
                : s.stats.fused             ? "one adapter set for the whole run"
                                            : why;
  if (s.stats.fused) {
    s.fuse(sets.front());
    s.in_force = lora_set_key(sets.front());
    s.in_force_set = sets.front();
  }
  if (s.stats.files > 0) {
    spdlog::info("adapters: {} files, {} read this rank, {} kept; applied {} ({})", s.stats.files,
                 format_size(s.stats.bytes_read), format_size(s.stats.bytes_resident),
                 s.stats.fused ? "fused into the weights" : "at run time", s.stats.why);
  }
}

void LoraAdapters::activate(const std::vector<LoraChoice>& set) {
  Impl& s = *impl_;
  const std::string key = lora_set_key(set);
  if (s.in_force && *s.in_force == key) return;
  if (s.stats.fused) {
    throw Error(Error::Kind::Internal, "adapter set switched after the prepared one was fused into the weights");
  }
  s.clear_slots();
  s.fill_slots(set);
  if (s.in_force) s.stats.switches += 1;
  s.in_force = key;
  s.in_force_set = set;
}

void LoraAdapters::rebind(const std::string& component, const models::Model* model) {
  Impl& s = *impl_;
  for (auto& c : s.components)
    if (c.component == component) c.model = model;
  if (s.stats.fused) {
    throw Error(Error::Kind::Internal, fmt::format("{} reloaded with its adapters fused", component));
  }
  if (s.in_force) s.fill_slots(s.in_force_set, component);
}

bool LoraAdapters::adapts(const std::string& component) const {
  for (const auto& [path, f] : impl_->files)
    for (const auto& c : f.components)
      if (c.component == component) return true;
  return false;
}

LoraStats LoraAdapters::stats() const { return impl_->stats; }

}  // namespace tprun::lora
