// The decoder-only text encoders (Qwen3ForCausalLM, Mistral3ForConditionalGeneration):
// tables from config alone (names, shapes, plan, both tp divisors, the
// Mistral3 layouts), config parsing (RoPE types, defaults), hidden-layer bounds.
//
// DecoderTextEncoderProbe.HiddenStates is the hook of
// tests/scripts/decoder_text_encoder_parity.py for what `tprun forward` cannot
// ask for yet (ModelOptions::hidden_layers): skipped unless
// TPRUN_DTE_PROBE_MODEL is set; then, under mpirun -np N with
// --gtest_filter=DecoderTextEncoderProbe.*, it loads the model at tp N with
// TPRUN_DTE_PROBE_LAYERS (e.g. "1,3"), runs TPRUN_DTE_PROBE_INPUTS through
// forward() and rank 0 writes the outputs to TPRUN_DTE_PROBE_OUT; every rank
// writes OUT.rank<r>.json (bytes loaded, AllReduce calls, layers run).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <ATen/core/Tensor.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <nlohmann/json.hpp>

#include "checkpoint/hdf5_source.h"
#include "checkpoint/tensor_file.h"
#include "checkpoint/weight_source.h"
#include "dist/mpi_communicator.h"
#include "models/decoder_text_encoder.h"
#include "models/model_config.h"
#include "models/model_registry.h"
#include "runtime/error.h"

namespace tprun::models {
namespace {

using checkpoint::ShardStyle;
using nlohmann::json;

json qwen3_config() {
  return json{{"architectures", {"Qwen3ForCausalLM"}},
              {"model_type", "qwen3"},
              {"vocab_size", 128},
              {"hidden_size", 64},
              {"intermediate_size", 96},
              {"num_hidden_layers", 3},
              {"num_attention_heads", 8},
              {"num_key_value_heads", 2},
              {"head_dim", 16},
              {"rope_parameters", {{"rope_theta", 1000000.0}, {"rope_type", "default"}}}};
}

json mistral3_config() {
  return json{{"architectures", {"Mistral3ForConditionalGeneration"}},
              {"model_type", "mistral3"},
              {"text_config",
               {{"model_type", "mistral"},
                {"vocab_size", 100},
                {"hidden_size", 64},
                {"intermediate_size", 96},
                {"num_hidden_layers", 2},
                {"num_attention_heads", 4},
                {"num_key_value_heads", 4}}},
              {"vision_config",
               {{"model_type", "pixtral"},
                {"hidden_size", 32},
                {"intermediate_size", 48},
                {"num_hidden_layers", 1},
                {"patch_size", 4}}}};
}

const TensorSpec& spec(const ModelTable& t, const std::string& name) {
  const TensorSpec* s = t.find(name);
  if (!s) throw std::runtime_error("no tensor " + name);
  return *s;
}

TEST(DecoderTextEncoderTable, Qwen3NamesShapesPlan) {
  const auto table = model_table_for(qwen3_config(), "qwen3/config.json");
  ASSERT_TRUE(table.has_value());
  EXPECT_EQ(table->cls, "Qwen3ForCausalLM");
  EXPECT_EQ(table->tensors.size(), 1u + 3u * 11u + 1u + 1u);
  const auto& q = spec(*table, "model.layers.2.self_attn.q_proj.weight");
  EXPECT_EQ(q.shape, (std::vector<int64_t>{128, 64}));  // 8 heads x head_dim 16 != hidden 64
  EXPECT_EQ(q.style, ShardStyle::Colwise);
  EXPECT_EQ(q.plan_key, "model.layers.*.self_attn.q_proj");
  EXPECT_EQ(spec(*table, "model.layers.0.self_attn.k_proj.weight").shape, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(spec(*table, "model.layers.0.self_attn.o_proj.weight").style, ShardStyle::Rowwise);
  EXPECT_EQ(spec(*table, "model.layers.0.mlp.down_proj.weight").style, ShardStyle::Rowwise);
  EXPECT_EQ(spec(*table, "model.layers.0.mlp.up_proj.weight").style, ShardStyle::Colwise);
  EXPECT_EQ(spec(*table, "model.layers.0.self_attn.q_norm.weight").shape, (std::vector<int64_t>{16}));
  EXPECT_EQ(spec(*table, "model.norm.weight").style, ShardStyle::Replicated);
  EXPECT_TRUE(spec(*table, "lm_head.weight").optional);
  EXPECT_EQ(table->find("model.layers.0.self_attn.q_proj.bias"), nullptr);
  ASSERT_EQ(table->tp_divisors.size(), 2u);
  EXPECT_EQ(table->tp_divisors[1].field, "num_key_value_heads");
  // tp 4 divides the 8 heads but not the 2 KV heads.
  try {
    validate_tp_size(*table, 4, "qwen3");
    ADD_FAILURE() << "tp 4 accepted with 2 KV heads";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("num_key_value_heads 2"), std::string::npos) << e.what();
  }
  validate_tp_size(*table, 2, "qwen3");
  // attention_bias: q/k/v/o biases, the row-wise one replicated.
  json biased = qwen3_config();
  biased["attention_bias"] = true;
  const auto tb = model_table_for(biased, "qwen3/config.json");
  EXPECT_EQ(spec(*tb, "model.layers.0.self_attn.q_proj.bias").style, ShardStyle::Colwise);
  EXPECT_EQ(spec(*tb, "model.layers.0.self_attn.o_proj.bias").style, ShardStyle::Replicated);
}

TEST(DecoderTextEncoderTable, Mistral3SavedLayoutAndVisionUnused) {
  const auto table = model_table_for(mistral3_config(), "m3/config.json");
  ASSERT_TRUE(table.has_value());
  EXPECT_EQ(table->cls, "Mistral3ForConditionalGeneration");
  EXPECT_EQ(spec(*table, "language_model.model.embed_tokens.weight").shape, (std::vector<int64_t>{100, 64}));
  EXPECT_EQ(spec(*table, "language_model.model.layers.1.self_attn.q_proj.weight").plan_key,
            "language_model.model.layers.*.self_attn.q_proj");
  EXPECT_EQ(table->find("language_model.model.layers.0.self_attn.q_norm.weight"), nullptr);
  EXPECT_TRUE(spec(*table, "language_model.lm_head.weight").optional);
  const auto& conv = spec(*table, "vision_tower.patch_conv.weight");
  EXPECT_TRUE(conv.optional);
  EXPECT_EQ(conv.shape, (std::vector<int64_t>{32, 3, 4, 4}));
  EXPECT_EQ(spec(*table, "multi_modal_projector.patch_merger.merging_layer.weight").shape,
            (std::vector<int64_t>{32, 128}));
  EXPECT_EQ(spec(*table, "multi_modal_projector.linear_1.weight").shape, (std::vector<int64_t>{64, 32}));
  EXPECT_TRUE(spec(*table, "vision_tower.transformer.layers.0.feed_forward.gate_proj.weight").optional);
  // MistralConfig's defaults: head_dim = hidden / heads, sliding_window 4096.
  const auto c = DecoderConfig::from_json(mistral3_config(), "m3/config.json");
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.window, (std::vector<int64_t>{4096, 4096}));
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  // Mistral3Config without text_config: Mistral-Small-3.1's language model.
  json bare = mistral3_config();
  bare.erase("text_config");
  const auto d = DecoderConfig::from_json(bare, "m3/config.json");
  EXPECT_EQ(d.hidden_size, 5120);
  EXPECT_EQ(d.layers, 40);
  EXPECT_EQ(d.head_dim, 128);
  EXPECT_EQ(d.rope.theta, 1e9);
  EXPECT_EQ(d.window[0], 0);
}

TEST(DecoderTextEncoderConfig, RopeTypesAndRefusals) {
  json c = qwen3_config();
  c.erase("rope_parameters");
  c["rope_theta"] = 5000;
  c["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 64}};
  auto f = DecoderConfig::from_json(c, "q/config.json");
  EXPECT_EQ(f.rope.type, "yarn");
  EXPECT_EQ(f.rope.theta, 5000);
  EXPECT_EQ(*f.rope.factor, 4.0);
  EXPECT_EQ(f.rope.original_max_position_embeddings, 64);
  c["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  EXPECT_THROW(DecoderConfig::from_json(c, "q/config.json"), ConfigError);
  c["rope_scaling"] = {{"rope_type", "linear"}};
  EXPECT_THROW(DecoderConfig::from_json(c, "q/config.json"), CheckpointError);  // no factor
  json s = qwen3_config();
  s["use_sliding_window"] = true;
  s["sliding_window"] = 5;
  s["max_window_layers"] = 1;
  EXPECT_EQ(DecoderConfig::from_json(s, "q").window, (std::vector<int64_t>{0, 5, 5}));
  json bad = qwen3_config();
  bad["num_key_value_heads"] = 3;
  EXPECT_THROW(DecoderConfig::from_json(bad, "q"), CheckpointError);
  ModelOptions o;
  o.hidden_layers = {1, 4};  // 3 layers: hidden_states has 4 entries, 0..3
  EXPECT_THROW(model_table_for(qwen3_config(), "q", o), ConfigError);
  o.hidden_layers = {0, 3};
  EXPECT_NO_THROW(model_table_for(qwen3_config(), "q", o));
}

// ---- the parity script's probe ------------------------------------------------

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

TEST(DecoderTextEncoderProbe, HiddenStates) {
  const std::string model_dir = env("TPRUN_DTE_PROBE_MODEL");
  if (model_dir.empty()) GTEST_SKIP() << "TPRUN_DTE_PROBE_MODEL not set (driven by decoder_text_encoder_parity.py)";
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  }
  {
    dist::MpiCommunicator comm(MPI_COMM_WORLD, "world", nullptr);
    const parallel::TpContext tp{comm.rank(), comm.size(), comm.size() > 1 ? &comm : nullptr};
    ModelOptions o;
    o.dtype = env("TPRUN_DTE_PROBE_DTYPE").empty() ? "fp32" : env("TPRUN_DTE_PROBE_DTYPE");
    std::stringstream layers(env("TPRUN_DTE_PROBE_LAYERS"));
    for (std::string k; std::getline(layers, k, ',');) o.hidden_layers.push_back(std::stoll(k));
    std::string config_path;
    const auto config = read_component_config(model_dir, &config_path);
    auto source = checkpoint::open_weight_source(model_dir);
    auto model = DecoderTextEncoder::load(*source, config, config_path, tp, o);
    const auto inputs = checkpoint::read_tensor_file(env("TPRUN_DTE_PROBE_INPUTS"));
    comm.reset_stats();
    auto outputs = model->forward(inputs);
    const uint64_t reduces = comm.stats()[dist::CollectiveKind::AllReduce].calls;
    // The pipeline's entry point gives the same prompt_embeds.
    if (!o.hidden_layers.empty()) {
      const at::Tensor stacked = model->stacked_hidden_states(
          inputs.at("input_ids"), inputs.count("attention_mask") ? inputs.at("attention_mask") : at::Tensor());
      EXPECT_TRUE(stacked.equal(outputs.at("prompt_embeds")));
    }
    const std::string out = env("TPRUN_DTE_PROBE_OUT");
    if (tp.rank == 0) checkpoint::write_tensor_file_f32(out, outputs);
    const json report = {{"rank", tp.rank},
                         {"tp", tp.size},
                         {"bytes_loaded", model->bytes_loaded()},
                         {"all_reduces", reduces},
                         {"planned", model->all_reduces_per_forward()},
                         {"layers_run", model->layers_run()},
                         {"primary", model->primary_output()}};
    std::ofstream(out + ".rank" + std::to_string(tp.rank) + ".json") << report.dump() << "\n";
    comm.barrier();
  }
  MPI_Finalize();
}

}  // namespace
}  // namespace tprun::models
