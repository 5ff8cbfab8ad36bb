#pragma once
// Options and loading shared by `tprun forward` and `tprun verify`: which
// model (a component folder, an HDF5 file, or a pipeline folder plus
// --component), which compute dtype, and the Flux transformer loaded for a TP
// position.

#include <string>

#include <boost/program_options.hpp>

#include "models/flux_transformer.h"
#include "parallel/tp_context.h"

namespace tprun::cli {

struct FluxArgs {
  std::string model;
  std::string component = "transformer";
  std::string variant;
  std::string dtype = "fp32";
  bool shard_modulation = false;
  std::string path;  // resolved component path
};

void add_flux_options(boost::program_options::options_description& desc, bool with_component);
// ConfigError (all ranks) for a missing model, an unknown component, a bad dtype.
FluxArgs flux_args_from(const boost::program_options::variables_map& vm);

// Loads the transformer at `tp` on `device` (validation first: errors name
// the tensor or the numbers).
models::FluxTransformer load_flux(const FluxArgs& args, const parallel::TpContext& tp, const std::string& device);

}  // namespace tprun::cli
