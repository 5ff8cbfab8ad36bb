#pragma once
// Options and loading shared by `tprun forward`, `tprun verify` and `tprun
// bench step`: which model component (a component folder, an HDF5 file, or a
// pipeline folder plus --component), which compute dtype, and the component
// loaded through the model registry for a TP position.

#include <memory>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "memory/memory_options.h"
#include "models/model.h"
#include "parallel/tp_context.h"

namespace tprun::cli {

struct ModelArgs {
  std::string model;
  // A pipeline's component folder ("transformer", "text_encoder", ...);
  // "vae_decoder" / "vae_encoder" read vae/ and load that part.
  std::string component = "transformer";
  std::string variant;
  std::string dtype = "fp32";
  bool shard_modulation = false;
  std::string path;  // resolved component path
  std::string part;  // ModelOptions::part ("decoder" / "encoder" for the VAE halves)
  std::vector<int64_t> hidden_layers;  // ModelOptions::hidden_layers (--hidden-layers)
  memory::MemoryOptions memory;        // --memory KEY=VALUE
};

void add_model_options(boost::program_options::options_description& desc, bool with_component);
// ConfigError (all ranks) for a missing model, an unknown component, a bad dtype.
ModelArgs model_args_from(const boost::program_options::variables_map& vm);

// "9,18,27" -> {9, 18, 27} (the --hidden-layers value); ConfigError naming
// `option` for anything else.
std::vector<int64_t> parse_hidden_layers(const std::string& text, const std::string& option = "--hidden-layers");

// Loads the component at `tp` on `device` through the model registry
// (validation first: errors name the tensor or the numbers). ConfigError
// for a class tprun has no model for.
std::unique_ptr<models::Model> load_component(const ModelArgs& args, const parallel::TpContext& tp,
                                              const std::string& device);

}  // namespace tprun::cli
