#include "models/model_table.h"

#include <fmt/format.h>

#include "checkpoint/safetensors_header.h"
#include "checkpoint/weight_source.h"
#include "runtime/error.h"

namespace tprun::models {

using checkpoint::ShardStyle;

const char* tensor_kind_name(TensorKind k) {
  switch (k) {
    case TensorKind::Linear: return "linear";
    case TensorKind::Conv: return "conv";
    case TensorKind::Embedding: return "embedding";
    case TensorKind::Norm: return "norm";
    case TensorKind::Bias: return "bias";
    case TensorKind::Buffer: return "buffer";
    case TensorKind::Counter: return "counter";
  }
  return "?";
}

const TensorSpec* ModelTable::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

checkpoint::ShardRequest ModelTable::request(const std::string& name, int tp_rank, int tp_size) const {
  const TensorSpec* t = find(name);
  if (!t) throw CheckpointError(fmt::format("tensor '{}' is not part of {}", name, cls));
  checkpoint::ShardRequest r;
  r.tp_rank = tp_rank;
  r.tp_size = tp_size;
  r.style = t->style;
  r.blocks = t->blocks;
  r.blocks_absolute = !t->blocks.empty();
  return r;
}

std::string plan_key_of(const std::string& module) {
  size_t start = 0;
  while (start <= module.size()) {
    size_t end = module.find('.', start);
    if (end == std::string::npos) end = module.size();
    const bool digits = end > start && module.find_first_not_of("0123456789", start) >= end;
    if (digits) return module.substr(0, start) + "*" + module.substr(end);
    start = end + 1;
  }
  return module;
}

TpPlan ModelTable::tp_plan() const {
  TpPlan plan;
  for (const auto& t : tensors) {
    if (t.plan_key.empty() || t.style == ShardStyle::Replicated) continue;  // row-wise biases follow their weight
    PlanEntry* found = nullptr;
    for (auto& e : plan)
      if (e.pattern == t.plan_key) found = &e;
    if (!found) {
      plan.push_back({t.plan_key, t.style, t.blocks});
      continue;
    }
    const bool is_bias = t.name.size() > 5 && t.name.compare(t.name.size() - 5, 5, ".bias") == 0;
    if (!is_bias && (found->style != t.style || found->blocks != t.blocks)) {
      throw Error(Error::Kind::Internal,
                  fmt::format("{}: tensor '{}' is {} but plan key '{}' is {}", cls, t.name,
                              checkpoint::shard_style_name(t.style), t.plan_key,
                              checkpoint::shard_style_name(found->style)));
    }
  }
  return plan;
}

uint64_t ModelTable::total_bytes(int bytes_per_element) const {
  uint64_t total = 0;
  for (const auto& t : tensors) {
    if (t.optional) continue;
    uint64_t n = static_cast<uint64_t>(bytes_per_element);
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    total += n;
  }
  return total;
}

void validate_tp_size(const ModelTable& table, int tp, const std::string& where) {
  if (tp < 1) throw ConfigError(fmt::format("tp must be at least 1, got {}", tp), true);
  for (const auto& d : table.tp_divisors) {
    if (d.value % tp != 0) {
      throw ConfigError(fmt::format("tp {} does not divide {} {} of {}; choose a tp that divides {}", tp, d.field,
                                    d.value, where, d.value),
                        true);
    }
  }
  for (const auto& spec : table.tensors) {
    if (spec.style == ShardStyle::Replicated || spec.optional) continue;
    const int dim = checkpoint::split_dim(spec.style);
    if (static_cast<int>(spec.shape.size()) <= dim) {
      throw Error(Error::Kind::Internal, fmt::format("{}: tensor '{}' has no dim {} to split", table.cls, spec.name,
                                                     dim));
    }
    auto need = [&](int64_t size, const char* what) {
      if (size % tp != 0) {
        throw ConfigError(fmt::format("tensor '{}': {} {} does not divide by tp {}", spec.name, what, size, tp), true);
      }
    };
    if (checkpoint::is_packed(spec.style)) {
      for (int64_t b : spec.blocks) need(b, "packed block");
    } else {
      need(spec.shape[static_cast<size_t>(dim)], dim == 0 ? "output dim" : "input dim");
    }
  }
}

void validate_tp_plan(const ModelTable& table, const checkpoint::WeightSource& source, int tp) {
  validate_tp_size(table, tp, source.path());
  for (const auto& spec : table.tensors) {
    if (spec.optional) continue;
    if (!source.contains(spec.name)) {
      throw CheckpointError(fmt::format("tensor '{}' is missing from {}", spec.name, source.path()), true);
    }
    const auto stored = source.describe(spec.name);
    if (stored.shape != spec.shape) {
      throw CheckpointError(fmt::format("tensor '{}' has wrong shape; expected {}, got {} (in {})", spec.name,
                                        checkpoint::shape_string(spec.shape), checkpoint::shape_string(stored.shape),
                                        source.path()),
                            true);
    }
  }
}

}  // namespace tprun::models
