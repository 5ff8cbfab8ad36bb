#pragma once
// The interface every model component offers the commands that do not care
// which family it is (`tprun forward`, `tprun verify`, `tprun inspect`,
// `tprun init-model`), and the options every model loads with. A family is its
// own files plus one TPRUN_REGISTER_MODEL line (models/model_registry.h).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/shard_loader.h"
#include "models/model_table.h"
#include "models/tensor_map.h"
#include "parallel/tp_context.h"

namespace tprun::models {

struct ModelOptions {
  std::string dtype = "fp32";  // compute dtype: fp32 | bf16 | fp16
  std::string device = "cpu";
  checkpoint::LoadMode mode = checkpoint::LoadMode::ShardOnLoad;
  // Diffusion transformers: also shard the AdaLN modulation linears
  // (rowwise_split_input over the replicated timestep embedding; one more
  // AllReduce per forward). Off as in diffusers' plans.
  bool shard_modulation = false;
  // Components with parts (the VAE: "decoder" | "encoder"): load only that
  // part. "" loads all of it.
  std::string part;
  // Decoder-only text encoders: the hidden states the caller needs, as
  // transformers numbers output.hidden_states (0 = the embeddings, k = the
  // output of layer k-1). Layers after the last one asked for are neither
  // loaded nor run. Empty: every layer (and the final norm).
  std::vector<int64_t> hidden_layers;
  // VAEs, as diffusers' enable_slicing() / enable_tiling(): a batch decoded
  // and encoded one image at a time; images larger than a tile decoded and
  // encoded in overlapping, blended tiles (models/vae_tiling.h). Tile side
  // in pixels: 0 = the config's sample_size; overlap: diffusers' 0.25.
  bool vae_slicing = false;
  bool vae_tiling = false;
  int64_t vae_tile_sample_size = 0;
  double vae_tile_overlap = 0.25;
  // Attention with the queries in chunks of at most this many tokens, each
  // against all keys / values (exact up to floating-point order; bounds the
  // activation memory of attention at large images), in every attention of
  // the model (models/nn_ops.h "attention"). 0: one call over all queries
  // (the default, unchanged). A load refuses a value outside
  // [0, nn::kMaxAttentionChunk] (ConfigError) and logs, once, the attention
  // backend and this choice at info level.
  int64_t attention_chunk = 0;
  // Weights kept in a narrower storage dtype and up-cast to the compute dtype
  // at each use, the up-cast copy dropped after (diffusers'
  // enable_layerwise_casting): "" = off, "float8_e4m3fn" | "float8_e5m2".
  // Applies to the parameters (weight and bias) of Linear, Conv and Embedding
  // layers whose module name matches none of the skip patterns (regexes,
  // std::regex ECMAScript, searched as Python's re.search over the module's
  // name and every enclosing module's name). nullopt: diffusers'
  // DEFAULT_SKIP_MODULES_PATTERN; either way the family's own patterns (its
  // diffusers class's _skip_layerwise_casting_patterns) are added, and a
  // layer declared to keep a dtype (LinearDecl::in_dtype, diffusers'
  // _keep_in_fp32_modules) is never narrowed.
  std::string layerwise_storage;
  std::optional<std::vector<std::string>> layerwise_skip;
};

class Model {
 public:
  virtual ~Model() = default;

  // One forward with named inputs and outputs (the diffusers / transformers
  // argument and output names; each family's header lists them). RequestError
  // naming a missing or mis-shaped input, raised alike on every rank.
  virtual TensorMap forward(const TensorMap& inputs, Trace* trace = nullptr) const = 0;
  // Inputs for a small forward with a fixed seed, shapes from the config
  // (`tprun verify`'s default inputs); identical on every rank.
  virtual TensorMap example_inputs(uint64_t seed) const = 0;
  // The output `tprun verify` compares ("sample", "last_hidden_state").
  virtual std::string primary_output() const = 0;
  // AllReduces one forward issues on the TP communicator.
  virtual int64_t all_reduces_per_forward() const { return 0; }

  const ModelTable& table() const { return table_; }
  const parallel::TpContext& tp() const { return tp_; }
  uint64_t bytes_loaded() const { return bytes_loaded_; }
  // Bytes the loaded weights keep resident on this rank (smaller than
  // bytes_loaded() when weights are stored narrower, e.g. fp8).
  uint64_t bytes_stored() const { return bytes_stored_; }

 protected:
  ModelTable table_;
  parallel::TpContext tp_;
  uint64_t bytes_loaded_ = 0;
  uint64_t bytes_stored_ = 0;
};

}  // namespace tprun::models
