// Staged phases of the pipelines (pipeline.h: PipelineOptions::denoiser,
// text_encodes, encode_text, warn_truncation) on tiny init-model folders of
// FLUX.1, FLUX.2 [klein] and FLUX.2 [dev] at tp 1: prompts encoded by a
// pipeline loaded with its text encoders only, given back as tensors to one
// loaded without them, make exactly the images and latents (and truncation
// warnings) of a full pipeline; the encoder-only load loads fewer bytes,
// checks requests alike and refuses to generate.
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/equal.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "pipelines/pipeline.h"
#include "presets/preset_registry.h"
#include "runtime/error.h"
#include "test_data.h"
#include "tiny_pipeline.h"

namespace tprun::pipelines {
namespace {

using test::tiny_folder;

std::unique_ptr<Pipeline> load_folder(const std::string& folder, const std::string& dtype, bool text_encoders,
                                      bool denoiser) {
  PipelineOptions o;
  o.dtype = dtype;
  o.text_encoders = text_encoders;
  o.denoiser = denoiser;
  return load_pipeline(folder, parallel::TpContext{}, o);
}
std::unique_ptr<Pipeline> load(const std::string& arch, const std::string& dtype, bool text_encoders,
                               bool denoiser) {
  return load_folder(tiny_folder(arch), dtype, text_encoders, denoiser);
}

// The three loads of one folder a staged job and a together job make.
struct Loads {
  std::unique_ptr<Pipeline> full, encoders, denoiser;
};
Loads load_all(const std::string& arch, const std::string& dtype) {
  return {load(arch, dtype, true, true), load(arch, dtype, true, false), load(arch, dtype, false, true)};
}

// The truncation warnings logged while it lives (the default logger swapped for one into a string).
class TruncationLog {
 public:
  TruncationLog() : previous_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out_);
    sink->set_pattern("%v");
    auto logger = std::make_shared<spdlog::logger>("staged-test-capture", sink);
    logger->set_level(spdlog::level::warn);
    spdlog::set_default_logger(logger);
  }
  ~TruncationLog() { spdlog::set_default_logger(previous_); }
  std::vector<std::string> lines() const {
    std::vector<std::string> out;
    std::istringstream in(out_.str());
    for (std::string line; std::getline(in, line);) {
      if (line.find("truncated") != std::string::npos) out.push_back(line);
    }
    return out;
  }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::logger> previous_;
};

// More than 77 CLIP tokens and more than any max_sequence_length here.
std::string long_prompt() {
  std::string p;
  for (int i = 0; i < 30; ++i) p += "a small red fox runs through the deep snow, ";
  return p;
}

// Room for the tiny tokenizers' short prompts (FLUX.2: in their chat
// templates; dev's system message alone is about 100 tokens), not for the long one.
int64_t sequence_length(const std::string& arch) {
  return arch == "flux" ? 16 : arch == "flux2-klein" ? 32 : 128;
}

GenerationRequest request(const std::string& id, const std::string& prompt, uint64_t seed, int64_t msl = 16) {
  GenerationRequest r;
  r.id = id;
  r.prompt = prompt;
  r.seed = seed;
  r.height = r.width = 64;
  r.steps = 2;
  r.max_sequence_length = msl;
  return r;
}

// Three requests of one batch: two prompts, the first repeated with another seed.
std::vector<GenerationRequest> batch_for(const std::string& arch) {
  const std::string second = arch == "flux2-klein" ? "" : "a lighthouse at dusk";  // klein: "" = its negative
  const int64_t msl = sequence_length(arch);
  std::vector<GenerationRequest> rs = {request("a", long_prompt(), 1, msl), request("b", second, 2, msl),
                                       request("c", long_prompt(), 3, msl)};
  for (auto& r : rs) {
    if (arch == "flux") {
      r.negative_prompt = "blurry, low quality";
      r.true_cfg_scale = 2.0;
    }
    if (arch == "flux2-klein") r.guidance = 4.0;  // not distilled: true CFG with the negative prompt ""
  }
  return rs;
}

// What the staged phases make of `rs`: every needed text encoded once per key
// by `encoders`, given back to each request per `gives`.
struct Staged {
  std::vector<GenerationRequest> requests;
  int64_t encodes_needed = 0, encodes_run = 0;
};
Staged encode_phase(const Pipeline& encoders, const std::vector<GenerationRequest>& rs, c10::ScalarType dtype) {
  Staged s;
  std::map<std::string, models::TensorMap> by_key;
  for (GenerationRequest r : rs) {
    auto given = r.given ? *r.given : models::TensorMap{};
    for (const TextEncode& e : encoders.text_encodes(r)) {
      ++s.encodes_needed;
      if (!by_key.count(e.key)) {
        by_key[e.key] = encoders.encode_text(e);
        ++s.encodes_run;
      }
      const models::TensorMap& embeddings = by_key.at(e.key);
      for (const auto& [from, to] : e.gives) {
        const at::Tensor& t = embeddings.at(from);
        EXPECT_TRUE(t.device().is_cpu()) << from;
        EXPECT_TRUE(t.is_contiguous()) << from;
        EXPECT_EQ(t.scalar_type(), dtype) << from;
        given[to] = t;
      }
    }
    r.given = std::make_shared<const models::TensorMap>(std::move(given));
    s.requests.push_back(std::move(r));
  }
  return s;
}

// The truncation warnings `p` logs for the staged requests' encodes.
std::vector<std::string> warnings_of(const Pipeline& encoders, const Pipeline& p,
                                     const std::vector<GenerationRequest>& rs) {
  TruncationLog log;
  for (const auto& r : rs) {
    for (const TextEncode& e : encoders.text_encodes(r)) p.warn_truncation(r, e, encoders.encode_text(e));
  }
  return log.lines();
}

void expect_staged_equals_together(const std::string& arch, const std::string& dtype, c10::ScalarType st) {
  SCOPED_TRACE(arch + " " + dtype);
  const Loads l = load_all(arch, dtype);
  const std::vector<GenerationRequest> rs = batch_for(arch);
  std::vector<GenerationResult> together;
  std::vector<std::string> together_warnings;
  {
    TruncationLog log;
    together = l.full->generate_batch(rs);
    together_warnings = log.lines();
  }
  const Staged s = encode_phase(*l.encoders, rs, st);
  const std::vector<GenerationResult> staged = l.denoiser->generate_batch(s.requests);

  ASSERT_EQ(together.size(), rs.size());
  ASSERT_EQ(staged.size(), rs.size());
  for (size_t i = 0; i < rs.size(); ++i) {
    SCOPED_TRACE(rs[i].id);
    ASSERT_TRUE(together[i].error.empty()) << together[i].error;
    ASSERT_TRUE(staged[i].error.empty()) << staged[i].error;
    ASSERT_TRUE(together[i].decoded() && staged[i].decoded());
    EXPECT_TRUE(together[i].rgb == staged[i].rgb) << "image bytes differ";
    ASSERT_TRUE(together[i].latents && staged[i].latents);
    EXPECT_EQ(together[i].latents->scalar_type(), st);
    EXPECT_TRUE(at::equal(*together[i].latents, *staged[i].latents)) << "latents differ";
  }
  // Different prompts make different images (the given tensors are really used).
  EXPECT_FALSE(staged[0].rgb == staged[1].rgb);

  // Every request's prompt, its negative where true CFG runs; one encode per key.
  const bool cfg = arch != "flux2-dev";
  EXPECT_EQ(s.encodes_needed, cfg ? 6 : 3);
  EXPECT_EQ(s.encodes_run, arch == "flux" ? 3 : 2);  // klein: the prompt "" and the negative "" share

  // The warnings generate_batch logs, from either staged pipeline.
  const size_t lines_per_long_prompt = arch == "flux" ? 2 : 1;  // FLUX.1: T5 and CLIP
  EXPECT_EQ(together_warnings.size(), 2 * lines_per_long_prompt) << ::testing::PrintToString(together_warnings);
  EXPECT_EQ(warnings_of(*l.encoders, *l.encoders, rs), together_warnings);
  EXPECT_EQ(warnings_of(*l.encoders, *l.denoiser, rs), together_warnings);
}

TEST(StagedPipeline, FluxEncodedEmbeddingsGiveTheSameImagesFp32) {
  expect_staged_equals_together("flux", "fp32", at::kFloat);
}
TEST(StagedPipeline, FluxEncodedEmbeddingsGiveTheSameImagesBf16) {
  expect_staged_equals_together("flux", "bf16", at::kBFloat16);
}
TEST(StagedPipeline, KleinEncodedEmbeddingsGiveTheSameImagesFp32) {
  expect_staged_equals_together("flux2-klein", "fp32", at::kFloat);
}
TEST(StagedPipeline, KleinEncodedEmbeddingsGiveTheSameImagesBf16) {
  expect_staged_equals_together("flux2-klein", "bf16", at::kBFloat16);
}
TEST(StagedPipeline, DevEncodedEmbeddingsGiveTheSameImagesFp32) {
  expect_staged_equals_together("flux2-dev", "fp32", at::kFloat);
}

// (field, given names) of each encode.
std::vector<std::pair<std::string, std::vector<std::pair<std::string, std::string>>>> described(
    const std::vector<TextEncode>& encodes) {
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, std::string>>>> out;
  for (const auto& e : encodes) out.emplace_back(e.field, e.gives);
  return out;
}

GenerationRequest with_given(GenerationRequest r, const models::TensorMap& extra) {
  auto g = r.given ? *r.given : models::TensorMap{};
  for (const auto& [k, v] : extra) g[k] = v;
  r.given = std::make_shared<const models::TensorMap>(std::move(g));
  return r;
}

TEST(StagedPipeline, FluxTextEncodesSkipGivenEmbeddings) {
  const auto p = load("flux", "fp32", true, false);
  GenerationRequest r = request("x", "a cat", 0);
  r.negative_prompt = "a dog";
  r.true_cfg_scale = 2.0;
  using Gives = std::vector<std::pair<std::string, std::string>>;
  const Gives prompt_gives = {{"prompt_embeds", "prompt_embeds"}, {"pooled_prompt_embeds", "pooled_prompt_embeds"}};
  const Gives negative_gives = {{"prompt_embeds", "negative_prompt_embeds"},
                                {"pooled_prompt_embeds", "negative_pooled_prompt_embeds"}};
  const auto all = p->text_encodes(r);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(described(all), (decltype(described(all)){{"prompt", prompt_gives}, {"negative_prompt", negative_gives}}));
  EXPECT_EQ(all[0].text, "a cat");
  EXPECT_EQ(all[1].text, "a dog");
  EXPECT_EQ(all[0].max_sequence_length, 16);
  EXPECT_EQ(all[0].key, "16\na cat");

  // The prompt's embeddings given: only the negative prompt is left.
  const models::TensorMap e = p->encode_text(all[0]);
  const GenerationRequest given = with_given(
      r, {{"prompt_embeds", e.at("prompt_embeds")}, {"pooled_prompt_embeds", e.at("pooled_prompt_embeds")}});
  p->check_request(given);
  EXPECT_EQ(described(p->text_encodes(given)), (decltype(described(all)){{"negative_prompt", negative_gives}}));
  // A negative's embeddings without its pooled vector (or the reverse) are refused.
  const models::TensorMap n = p->encode_text(all[1]);
  for (const char* alone : {"negative_prompt_embeds", "negative_pooled_prompt_embeds"}) {
    const at::Tensor t = n.at(std::string(alone) == "negative_prompt_embeds" ? "prompt_embeds" : "pooled_prompt_embeds");
    try {
      p->check_request(with_given(given, {{alone, t}}));
      ADD_FAILURE() << alone << " alone was accepted";
    } catch (const RequestError& err) {
      EXPECT_NE(std::string(err.what()).find("must be given together"), std::string::npos) << err.what();
    }
  }
  // No true CFG (scale 1): the negative prompt is not encoded.
  GenerationRequest plain = r;
  plain.true_cfg_scale = 1.0;
  EXPECT_EQ(described(p->text_encodes(plain)), (decltype(described(all)){{"prompt", prompt_gives}}));
  // Defaults apply: max_sequence_length 512 when unset.
  plain.max_sequence_length.reset();
  EXPECT_EQ(p->text_encodes(plain).at(0).key, "512\na cat");
}

TEST(StagedPipeline, Flux2TextEncodesFollowTrueCfg) {
  const auto klein = load("flux2-klein", "fp32", true, false);
  GenerationRequest r = request("x", "", 0);
  r.guidance = 4.0;
  const auto encodes = klein->text_encodes(r);
  ASSERT_EQ(encodes.size(), 2u);
  EXPECT_EQ(encodes[0].field, "prompt");
  EXPECT_EQ(encodes[1].field, "negative_prompt");
  EXPECT_EQ(encodes[1].gives, (std::vector<std::pair<std::string, std::string>>{{"prompt_embeds", "negative_prompt_embeds"}}));
  EXPECT_EQ(encodes[0].key, encodes[1].key);  // role-free: the prompt "" and the negative ""
  // guidance 1: no true CFG, no negative.
  r.guidance = 1.0;
  EXPECT_EQ(klein->text_encodes(r).size(), 1u);
  // Both given: nothing to encode.
  r.guidance = 4.0;
  const at::Tensor t = klein->encode_text(encodes[0]).at("prompt_embeds");
  const GenerationRequest both = with_given(r, {{"prompt_embeds", t}, {"negative_prompt_embeds", t}});
  klein->check_request(both);
  EXPECT_TRUE(klein->text_encodes(both).empty());

  const auto dev = load("flux2-dev", "fp32", true, false);
  GenerationRequest d = request("y", "a cat", 0, 128);
  d.guidance = 4.0;
  const auto dev_encodes = dev->text_encodes(d);
  ASSERT_EQ(dev_encodes.size(), 1u);  // guidance-distilled: never a negative
  EXPECT_EQ(dev_encodes[0].gives, (std::vector<std::pair<std::string, std::string>>{{"prompt_embeds", "prompt_embeds"}}));
  const GenerationRequest dev_given = with_given(d, {{"prompt_embeds", dev->encode_text(dev_encodes[0]).at("prompt_embeds")}});
  dev->check_request(dev_given);
  EXPECT_TRUE(dev->text_encodes(dev_given).empty());
}

// The message of the RequestError check_request raises, "" for none.
std::string check_message(const Pipeline& p, const GenerationRequest& r) {
  try {
    p.check_request(r);
    return "";
  } catch (const RequestError& e) {
    return e.what();
  }
}

TEST(StagedPipeline, EncoderOnlyLoadReadsConfigsButNotTheDenoiser) {
  for (const std::string arch : {"flux", "flux2-klein", "flux2-dev"}) {
    SCOPED_TRACE(arch);
    const Loads l = load_all(arch, "fp32");
    EXPECT_FALSE(l.encoders->decodes());
    EXPECT_TRUE(l.full->decodes());
    EXPECT_EQ(l.encoders->transformer_all_reduces(), 0);
    EXPECT_GT(l.encoders->bytes_loaded(), 0u);
    EXPECT_LT(l.encoders->bytes_loaded(), l.full->bytes_loaded());
    EXPECT_EQ(l.encoders->bytes_loaded() + l.denoiser->bytes_loaded(), l.full->bytes_loaded());

    // Requests are checked, keyed and costed alike.
    GenerationRequest ok = request("ok", "a cat", 0);
    GenerationRequest bad = ok;
    bad.height = 17;
    EXPECT_EQ(check_message(*l.encoders, ok), "");
    EXPECT_NE(check_message(*l.full, bad), "");
    EXPECT_EQ(check_message(*l.encoders, bad), check_message(*l.full, bad));
    GenerationRequest unset;  // defaults everywhere
    unset.prompt = "a cat";
    EXPECT_EQ(l.encoders->batch_key(unset), l.full->batch_key(unset));
    EXPECT_EQ(l.encoders->cost(ok), l.full->cost(ok));
    EXPECT_EQ(l.encoders->latent_shape(64, 96), l.full->latent_shape(64, 96));
    EXPECT_EQ(l.denoiser->latent_shape(64, 96), l.full->latent_shape(64, 96));

    // Generating needs the denoiser: an internal error, not a request's.
    try {
      l.encoders->generate_batch({ok});
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), Error::Kind::Internal) << e.what();
      EXPECT_NE(std::string(e.what()).find("generate_batch"), std::string::npos) << e.what();
    }
    // The denoiser-only load cannot encode: requests must give embeddings.
    EXPECT_THROW(l.denoiser->check_request(ok), RequestError);
  }
}

// A copy of `arch`'s tiny folder, tmp/`name`, without the files of
// `components` (their config.json kept: every config is still read).
std::string without_files(const test::TempDir& tmp, const std::string& name, const std::string& arch,
                          const std::vector<std::string>& components) {
  namespace fs = std::filesystem;
  const fs::path dir = tmp.path() / name;
  fs::copy(tiny_folder(arch), dir, fs::copy_options::recursive);
  for (const auto& c : components) {
    for (const auto& f : fs::directory_iterator(dir / c)) {
      if (f.path().filename() != "config.json") fs::remove(f.path());
    }
  }
  return dir.string();
}

// The denoiser-only load reads no text-encoder or tokenizer file. (The
// encoder-only load reads the transformer's and the VAE's configs through
// their checkpoints, safetensors headers included, but no tensor data: its
// bytes_loaded is the encoders' alone, EncoderOnlyLoadReadsConfigsButNotTheDenoiser.)
TEST(StagedPipeline, DenoiserOnlyLoadNeedsNoTextEncoderFiles) {
  test::TempDir tmp;
  for (const std::string arch : {"flux", "flux2-klein", "flux2-dev"}) {
    SCOPED_TRACE(arch);
    const std::vector<std::string> text = arch == "flux" ? std::vector<std::string>{"text_encoder", "text_encoder_2",
                                                                                    "tokenizer", "tokenizer_2"}
                                                         : std::vector<std::string>{"text_encoder", "tokenizer"};
    const std::string no_text = without_files(tmp, arch, arch, text);
    const auto denoiser = load_folder(no_text, "fp32", false, true);
    EXPECT_TRUE(denoiser->decodes());
    EXPECT_EQ(denoiser->bytes_loaded(), load(arch, "fp32", false, true)->bytes_loaded());
    // The loads that encode do need those files.
    EXPECT_THROW(load_folder(no_text, "fp32", true, false), Error);
  }
}

TEST(StagedPipeline, LoadingNothingIsAConfigError) {
  for (const std::string arch : {"flux", "flux2-klein"}) {
    EXPECT_THROW(load(arch, "fp32", false, false), ConfigError) << arch;
  }
}

// Wan 2.2 A14B as `tprun run` drives it (start_batch, advance_batch per
// weight stage, finish_in_flight): with both experts resident (one weight
// stage) and staged (two), every step runs, high- and low-noise expert, and
// the video equals generate_batch's.
TEST(StagedPipeline, WanExpertsRunEveryStepAsAJobAdvancesThem) {
  GenerationRequest r;
  r.prompt = "a fox in the snow";
  r.height = r.width = 32;
  r.steps = 4;
  r.frames = 5;
  r.seed = 5;
  r.guidance = 4.0;
  r.guidance_2 = 3.0;
  const std::string folder = tiny_folder("wan-a14b");
  std::vector<uint8_t> reference;
  for (const bool staged : {false, true}) {
    SCOPED_TRACE(staged ? "experts staged" : "experts resident");
    PipelineOptions o;
    o.stage_experts = staged;
    const auto p = load_pipeline(folder, parallel::TpContext{}, o);
    EXPECT_EQ(p->weight_stages(), staged ? 2 : 1);
    auto batch = p->start_batch({r});
    for (int64_t s = 0; s < p->weight_stages(); ++s) p->advance_batch(*batch, s);
    const std::vector<GenerationResult> job = p->finish_in_flight(*batch);
    ASSERT_EQ(job.size(), 1u);
    ASSERT_TRUE(job[0].decoded());
    if (reference.empty()) reference = p->generate_batch({r})[0].rgb;
    EXPECT_EQ(job[0].rgb, reference);
  }
}

}  // namespace
}  // namespace tprun::pipelines
