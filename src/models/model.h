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
#include "memory/memory_options.h"
#include "models/lora_targets.h"
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
  // The memory features ([memory] / --memory; memory/memory_options.h):
  // VAE slicing and tiling, attention in query chunks, fp8 layerwise
  // casting. The families read the fields that concern them.
  memory::MemoryOptions memory;
  // The pipeline component being loaded ("transformer"), for messages and
  // device-map entries; "" when a component is loaded alone.
  std::string component;
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
  // The loaded Linear layers adapters may reach (lora/); null for a model
  // that takes none (a VAE).
  const std::shared_ptr<LoraTargets>& lora_targets() const { return lora_targets_; }

 protected:
  ModelTable table_;
  parallel::TpContext tp_;
  uint64_t bytes_loaded_ = 0;
  uint64_t bytes_stored_ = 0;
  std::shared_ptr<LoraTargets> lora_targets_;
};

}  // namespace tprun::models
