// The FLUX.1 text encoders against transformers 4.57.6 (tests/data/clip_text,
// tests/data/t5_encoder, from the reference set shared/ref): outputs and every
// debug intermediate within 1e-4, the CLIP pooling rules, the model tables and
// the T5 plan, bad ids and checkpoints that do not fit their config.
#include <cstdio>
#include <filesystem>
#include <set>
#include <tuple>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>

#include "checkpoint/hdf5_source.h"
#include "checkpoint/tensor_file.h"
#include "checkpoint/weight_source.h"
#include "models/clip_text_model.h"
#include "models/model_config.h"
#include "models/model_registry.h"
#include "models/t5_encoder.h"
#include "runtime/error.h"
#include "test_data.h"

namespace tprun::models {
namespace {

namespace fs = std::filesystem;
using checkpoint::ShardStyle;

constexpr double kTol = 1e-4;  // shared/ref/TEXT.md

fs::path clip_dir() { return test::data_dir("clip_text"); }
fs::path t5_dir() { return test::data_dir("t5_encoder"); }

double max_abs(const at::Tensor& a, const at::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  return at::abs(a.to(at::kFloat) - b.to(at::kFloat)).max().item().toDouble();
}

struct Component {
  nlohmann::json config;
  std::string config_path;
  std::unique_ptr<checkpoint::WeightSource> source;
};

Component open_component(const fs::path& dir) {
  Component c;
  c.config = read_component_config(dir.string(), &c.config_path);
  c.source = checkpoint::open_weight_source(dir.string());
  return c;
}

at::Tensor input_ids(const fs::path& dir) {
  return checkpoint::read_tensor_file((dir / "inputs.safetensors").string()).at("input_ids");
}

// Every float tensor of debug.safetensors that the trace holds is within
// tolerance (integer ones equal); each stored tensor must be traced.
void expect_trace_matches(const Trace& trace, const fs::path& debug_file, const char* tag) {
  auto debug = checkpoint::read_tensor_file(debug_file.string());
  std::set<std::string> seen;
  for (const auto& [name, t] : trace) {
    auto it = debug.find(name);
    if (it == debug.end()) continue;
    seen.insert(name);
    if (!at::isFloatingType(it->second.scalar_type())) {
      EXPECT_TRUE(at::equal(t.to(it->second.scalar_type()), it->second)) << tag << " " << name;
      std::printf("[%s] debug %-26s exact\n", tag, name.c_str());
      continue;
    }
    const double d = max_abs(t, it->second);
    std::printf("[%s] debug %-26s max abs diff %.3g\n", tag, name.c_str(), d);
    EXPECT_LE(d, kTol) << tag << " " << name;
  }
  for (const auto& [name, t] : debug) EXPECT_TRUE(seen.count(name)) << tag << ": no trace of debug tensor " << name;
}

TEST(ClipText, MatchesTransformers) {
  const fs::path dir = clip_dir();
  Component c = open_component(dir / "text_encoder");
  auto m = ClipTextModel::load(*c.source, c.config, c.config_path);
  EXPECT_EQ(m->hidden_size(), 32);
  EXPECT_EQ(m->max_positions(), 77);
  EXPECT_GT(m->bytes_loaded(), 0u);
  Trace trace;
  TensorMap out = m->encode(input_ids(dir), &trace);
  auto expected = checkpoint::read_tensor_file((dir / "expected.safetensors").string());
  for (const char* name : {"last_hidden_state", "pooler_output"}) {
    ASSERT_TRUE(out.count(name)) << name;
    EXPECT_EQ(out.at(name).scalar_type(), at::kFloat);
    const double d = max_abs(out.at(name), expected.at(name));
    std::printf("[clip] %-18s max abs diff vs transformers %.3g\n", name, d);
    EXPECT_LE(d, kTol) << name;
  }
  expect_trace_matches(trace, dir / "debug.safetensors", "clip");
}

// eos_token_id 2: argmax of the ids; any other value: first position equal to
// it. An id that is not the largest in its row tells the rules apart.
TEST(ClipText, PoolingRuleFollowsEosTokenId) {
  const fs::path dir = clip_dir();
  at::Tensor ids = input_ids(dir);
  const int64_t probe = ids[0][3].item<int64_t>();
  ASSERT_NE(probe, 2);
  int64_t first = -1;
  for (int64_t s = 0; s < ids.size(1); ++s)
    if (ids[0][s].item<int64_t>() == probe) {
      first = s;
      break;
    }
  const int64_t argmax = ids[0].argmax().item<int64_t>();
  ASSERT_NE(first, argmax);
  for (int64_t eos : {int64_t{2}, probe}) {
    Component c = open_component(dir / "text_encoder");
    c.config["eos_token_id"] = eos;
    TensorMap out = ClipTextModel::load(*c.source, c.config, c.config_path)->encode(ids);
    const int64_t pos = eos == 2 ? argmax : first;
    EXPECT_TRUE(at::equal(out.at("pooler_output")[0], out.at("last_hidden_state")[0][pos])) << "eos " << eos;
  }
}

TEST(ClipText, BadIdsAreRequestErrors) {
  Component c = open_component(clip_dir() / "text_encoder");
  auto m = ClipTextModel::load(*c.source, c.config, c.config_path);
  at::Tensor ids = input_ids(clip_dir());
  at::Tensor bad = ids.clone();
  bad[1][5] = 914;  // vocab_size
  EXPECT_THROW(m->encode(bad), RequestError);
  bad[1][5] = -1;
  EXPECT_THROW(m->encode(bad), RequestError);
  EXPECT_THROW(m->encode(ids[0]), RequestError);                              // rank 1
  EXPECT_THROW(m->encode(at::cat({ids, ids}, 1)), RequestError);              // 154 > 77 positions
  EXPECT_THROW(m->encode(ids.to(at::kFloat)), RequestError);                  // not integer
  EXPECT_NO_THROW(m->encode(ids.narrow(1, 0, 10).to(at::kInt)));              // shorter, int32
}

// A checkpoint that does not fit its config fails before any byte is read,
// naming the tensor and both shapes.
TEST(ClipText, WrongShapeCheckpointFailsBeforeReading) {
  Component c = open_component(clip_dir() / "text_encoder");
  c.config["intermediate_size"] = 65;
  try {
    ClipTextModel::load(*c.source, c.config, c.config_path);
    FAIL() << "expected CheckpointError";
  } catch (const CheckpointError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("text_model.encoder.layers.0.mlp.fc1.weight' has wrong shape; expected [65, 32], got [64, 32]"),
              std::string::npos)
        << msg;
  }
  EXPECT_EQ(c.source->bytes_read(), 0u);
}

TEST(T5Encoder, MatchesTransformers) {
  const fs::path dir = t5_dir();
  Component c = open_component(dir / "text_encoder_2");
  auto m = T5Encoder::load(*c.source, c.config, c.config_path, parallel::TpContext{});
  EXPECT_EQ(m->d_model(), 32);
  EXPECT_EQ(m->all_reduces_per_forward(), 0);
  Trace trace;
  at::Tensor out = m->encode(input_ids(dir), &trace);
  EXPECT_EQ(out.scalar_type(), at::kFloat);
  const double d =
      max_abs(out, checkpoint::read_tensor_file((dir / "expected.safetensors").string()).at("last_hidden_state"));
  std::printf("[t5] last_hidden_state max abs diff vs transformers %.3g\n", d);
  EXPECT_LE(d, kTol);
  expect_trace_matches(trace, dir / "debug.safetensors", "t5");
}

// Against our fp32 forward (itself within 1e-4 of transformers): bf16 (8
// mantissa bits) 1e-1 and fp16 (11 bits, wo kept fp32) 2e-2 on O(1) outputs.
TEST(T5Encoder, HalfPrecisionWithinLooserTolerance) {
  const fs::path dir = t5_dir();
  at::Tensor ids = input_ids(dir);
  Component c = open_component(dir / "text_encoder_2");
  at::Tensor ref = T5Encoder::load(*c.source, c.config, c.config_path, parallel::TpContext{})->encode(ids);
  for (auto [dtype, tol, type] : {std::tuple<const char*, double, at::ScalarType>{"bf16", 1e-1, at::kBFloat16},
                                  {"fp16", 2e-2, at::kHalf}}) {
    ModelOptions o;
    o.dtype = dtype;
    Component h = open_component(dir / "text_encoder_2");
    at::Tensor out = T5Encoder::load(*h.source, h.config, h.config_path, parallel::TpContext{}, o)->encode(ids);
    EXPECT_EQ(out.scalar_type(), type) << dtype;
    const double d = max_abs(out, ref);
    std::printf("[t5] %s max abs diff vs fp32 %.3g (max |out| %.3g)\n", dtype, d, at::abs(ref).max().item<double>());
    EXPECT_LE(d, tol) << dtype;
  }
}

TEST(T5Encoder, BadIdsAndTpThatDoesNotDivideHeads) {
  Component c = open_component(t5_dir() / "text_encoder_2");
  // tp 3 does not divide num_heads 4: refused before any byte is read.
  EXPECT_THROW(T5Encoder::load(*c.source, c.config, c.config_path, parallel::TpContext{0, 3, nullptr}), ConfigError);
  EXPECT_EQ(c.source->bytes_read(), 0u);
  auto m = T5Encoder::load(*c.source, c.config, c.config_path, parallel::TpContext{});
  at::Tensor bad = input_ids(t5_dir()).clone();
  bad[0][0] = 704;  // vocab_size
  EXPECT_THROW(m->encode(bad), RequestError);
  EXPECT_THROW(m->encode(bad[0]), RequestError);
}

// The tables name exactly what transformers saves; the T5 plan as data.
TEST(TextEncoderTables, MatchTheStoredTensorsAndPlan) {
  for (const auto& [dir, cls] : {std::pair<fs::path, std::string>{clip_dir() / "text_encoder", "CLIPTextModel"},
                                 {t5_dir() / "text_encoder_2", "T5EncoderModel"}}) {
    Component c = open_component(dir);
    auto table = model_table_for(c.config, c.config_path);
    ASSERT_TRUE(table) << cls;
    EXPECT_EQ(table->cls, cls);
    if (cls == "T5EncoderModel") {
      ASSERT_EQ(table->tp_divisors.size(), 1u);
      EXPECT_EQ(table->tp_divisors[0].field, "num_heads");
      EXPECT_EQ(table->tp_divisors[0].value, 4);
    } else {
      EXPECT_TRUE(table->tp_divisors.empty());  // replicated: no constraint
      EXPECT_TRUE(table->tp_plan().empty());
    }
    std::set<std::string> required, stored;
    for (const auto& t : table->tensors) {
      if (!t.optional) required.insert(t.name);
      if (c.source->contains(t.name)) EXPECT_EQ(c.source->describe(t.name).shape, t.shape) << t.name;
    }
    for (const auto& n : c.source->tensor_names()) stored.insert(n);
    EXPECT_EQ(required, stored) << cls;
  }
  Component c = open_component(t5_dir() / "text_encoder_2");
  auto t = *model_table_for(c.config, c.config_path);
  const std::string b = "encoder.block.1.layer.";
  EXPECT_EQ(t.find(b + "0.SelfAttention.q.weight")->style, ShardStyle::Colwise);
  EXPECT_EQ(t.find(b + "0.SelfAttention.v.weight")->style, ShardStyle::Colwise);
  EXPECT_EQ(t.find(b + "0.SelfAttention.o.weight")->style, ShardStyle::Rowwise);
  EXPECT_EQ(t.find(b + "1.DenseReluDense.wi_1.weight")->style, ShardStyle::Colwise);
  EXPECT_EQ(t.find(b + "1.DenseReluDense.wo.weight")->style, ShardStyle::Rowwise);
  EXPECT_EQ(t.find(b + "1.layer_norm.weight")->style, ShardStyle::Replicated);
  EXPECT_EQ(t.find("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight")->style,
            ShardStyle::Replicated);
  EXPECT_EQ(t.find("encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight"), nullptr);
  EXPECT_TRUE(t.find("encoder.embed_tokens.weight")->optional);

  // Non-gated T5 ("relu"): one wi, planned colwise.
  nlohmann::json relu = c.config;
  relu["feed_forward_proj"] = "relu";
  auto r = *model_table_for(relu, "relu/config.json");
  EXPECT_EQ(r.find(b + "1.DenseReluDense.wi_0.weight"), nullptr);
  EXPECT_EQ(r.find(b + "1.DenseReluDense.wi.weight")->style, ShardStyle::Colwise);
  EXPECT_EQ(T5Config::from_json(relu, "x").act, "relu");
  EXPECT_EQ(T5Config::from_json(c.config, "x").act, "gelu_new");
  nlohmann::json bad = c.config;
  bad["feed_forward_proj"] = "gated-gelu-x";
  EXPECT_THROW(model_table_for(bad, "bad/config.json"), CheckpointError);
  bad["feed_forward_proj"] = "gated-softsign";
  EXPECT_THROW(model_table_for(bad, "bad/config.json"), CheckpointError);
}

// A config that says non-gated ("relu") over a gated checkpoint is refused
// before any byte is read: the table wants DenseReluDense.wi, the file has wi_0/wi_1.
TEST(T5Encoder, NonGatedConfigNeedsWi) {
  Component c = open_component(t5_dir() / "text_encoder_2");
  c.config["feed_forward_proj"] = "relu";
  try {
    T5Encoder::load(*c.source, c.config, c.config_path, parallel::TpContext{});
    FAIL() << "expected CheckpointError";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("DenseReluDense.wi.weight' is missing"), std::string::npos) << e.what();
  }
  EXPECT_EQ(c.source->bytes_read(), 0u);
}

// T5's bucket function on known values (num_buckets 32, max_distance 128):
// exact buckets below 8, log buckets up to 15, +16 for positive distances.
TEST(T5Encoder, RelativePositionBuckets) {
  at::Tensor rel = at::tensor({0L, 1L, -1L, 7L, -7L, 8L, 12L, 127L, 128L, 1000L, -1000L}, at::kLong);
  at::Tensor b = t5_relative_position_bucket(rel, true, 32, 128);
  std::vector<int64_t> got(b.data_ptr<int64_t>(), b.data_ptr<int64_t>() + b.numel());
  // 12: 8 + int(log(12/8)/log(16)*8) = 8 + int(1.17) = 9.
  EXPECT_EQ(got, (std::vector<int64_t>{0, 17, 1, 23, 7, 24, 25, 31, 31, 31, 15}));
}

}  // namespace
}  // namespace tprun::models
