#include "cli/flux_args.h"

#include <filesystem>

#include <fmt/format.h>

#include "checkpoint/hdf5_source.h"
#include "checkpoint/pipeline_folder.h"
#include "checkpoint/torch_dtype.h"
#include "cli/component_forward.h"
#include "runtime/error.h"

namespace tprun::cli {

namespace po = boost::program_options;

void add_flux_options(po::options_description& desc, bool with_component) {
  po::options_description m("Model");
  m.add_options()
      ("model", po::value<std::string>(), "component folder, HDF5 file, or pipeline folder (with --component)");
  if (with_component) {
    m.add_options()("component", po::value<std::string>()->default_value("transformer"),
                    "component: transformer | text_encoder | text_encoder_2 | vae_decoder | vae_encoder (the last two read vae/); "
                    "with a component folder it says what the folder holds");
  }
  m.add_options()
      ("variant", po::value<std::string>()->default_value(""), "weights variant (fp16: *.fp16.safetensors)")
      ("dtype", po::value<std::string>()->default_value("fp32"), "compute dtype: fp32 | bf16 | fp16")
      ("shard-modulation", po::bool_switch(),
       "also shard the AdaLN modulation linears (rowwise_split_input; one more AllReduce per forward)");
  desc.add(m);
}

FluxArgs flux_args_from(const po::variables_map& vm) {
  FluxArgs a;
  if (!vm.count("model")) throw ConfigError("--model is required", true);
  a.model = vm["model"].as<std::string>();
  if (vm.count("component")) a.component = vm["component"].as<std::string>();
  a.variant = vm["variant"].as<std::string>();
  a.dtype = vm["dtype"].as<std::string>();
  (void)checkpoint::parse_compute_dtype(a.dtype, "--dtype");  // ConfigError naming the option
  a.shard_modulation = vm["shard-modulation"].as<bool>();
  if (!std::filesystem::exists(a.model)) throw ConfigError(fmt::format("--model {}: no such file or folder", a.model), true);
  a.path = a.model;
  if (checkpoint::is_pipeline_folder(a.model)) {
    auto folder = checkpoint::open_pipeline_folder(a.model);
    const auto* c = folder.find(component_folder(a.component));
    if (!c) {
      throw ConfigError(fmt::format("--component {}: pipeline {} has no such component", a.component, a.model), true);
    }
    a.path = c->path;
  }
  return a;
}

models::FluxTransformer load_flux(const FluxArgs& a, const parallel::TpContext& tp, const std::string& device) {
  std::string config_path;
  const auto config = models::read_component_config(a.path, &config_path);
  const std::string cls = config.value("_class_name", std::string());
  if (cls != "FluxTransformer2DModel") {
    throw ConfigError(fmt::format("{}: _class_name is '{}'; tprun forward runs FluxTransformer2DModel only",
                                  config_path, cls),
                      true);
  }
  auto source = checkpoint::open_weight_source(a.path, a.variant);
  models::FluxLoadOptions o;
  o.dtype = a.dtype;
  o.device = device;
  o.shard_modulation = a.shard_modulation;
  return models::FluxTransformer::load(*source, config, config_path, tp, o);
}

}  // namespace tprun::cli
