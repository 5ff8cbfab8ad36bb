// The fit planner (see fit_planner.h): layouts, weight bytes per rank from
// the headers, activations from the per-request estimate, candidates, choice.
#include "pipelines/fit_planner.h"

#include <algorithm>
#include <set>

#include <c10/core/ScalarType.h>
#include <fmt/format.h>

#include "checkpoint/component_checkpoint.h"
#include "checkpoint/pipeline_folder.h"
#include "lora/lora_file_check.h"
#include "lora/lora_file_map.h"
#include "lora/lora_slices.h"
#include "checkpoint/torch_dtype.h"
#include "memory/offload_plan.h"
#include "models/model_config.h"
#include "models/model_registry.h"
#include "models/nn_ops.h"
#include "models/weight_bytes.h"
#include "pipelines/device_map.h"
#include "pipelines/latents.h"
#include "pipelines/pipeline_layout.h"
#include "pipelines/request_memory.h"
#include "runtime/error.h"
#include "runtime/host_memory.h"
#include "runtime/rank_env.h"

namespace tprun::pipelines {
namespace {

using u64 = uint64_t;

// One component ready to be sized: its layout, headers, table (built with
// the load's options) and build options.
struct SizedComponent {
  ComponentLayout layout;
  models::ComponentListing listing;
  models::ModelTable table;
  models::BuildOptions build;
  std::vector<lora::LoraModulePart> adapter_parts;  // the run's adapters on this component
};

// The parts of every adapter file the query names that land on `c` (the
// transformer: the component pipelines adapt), mapped as a run maps them.
void add_adapter_parts(SizedComponent& c, const FitQuery& q) {
  std::set<std::string> files;
  for (const auto& l : q.loras) files.insert(l.path);
  for (const auto& r : q.requests)
    for (const auto& l : r.lora_set()) files.insert(l.path);
  if (files.empty() || c.layout.name != "transformer") return;
  const std::vector<lora::LoraComponentTarget> targets = {{"transformer", &c.table, &c.listing.config, {}}};
  for (const auto& path : files) {
    lora::check_lora_file(path, "adapter");
    const auto file = checkpoint::ComponentCheckpoint::open(path);
    const lora::LoraLayout layout = lora::map_lora_file(file, targets, q.lora_strict);
    for (const auto& comp : layout.components)
      c.adapter_parts.insert(c.adapter_parts.end(), comp.parts.begin(), comp.parts.end());
  }
}

std::vector<SizedComponent> size_components(const PipelineLayout& layout, const std::string& variant) {
  std::vector<SizedComponent> out;
  for (const auto& c : layout.components) {
    SizedComponent s;
    s.layout = c;
    s.listing = models::list_component(c.path, variant);
    // Block counts against the checkpoint, as the load checks them (not
    // under a hidden-layer cut: the layers after it may have been deleted).
    const models::TensorCensus census(s.listing.names(), c.path);
    auto table = models::model_table_for(s.listing.config, s.listing.config_path, c.options,
                                         c.options.hidden_layers.empty() ? &census : nullptr);
    if (!table) {
      throw ConfigError(fmt::format("{}: tprun has no model for class '{}' (component {})", s.listing.config_path,
                                    s.listing.config.value("_class_name", std::string("?")), c.name),
                        true);
    }
    s.table = std::move(*table);
    s.build = models::build_options(c.options, c.class_skip);
    out.push_back(std::move(s));
  }
  return out;
}

// Bytes a component takes on `rank`'s compute device: its resident weights
// and, of those kept off it (host or disk groups), the largest group while
// in use (two with prefetch: the next one arrives meanwhile).
u64 device_bytes(const SizedComponent& c, int rank, int tp) {
  const int ctp = c.layout.sharded ? tp : 1;
  const int crank = c.layout.sharded ? rank : 0;
  const models::RankWeights w = models::rank_weights(c.listing.rows, c.table, crank, ctp, c.build, c.layout.path);
  const u64 in_use = w.offloaded > 0 ? w.largest_group * (c.build.memory.offload.prefetch ? 2 : 1) : 0;
  // Adapter slices stay resident in the compute dtype (lora/lora_slices.h).
  const int element = static_cast<int>(c10::elementSize(checkpoint::parse_compute_dtype(c.build.dtype, "dtype")));
  u64 adapters = 0;
  for (const auto& part : c.adapter_parts) adapters = add_bytes(adapters, lora::lora_part_bytes(part, c.table, ctp, element));
  return add_bytes(w.resident + in_use, adapters);
}

// One stage's activations: the estimate itself (what the phases and the peak
// show), or with estimate_request_memory's margin, (kept + stage) x 1.15 +
// 64 MiB (what the check before each request asks for: `fits` uses it, so a
// plan the planner picks is never refused by that check).
u64 act(u64 kept, u64 stage, bool margin) {
  const u64 sum = add_bytes(kept, stage);
  if (!margin) return sum;
  const double scaled = static_cast<double>(sum) * 1.15;
  return add_bytes(scaled >= 18446744073709551616.0 ? UINT64_MAX : static_cast<u64>(scaled), u64{64} << 20);
}

struct RankNumbers {
  FitPhases together, staged;                // best estimates
  FitPhases together_checked, staged_checked;  // with the request check's margin
  std::map<std::string, u64> components;
  u64 act_together = 0, act_staged = 0;
};

// The memory model of one rank of a tp group (request_memory.h), the
// runtime's part (dtype bytes, attention backends) filled for `device`.
MemoryModel rank_model(const PipelineLayout& l, const FitQuery& q, const std::string& device, int tp, bool encodes,
                       bool decodes) {
  MemoryModel m;
  m.pipeline = l.cls;
  m.transformer = l.transformer;
  m.tp_size = tp;
  fill_runtime(m, device, q.options.dtype, static_cast<const VaeShape*>(nullptr));
  if (q.threads > 0) m.threads = q.threads;
  m.attention_chunk = q.options.component_base.memory.attention_chunk;
  m.text_hidden = encodes ? l.text_hidden : 0;
  m.decodes = decodes;
  m.vae = l.vae;
  const c10::ScalarType vst = l.vae.elem_bytes == 4 ? c10::kFloat : checkpoint::parse_compute_dtype(q.options.dtype, "dtype");
  const int64_t mid = l.vae.decoder_channels.empty() ? 64 : l.vae.decoder_channels.front();
  m.vae.scores_materialised = models::nn::sdpa_backend(device, vst, 1, mid, false).find("math") != std::string::npos;
  return m;
}

// The phases of one rank in both ways of holding the components.
RankNumbers rank_numbers(const std::vector<SizedComponent>& comps, const PipelineLayout& l, const FitQuery& q,
                         const RequestShape& shape, const std::string& device, int tp, int rank, u64 embeddings) {
  RankNumbers n;
  u64 encoders = 0, denoiser = 0;
  bool encodes = false, decodes = false;
  for (const auto& c : comps) {
    if (!c.layout.holds(rank)) continue;
    const u64 b = device_bytes(c, rank, tp);
    n.components[c.layout.name] = b;
    if (c.layout.phase == Phase::Encode) {
      encoders = add_bytes(encoders, b);
      encodes = true;
    } else {
      denoiser = add_bytes(denoiser, b);
      decodes = decodes || c.layout.phase == Phase::Decode;
    }
  }
  const MemoryEstimate e = estimate_request_memory(rank_model(l, q, device, tp, encodes, decodes), shape);
  // Sums saturate (request_memory.h): an absurd size reads as too large, never as small.
  const u64 all = add_bytes(encoders, denoiser), step = add_bytes(e.step, e.attention);
  for (const bool margin : {false, true}) {
    const FitPhases together = {add_bytes(all, act(e.kept, e.text, margin)), add_bytes(all, act(e.kept, step, margin)),
                                add_bytes(all, act(e.kept, e.decode, margin))};
    const FitPhases staged = {add_bytes(add_bytes(encoders, act(0, e.text, margin)), embeddings),
                              add_bytes(add_bytes(denoiser, act(e.kept, step, margin)), embeddings),
                              add_bytes(add_bytes(denoiser, act(e.kept, e.decode, margin)), embeddings)};
    (margin ? n.together_checked : n.together) = together;
    (margin ? n.staged_checked : n.staged) = staged;
  }
  n.act_together = std::max({act(e.kept, e.text, false), act(e.kept, step, false), act(e.kept, e.decode, false)});
  n.act_staged = std::max({act(0, e.text, false), act(e.kept, step, false), act(e.kept, e.decode, false)});
  return n;
}

// Why `tp` cannot run the pipeline ("" when it can): a device map with TP,
// or a sharded component's table refusing the size.
std::string tp_refusal(const std::vector<SizedComponent>& comps, const FitQuery& q, int tp) {
  try {
    memory::refuse_device_map_with_tp(q.options.component_base.memory, tp);
    for (const auto& c : comps) {
      if (c.layout.sharded) models::validate_tp_size(c.table, tp, c.layout.path);
    }
  } catch (const ConfigError& e) {
    return e.what();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

void check_query(const FitQuery& q) {
  if (q.world < 1 || q.world > kMaxWorld) {
    throw ConfigError(fmt::format("world {} is outside [1, {}]", q.world, kMaxWorld), true);
  }
  if (q.batch < 1 || q.batch > kMaxBatchSize) {
    throw ConfigError(fmt::format("batch {} is outside [1, {}]", q.batch, kMaxBatchSize), true);
  }
  if (q.height < 0 || q.width < 0 || q.max_sequence_length < 0) {
    throw ConfigError(fmt::format("height {}, width {} and max_sequence_length {} must be positive (0: the "
                                  "pipeline's default)",
                                  q.height, q.width, q.max_sequence_length),
                      true);
  }
  if (q.height > kMaxImageSide || q.width > kMaxImageSide) {
    throw ConfigError(fmt::format("height {} or width {} is above {}", q.height, q.width, kMaxImageSide), true);
  }
  if (q.stage_requests < 1 || q.stage_requests > kMaxStageRequests) {
    throw ConfigError(fmt::format("stage_requests {} is outside [1, {}]", q.stage_requests, kMaxStageRequests), true);
  }
  if (q.device != "cpu" && q.device != "cuda") {
    throw ConfigError(fmt::format("device '{}' is not cpu or cuda", q.device), true);
  }
  if (!q.stages.empty() && q.stages != "together" && q.stages != "staged") {
    throw ConfigError(fmt::format("stages '{}' is not together or staged", q.stages), true);
  }
  (void)checkpoint::parse_compute_dtype(q.options.dtype, "dtype");
}

// The request planned for: the largest image and the longest text of the
// query's requests, the pipeline's defaults for what they leave unset.
RequestShape planned_shape(const PipelineLayout& l, const FitQuery& q) {
  RequestShape s;
  s.batch = q.batch;
  s.encodes_text = true;
  const std::vector<GenerationRequest> requests = q.requests.empty() ? std::vector<GenerationRequest>(1) : q.requests;
  for (const auto& r : requests) {
    const int64_t h = q.height > 0 ? q.height : r.height.value_or(l.defaults.height.value_or(1024));
    const int64_t w = q.width > 0 ? q.width : r.width.value_or(l.defaults.width.value_or(1024));
    try {
      check_image_size(h, w, l.vae_scale_factor);
    } catch (const RequestError& e) {
      // The query's own size is a bad flag; a request's is that request's
      // error (a job records it `failed` and runs the others): not planned for.
      if (q.height > 0 || q.width > 0 || q.requests.empty()) throw ConfigError(e.what(), true);
      continue;
    }
    if (h * w > s.height * s.width) {
      s.height = h;
      s.width = w;
    }
    const int64_t t = q.max_sequence_length > 0 ? q.max_sequence_length
                                                : r.max_sequence_length.value_or(l.defaults.max_sequence_length.value_or(512));
    s.text_tokens = std::max(s.text_tokens, t);
    s.frames = std::max(s.frames, q.frames > 0 ? q.frames : r.frames.value_or(l.defaults.frames.value_or(1)));
  }
  if (s.height == 0) {  // every request's size is its own error: plan for the defaults
    s.height = l.defaults.height.value_or(1024);
    s.width = l.defaults.width.value_or(1024);
    s.text_tokens = std::max<int64_t>(s.text_tokens, l.defaults.max_sequence_length.value_or(512));
  }
  if (q.frames > 0) s.frames = q.frames;
  s.image_tokens = l.latent_tokens(s.height, s.width, s.frames);
  return s;
}

// The candidates of one tp: both ways of holding the components (or the
// query's one), with the numbers of the rank whose peak is highest.
void add_candidates(const std::vector<SizedComponent>& comps, const PipelineLayout& l, const FitQuery& q,
                    const RequestShape& shape, int tp, FitPlan& plan) {
  const std::string device = q.device == "cuda" ? "cuda:0" : "cpu";
  // A round's embeddings: on the CPU (encode_text's result), so in a CPU rank's memory.
  const u64 elem = q.options.dtype == "fp32" ? 4 : 2;
  const u64 per_encode = mul_bytes(add_bytes(mul_bytes(static_cast<u64>(shape.text_tokens),
                                                       static_cast<u64>(l.transformer.joint_dim)),
                                             static_cast<u64>(l.pooled_dim)),
                                   elem);
  const u64 kept = mul_bytes(mul_bytes(static_cast<u64>(q.stage_requests), q.true_cfg ? 2 : 1), per_encode);
  const u64 counted = q.device == "cpu" ? kept : 0;
  std::vector<RankNumbers> ranks;
  for (int r = 0; r < tp; ++r) ranks.push_back(rank_numbers(comps, l, q, shape, device, tp, r, counted));
  for (const char* stages : {"together", "staged"}) {
    if (!q.stages.empty() && q.stages != stages) continue;
    const bool staged = std::string(stages) == "staged";
    FitCandidate best;
    for (int r = 0; r < tp; ++r) {
      const RankNumbers& n = ranks[static_cast<size_t>(r)];
      const FitPhases& p = staged ? n.staged : n.together;
      const FitPhases& checked = staged ? n.staged_checked : n.together_checked;
      best.checked_peak = std::max(best.checked_peak, add_bytes(checked.peak(), plan.overhead));
      if (r > 0 && add_bytes(p.peak(), plan.overhead) <= best.peak) continue;
      best.rank = r;
      best.phases = p;
      best.components = n.components;
      best.activations = staged ? n.act_staged : n.act_together;
      best.peak = add_bytes(p.peak(), plan.overhead);
    }
    best.tp = tp;
    best.dp = q.world / tp;
    best.stages = stages;
    best.kept_embeddings = staged ? kept : 0;
    best.fits = best.checked_peak <= plan.rank_memory;
    plan.candidates.push_back(std::move(best));
  }
}

// The most replicas that fit; a tie broken by less memory.
std::optional<FitChoice> choose(const std::vector<FitCandidate>& candidates) {
  const FitCandidate* best = nullptr;
  for (const auto& c : candidates) {
    if (!c.fits) continue;
    if (!best || c.dp > best->dp || (c.dp == best->dp && c.peak < best->peak)) best = &c;
  }
  if (!best) return std::nullopt;
  return FitChoice{best->tp, best->dp, best->stages};
}

PipelineOptions planned_options(const FitQuery& q) {
  PipelineOptions o = q.options;
  o.device = q.device == "cuda" ? "cuda:0" : "cpu";
  o.text_encoders = true;
  o.denoiser = true;
  return o;
}

}  // namespace

u64 FitPhases::peak() const { return std::max({encode, denoise, decode}); }

const FitCandidate* FitPlan::find(int tp, const std::string& stages) const {
  for (const auto& c : candidates)
    if (c.tp == tp && c.stages == stages) return &c;
  return nullptr;
}

std::string FitPlan::auto_stages_at(int tp) const {
  const FitCandidate* together = find(tp, "together");
  return together && together->fits ? "together" : "staged";
}

std::optional<uint64_t> default_rank_memory(const std::string& device, int ranks_per_node, std::string* source) {
  const int sharing = std::max(1, ranks_per_node);
  const HostMemory mem = device == "cuda" ? device_memory(0) : host_memory();
  const MemoryLimit* tight = mem.tightest(sharing);
  const auto avail = mem.available(sharing);
  if (!tight || !avail) return std::nullopt;
  if (source) {
    *source = tight->shared && sharing > 1 ? fmt::format("{} / {} ranks of this node", tight->name, sharing)
                                           : tight->name;
  }
  return avail;
}

FitPlan plan_fit(const FitQuery& q) {
  check_query(q);
  PipelineOptions options = planned_options(q);
  const PipelineLayout layout = pipeline_layout(q.folder, options);
  FitPlan plan;
  plan.pipeline = layout.cls;
  plan.device = q.device;
  plan.overhead = q.overhead.value_or(q.device == "cuda" ? kCudaProcessOverhead : kCpuProcessOverhead);
  if (q.rank_memory) {
    plan.rank_memory = *q.rank_memory;
    plan.rank_memory_source = "given";
  } else {
    const auto mem = default_rank_memory(q.device, q.ranks_per_node > 0 ? q.ranks_per_node : q.world,
                                         &plan.rank_memory_source);
    if (!mem) {
      throw ConfigError(fmt::format("the memory of a {} rank cannot be read on this node; give it", q.device), true);
    }
    plan.rank_memory = *mem;
  }
  const RequestShape shape = planned_shape(layout, q);
  plan.height = shape.height;
  plan.width = shape.width;
  plan.batch = shape.batch;
  plan.text_tokens = shape.text_tokens;
  plan.frames = shape.frames;
  plan.staged_experts = q.options.stage_experts;
  plan.true_cfg = q.true_cfg;
  plan.stage_requests = q.stage_requests;

  // A device map is resolved as load_pipeline resolves it (one rank: a map refuses tp > 1).
  std::vector<SizedComponent> comps = size_components(
      options.component_base.memory.device_mapped()
          ? pipeline_layout(q.folder, resolve_device_map(checkpoint::open_pipeline_folder(q.folder), {}, options))
          : layout,
      options.variant);
  for (auto& c : comps) add_adapter_parts(c, q);
  for (int tp = 1; tp <= q.world; ++tp) {
    if (q.world % tp != 0) continue;
    const std::string why = tp_refusal(comps, q, tp);
    if (!why.empty()) {
      plan.refused.push_back({tp, why});
      continue;
    }
    add_candidates(comps, layout, q, shape, tp, plan);
  }
  plan.chosen = choose(plan.candidates);
  if (plan.chosen) plan.auto_stages = plan.auto_stages_at(plan.chosen->tp);
  return plan;
}

}  // namespace tprun::pipelines
