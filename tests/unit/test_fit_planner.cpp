// The fit planner (pipelines/fit_planner.h) and the family layouts it reads
// (pipelines/pipeline_layout.h) on tiny init-model folders of FLUX.1, FLUX.2
// [klein] and FLUX.2 [dev]: the weight bytes it predicts from headers equal
// what real loads read and keep (fp32, bf16, fp8 layerwise storage), the
// hidden-layer cut is counted, staged peaks lie below together peaks, and
// the chosen plan has the most replicas that fit (a tie: less memory).
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "checkpoint/hdf5_source.h"
#include "checkpoint/weight_source.h"
#include "models/model_config.h"
#include "models/model_registry.h"
#include "models/weight_bytes.h"
#include "pipelines/fit_planner.h"
#include "pipelines/pipeline.h"
#include "pipelines/pipeline_layout.h"
#include "pipelines/request_memory.h"
#include "presets/preset_registry.h"
#include "runtime/error.h"
#include "runtime/rank_env.h"
#include "test_data.h"
#include "tiny_pipeline.h"

namespace tprun::pipelines {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

using test::tiny_folder;

PipelineOptions options_of(const std::string& dtype, bool fp8) {
  PipelineOptions o;
  o.dtype = dtype;
  if (fp8) o.component_base.memory.layerwise_storage = "float8_e4m3fn";
  return o;
}

FitQuery query_of(const std::string& arch, int world, const PipelineOptions& options) {
  FitQuery q;
  q.folder = tiny_folder(arch);
  q.world = world;
  q.rank_memory = 1024 * kGiB;
  q.overhead = 0;
  q.options = options;
  q.height = q.width = 64;
  return q;
}

// Each component of the layout loaded alone, as the pipeline loads it.
struct RealLoad {
  uint64_t read = 0;
  std::map<std::string, uint64_t> stored;
};
RealLoad load_components(const PipelineLayout& layout) {
  RealLoad r;
  for (const auto& c : layout.components) {
    auto source = checkpoint::open_weight_source(c.path, "");
    std::string config_path;
    const auto config = models::read_component_config(c.path, &config_path);
    const auto model = models::load_model(*source, config, config_path, parallel::TpContext{}, c.options);
    r.read += model->bytes_loaded();
    r.stored[c.name] = model->bytes_stored();
  }
  return r;
}

class PlannerWeights : public ::testing::TestWithParam<std::string> {};

TEST_P(PlannerWeights, EqualWhatRealLoadsReadAndKeep) {
  const std::string arch = GetParam();
  for (const auto& [dtype, fp8] : std::vector<std::pair<std::string, bool>>{
           {"fp32", false}, {"bf16", false}, {"fp32", true}, {"bf16", true}}) {
    SCOPED_TRACE(arch + " " + dtype + (fp8 ? " fp8" : ""));
    const PipelineOptions o = options_of(dtype, fp8);
    const PipelineLayout layout = pipeline_layout(tiny_folder(arch), o);
    const RealLoad real = load_components(layout);
    // The layout names the pipeline's components with the pipeline's options.
    EXPECT_EQ(load_pipeline(tiny_folder(arch), parallel::TpContext{}, o)->bytes_loaded(), real.read);
    const FitPlan plan = plan_fit(query_of(arch, 1, o));
    const FitCandidate* c = plan.find(1, "together");
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->components, real.stored);
    uint64_t weights = 0;
    for (const auto& [name, bytes] : c->components) weights += bytes;
    // together: every component resident plus the request's activations.
    EXPECT_EQ(c->phases.peak(), weights + c->activations);
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, PlannerWeights, ::testing::Values("flux", "flux2-klein", "flux2-dev"));

TEST(FitPlanner, Fp8StorageShrinksTheWeights) {
  const FitPlan plain = plan_fit(query_of("flux2-klein", 1, options_of("bf16", false)));
  const FitPlan fp8 = plan_fit(query_of("flux2-klein", 1, options_of("bf16", true)));
  const auto& a = plain.find(1, "together")->components;
  const auto& b = fp8.find(1, "together")->components;
  EXPECT_LT(b.at("transformer"), a.at("transformer"));
  EXPECT_LT(b.at("text_encoder"), a.at("text_encoder"));
  EXPECT_GT(b.at("transformer"), a.at("transformer") / 2);  // norms and embedders stay bf16
}

// The bytes of the stored tensors whose name starts with one of `prefixes`, in fp32.
uint64_t stored_bytes(const std::string& component, const std::vector<std::string>& prefixes) {
  const auto listing = models::list_component(component, "");
  uint64_t total = 0;
  for (const auto& r : listing.rows) {
    for (const auto& p : prefixes) {
      if (r.name.rfind(p, 0) == 0) {
        total += r.bytes;
        break;
      }
    }
  }
  return total;
}

TEST(FitPlanner, HiddenLayerCutOfTheFlux2TextEncoders) {
  // klein stacks hidden states 9, 18, 27 of a 28-layer encoder: layer 27 and
  // the final norm are not loaded; dev (10, 20, 30 of 31): layer 30 and the norm.
  for (const auto& [arch, prefix, cut] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"flux2-klein", "model.", "27"}, {"flux2-dev", "language_model.model.", "30"}}) {
    SCOPED_TRACE(arch);
    const PipelineLayout layout = pipeline_layout(tiny_folder(arch), {});
    const ComponentLayout* te = layout.find("text_encoder");
    ASSERT_NE(te, nullptr);
    EXPECT_EQ(te->options.hidden_layers.back(), std::stoll(cut));
    EXPECT_TRUE(te->sharded);
    const auto listing = models::list_component(te->path, "");
    const auto full = models::model_table_for(listing.config, listing.config_path, {});
    ASSERT_TRUE(full.has_value());
    models::BuildOptions build;
    const uint64_t uncut = models::rank_weights(listing.rows, *full, 0, 1, build, te->path).read;
    const uint64_t planned = plan_fit(query_of(arch, 1, {})).find(1, "together")->components.at("text_encoder");
    const uint64_t not_loaded =
        stored_bytes(te->path, {prefix + "layers." + cut + ".", prefix + "norm.weight"});
    EXPECT_GT(not_loaded, 0u);
    EXPECT_EQ(planned, uncut - not_loaded);
  }
  // FLUX.1's CLIP and T5 have no cut.
  const PipelineLayout flux = pipeline_layout(tiny_folder("flux"), {});
  for (const auto& c : flux.components) EXPECT_TRUE(c.options.hidden_layers.empty()) << c.name;
  EXPECT_FALSE(flux.find("text_encoder")->sharded);
  EXPECT_FALSE(flux.find("text_encoder_2")->sharded);
  EXPECT_EQ(flux.find("vae")->options.part, "decoder");
  EXPECT_TRUE(flux.find("vae")->rank_zero_only);
}

TEST(FitPlanner, StagedPeaksBelowTogether) {
  for (const std::string arch : {"flux", "flux2-klein", "flux2-dev"}) {
    for (int tp : {1, 2}) {
      const FitPlan plan = plan_fit(query_of(arch, 2, {}));
      const FitCandidate* together = plan.find(tp, "together");
      const FitCandidate* staged = plan.find(tp, "staged");
      ASSERT_TRUE(together && staged) << arch << " tp " << tp;
      EXPECT_LT(staged->peak, together->peak) << arch << " tp " << tp;
      EXPECT_LT(staged->phases.encode, together->phases.encode) << arch;
      EXPECT_GT(staged->kept_embeddings, 0u);
    }
  }
}

TEST(FitPlanner, TextEncoderShardingFollowsThePipeline) {
  // FLUX.1's T5 whole on each rank unless shard_text_encoders; FLUX.2's split by default.
  auto per_rank = [](const std::string& arch, std::optional<bool> shard, int tp, const std::string& component) {
    PipelineOptions o;
    o.shard_text_encoders = shard;
    return plan_fit(query_of(arch, 2, o)).find(tp, "together")->components.at(component);
  };
  EXPECT_EQ(per_rank("flux", std::nullopt, 2, "text_encoder_2"), per_rank("flux", std::nullopt, 1, "text_encoder_2"));
  EXPECT_LT(per_rank("flux", true, 2, "text_encoder_2"), per_rank("flux", true, 1, "text_encoder_2"));
  EXPECT_EQ(per_rank("flux", true, 2, "text_encoder"), per_rank("flux", true, 1, "text_encoder"));  // CLIP
  EXPECT_LT(per_rank("flux2-klein", std::nullopt, 2, "text_encoder"),
            per_rank("flux2-klein", std::nullopt, 1, "text_encoder"));
  EXPECT_EQ(per_rank("flux2-klein", false, 2, "text_encoder"), per_rank("flux2-klein", false, 1, "text_encoder"));
  EXPECT_LT(per_rank("flux2-klein", std::nullopt, 2, "transformer"),
            per_rank("flux2-klein", std::nullopt, 1, "transformer"));
}

TEST(FitPlanner, TheVaeMakesRankZeroThePeak) {
  const FitPlan plan = plan_fit(query_of("flux2-klein", 2, {}));
  const FitCandidate* c = plan.find(2, "together");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->rank, 0);
  EXPECT_EQ(c->components.count("vae"), 1u);
  PipelineOptions every;
  every.decode_on_every_rank = true;
  const FitPlan all = plan_fit(query_of("flux2-klein", 2, every));
  EXPECT_EQ(all.find(2, "together")->peak, c->peak);
}

TEST(FitPlanner, ChoosesTheMostReplicasThatFitThenLessMemory) {
  // klein tiny: 2 heads, so a world of 4 allows tp 1 and 2 only.
  FitQuery q = query_of("flux2-klein", 4, {});
  FitPlan plan = plan_fit(q);
  ASSERT_EQ(plan.refused.size(), 1u);
  EXPECT_EQ(plan.refused[0].tp, 4);
  EXPECT_NE(plan.refused[0].reason.find("num_attention_heads"), std::string::npos) << plan.refused[0].reason;
  ASSERT_TRUE(plan.chosen.has_value());
  EXPECT_EQ(plan.chosen->tp, 1);
  EXPECT_EQ(plan.chosen->dp, 4);
  EXPECT_EQ(plan.chosen->stages, "staged");  // both fit at dp 4: the one with less memory

  // fits compares the peak with the request check's margin (never below the estimate).
  for (const auto& c : plan.candidates) EXPECT_GT(c.checked_peak, c.peak);
  const uint64_t tp1 = plan.find(1, "staged")->checked_peak, tp2 = plan.find(2, "staged")->checked_peak;
  const uint64_t tp1_together = plan.find(1, "together")->checked_peak;
  ASSERT_LT(tp2, tp1);
  // Room for tp 1 staged exactly (a checked peak equal to the memory fits) but not together.
  q.rank_memory = tp1;
  plan = plan_fit(q);
  ASSERT_TRUE(plan.chosen.has_value());
  EXPECT_EQ(plan.chosen->tp, 1);
  EXPECT_EQ(plan.chosen->stages, "staged");
  EXPECT_LT(tp1, tp1_together);
  EXPECT_FALSE(plan.find(1, "together")->fits);
  // Room for tp 2 only: fewer replicas.
  q.rank_memory = tp1 - 1;
  plan = plan_fit(q);
  ASSERT_TRUE(plan.chosen.has_value());
  EXPECT_EQ(plan.chosen->tp, 2);
  EXPECT_EQ(plan.chosen->dp, 2);
  // Nothing fits: no plan.
  q.rank_memory = tp2 - 1;
  plan = plan_fit(q);
  EXPECT_FALSE(plan.chosen.has_value());
  for (const auto& c : plan.candidates) EXPECT_FALSE(c.fits);
  // Only together asked for.
  q.rank_memory = 1024 * kGiB;
  q.stages = "together";
  plan = plan_fit(q);
  ASSERT_TRUE(plan.chosen.has_value());
  EXPECT_EQ(plan.chosen->stages, "together");
  for (const auto& c : plan.candidates) EXPECT_EQ(c.stages, "together");
}

TEST(FitPlanner, LargerRequestsNeedMore) {
  FitQuery q = query_of("flux", 1, {});
  const uint64_t small = plan_fit(q).find(1, "together")->peak;
  q.height = q.width = 512;
  const uint64_t large = plan_fit(q).find(1, "together")->peak;
  q.batch = 4;
  const uint64_t batched = plan_fit(q).find(1, "together")->peak;
  EXPECT_LT(small, large);
  EXPECT_LT(large, batched);
  // The largest of the requests is planned for.
  q = query_of("flux", 1, {});
  q.height = q.width = 0;
  GenerationRequest a, b;
  a.height = a.width = 64;
  b.height = 128;
  b.width = 256;
  q.requests = {a, b};
  const FitPlan plan = plan_fit(q);
  EXPECT_EQ(plan.height, 128);
  EXPECT_EQ(plan.width, 256);
  // Unset: the pipeline's default (128 x the VAE's scale factor).
  q.requests = {};
  EXPECT_EQ(plan_fit(q).height, 128 * pipeline_layout(tiny_folder("flux"), {}).vae_scale_factor);
}

TEST(FitPlanner, OffloadKeepsOneGroupOnTheDevice) {
  PipelineOptions o;
  FitQuery q = query_of("flux2-klein", 1, o);
  q.device = "cuda";
  const uint64_t resident = plan_fit(q).find(1, "together")->components.at("transformer");
  q.options.component_base.memory.offload.type = "block_level";
  const uint64_t offloaded = plan_fit(q).find(1, "together")->components.at("transformer");
  EXPECT_LT(offloaded, resident);
  EXPECT_GT(offloaded, 0u);
  q.options.component_base.memory.offload.prefetch = true;
  const uint64_t prefetched = plan_fit(q).find(1, "together")->components.at("transformer");
  EXPECT_GT(prefetched, offloaded);
  EXPECT_LE(prefetched, resident);
}

TEST(FitPlanner, RefusesBadQueriesAndFoldersAsLoadPipelineDoes) {
  test::TempDir tmp;
  std::string planner_error, loader_error;
  FitQuery q = query_of("flux", 1, {});
  q.folder = tmp.path().string();
  try {
    plan_fit(q);
  } catch (const ConfigError& e) {
    planner_error = e.what();
  }
  try {
    load_pipeline(tmp.path().string(), parallel::TpContext{}, {});
  } catch (const ConfigError& e) {
    loader_error = e.what();
  }
  EXPECT_FALSE(planner_error.empty());
  EXPECT_EQ(planner_error, loader_error);
  q = query_of("flux", 0, {});
  EXPECT_THROW(plan_fit(q), ConfigError);
  q = query_of("flux", 1, {});
  q.options.dtype = "fp64";
  EXPECT_THROW(plan_fit(q), ConfigError);
  q = query_of("flux", 1, {});
  q.height = 100;  // not a multiple of 2 x the VAE's scale factor
  EXPECT_THROW(plan_fit(q), ConfigError);
  q = query_of("flux", 1, {});
  q.stages = "sometimes";
  EXPECT_THROW(plan_fit(q), ConfigError);
}

// Issue 31: a world of 2147483647 wrapped the planner's `int tp` into a
// SIGFPE; sizes past the manifest's bounds wrapped the products into a plan
// for the defaults. Each is a ConfigError now, before any folder is read.
TEST(FitPlanner, RefusesWorldsAndSizesPastTheBounds) {
  auto refused = [](FitQuery q, const std::string& field) {
    try {
      plan_fit(q);
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
      return true;
    }
    return false;
  };
  FitQuery q = query_of("flux", kMaxWorld + 1, {});
  EXPECT_TRUE(refused(q, "world"));
  q.world = std::numeric_limits<int>::max();
  EXPECT_TRUE(refused(q, "world"));
  q = query_of("flux", 1, {});
  q.height = kMaxImageSide + 16;
  EXPECT_TRUE(refused(q, "height"));
  q = query_of("flux", 1, {});
  q.width = int64_t{4000000000};
  EXPECT_TRUE(refused(q, "width"));
  q = query_of("flux", 1, {});
  q.batch = std::numeric_limits<int64_t>::max();
  EXPECT_TRUE(refused(q, "batch"));
  q = query_of("flux", 1, {});
  q.stage_requests = kMaxStageRequests + 1;
  EXPECT_TRUE(refused(q, "stage_requests"));
  // The bounds themselves plan, and the image planned is the one asked for.
  q = query_of("flux", 1, {});
  q.height = q.width = kMaxImageSide;
  q.batch = kMaxBatchSize;
  q.stage_requests = kMaxStageRequests;
  q.true_cfg = true;
  const FitPlan plan = plan_fit(q);
  EXPECT_EQ(plan.height, kMaxImageSide);
  EXPECT_EQ(plan.width, kMaxImageSide);
  for (const auto& c : plan.candidates) EXPECT_GT(c.activations, uint64_t{1} << 40) << c.tp << " " << c.stages;
}

// A request whose bytes pass 2^64 (2147483648^2 was estimated "0 B"): the
// estimate saturates, never wraps to a small number.
TEST(FitPlanner, MemoryEstimateSaturates) {
  MemoryModel m;
  m.pipeline = "FluxPipeline";
  m.transformer = {24, 128, 4 * 3072, 4 * 3072, 64, 4096};
  m.elem_bytes = 4;
  m.text_hidden = 4096;
  m.decodes = true;
  m.vae.decoder_channels = {512, 512, 256, 128};
  m.threads = 2;
  for (const int64_t side : {int64_t{2147483648}, int64_t{9223372036854775792}}) {
    SCOPED_TRACE(side);
    RequestShape r;
    r.height = r.width = side;
    r.image_tokens = side == 2147483648 ? (side / 16) * (side / 16) : std::numeric_limits<int64_t>::max();
    r.text_tokens = 512;
    const MemoryEstimate e = estimate_request_memory(m, r);
    EXPECT_EQ(e.step, UINT64_MAX);
    EXPECT_EQ(e.decode, UINT64_MAX);
    EXPECT_EQ(e.peak, UINT64_MAX);
    EXPECT_GT(e.kept, uint64_t{1} << 60);
    EXPECT_EQ(e.largest(), "VAE decode");
  }
  EXPECT_EQ(add_bytes(UINT64_MAX, 1), UINT64_MAX);
  EXPECT_EQ(mul_bytes(uint64_t{1} << 40, uint64_t{1} << 40), UINT64_MAX);
  EXPECT_EQ(add_bytes(2, 3), 5u);
  EXPECT_EQ(mul_bytes(6, 7), 42u);
}

// Wan 2.2 A14B with staged experts (schedule.experts = "staged"): the load
// reads the first expert alone (the second comes later, in its place), and
// the planner counts one expert, not both: its phases are the resident ones
// less one expert's bytes, the bytes a real load of transformer_2 reads.
TEST(FitPlanner, StagedExpertsHoldOneExpert) {
  const std::string folder = tiny_folder("wan-a14b");
  PipelineOptions resident, staged;
  staged.stage_experts = true;
  const PipelineLayout all_layout = pipeline_layout(folder, resident);
  ASSERT_NE(all_layout.find("transformer_2"), nullptr);
  EXPECT_EQ(pipeline_layout(folder, staged).find("transformer_2"), nullptr);

  const ComponentLayout& second = *all_layout.find("transformer_2");
  auto source = checkpoint::open_weight_source(second.path, "");
  std::string config_path;
  const auto config = models::read_component_config(second.path, &config_path);
  const uint64_t expert =
      models::load_model(*source, config, config_path, parallel::TpContext{}, second.options)->bytes_loaded();
  EXPECT_GT(expert, 0u);
  const uint64_t both = load_pipeline(folder, parallel::TpContext{}, resident)->bytes_loaded();
  const uint64_t one = load_pipeline(folder, parallel::TpContext{}, staged)->bytes_loaded();
  EXPECT_EQ(one + expert, both);

  FitQuery q = query_of("wan-a14b", 2, resident);
  q.frames = 5;
  const FitPlan all = plan_fit(q);
  q.options = staged;
  const FitPlan held = plan_fit(q);
  EXPECT_TRUE(held.staged_experts);
  for (int tp : {1, 2}) {
    for (const std::string stages : {"together", "staged"}) {
      SCOPED_TRACE("tp " + std::to_string(tp) + " " + stages);
      const FitCandidate* a = all.find(tp, stages);
      const FitCandidate* h = held.find(tp, stages);
      ASSERT_TRUE(a && h);
      const uint64_t t2 = a->components.at("transformer_2");
      if (tp == 1) EXPECT_EQ(t2, expert);  // fp32: what the load keeps is what it reads
      EXPECT_EQ(h->components.count("transformer_2"), 0u);
      EXPECT_EQ(h->components.at("transformer"), t2);  // one config, one size
      EXPECT_EQ(h->phases.denoise + t2, a->phases.denoise);
      EXPECT_EQ(h->phases.decode + t2, a->phases.decode);
      EXPECT_LT(h->peak, a->peak);
    }
  }
}

}  // namespace
}  // namespace tprun::pipelines
