#pragma once
// The adapters a pipeline runs with: every adapter file a job names, mapped
// (lora_file_map.h) and read as this rank's slices (lora_slices.h) before any
// compute, and the set in force for the batch at hand.
//
// Two ways to apply, chosen once per run (docs/lora.md has the measurements):
//   runtime  each adapted layer adds scale (x A^T) B^T from its slot
//            (parallel/lora_slot.h). Switching sets refills the slots; the
//            base weights are never touched, so the base model after a
//            switch back is the base model, bit for bit.
//   fused    W += scale B A (in fp32, rounded once to the layer's dtype) into
//            each rank's weight slice at prepare: no per-step cost. Only for a
//            run with one adapter set, whose weights are kept resident in the
//            compute dtype (not fp8-stored, not offloaded, not staged).
//   auto     fused where it may be, else runtime.
// Every rank of a TP group prepares and activates the same sets in the same
// order (batches are the same on every rank).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lora/lora_choice.h"
#include "models/model.h"

namespace tprun::lora {

enum class LoraApply { Auto, Fused, Runtime };
// "auto" | "fused" | "runtime"; ConfigError naming `where` otherwise.
LoraApply parse_lora_apply(const std::string& value, const std::string& where);
const char* lora_apply_name(LoraApply apply);

// A component adapters may reach: its name in the pipeline, the loaded
// model, its config.json, and key prefixes the pipeline drops as diffusers
// does (FLUX.1's T5: "text_encoder_2.").
struct LoraComponent {
  std::string component;
  const models::Model* model = nullptr;
  const nlohmann::json* config = nullptr;
  std::vector<std::string> dropped_prefixes;
  // Loaded again during the run (a Wan expert held one stage at a time):
  // its adapters are applied at run time, never fused.
  bool reloads = false;
};

struct LoraStats {
  int64_t files = 0;
  uint64_t bytes_read = 0;      // adapter bytes read from files, this rank
  uint64_t bytes_resident = 0;  // adapter slices kept, this rank (0 once fused)
  int64_t switches = 0;         // sets put in force after the first
  bool fused = false;
  std::string why;              // how the apply mode was chosen
};

class LoraAdapters {
 public:
  explicit LoraAdapters(std::vector<LoraComponent> components);
  ~LoraAdapters();
  LoraAdapters(const LoraAdapters&) = delete;
  LoraAdapters& operator=(const LoraAdapters&) = delete;

  // Maps and reads every file of `sets` (distinct sets a run will use, "[]"
  // among them where some requests take none), then chooses the apply mode
  // and, fused, fuses. Errors name the file and key (CheckpointError) or
  // the setting (ConfigError), alike on every rank, before any compute.
  // Called once, before the first activate.
  void prepare(const std::vector<std::vector<LoraChoice>>& sets, bool strict, LoraApply apply);
  // Puts `set` in force for the next forwards (nothing to do when it is).
  // A set whose files were not prepared is prepared first (runtime).
  void activate(const std::vector<LoraChoice>& set);
  // A component's model was loaded again (a Wan expert held one stage at a
  // time): the set in force goes onto its layers.
  void rebind(const std::string& component, const models::Model* model);
  // Whether any prepared file adapts `component` (a text encoder's adapters
  // change its embeddings: caches must key on the set).
  bool adapts(const std::string& component) const;
  LoraStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tprun::lora
