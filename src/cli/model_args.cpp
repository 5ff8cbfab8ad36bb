#include "cli/model_args.h"

#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>

#include "checkpoint/hdf5_source.h"
#include "checkpoint/pipeline_folder.h"
#include "checkpoint/torch_dtype.h"
#include "cli/memory_args.h"
#include "models/model_config.h"
#include "models/model_registry.h"
#include "runtime/error.h"

namespace tprun::cli {

namespace po = boost::program_options;

void add_model_options(po::options_description& desc, bool with_component) {
  po::options_description m("Model");
  m.add_options()
      ("model", po::value<std::string>(), "component folder, HDF5 file, or pipeline folder (with --component)");
  if (with_component) {
    m.add_options()("component", po::value<std::string>()->default_value("transformer"),
                    "a pipeline's component: transformer | text_encoder | text_encoder_2 | vae_decoder | "
                    "vae_encoder (the last two read vae/ and load that half); with a component folder, "
                    "vae_decoder / vae_encoder choose the half");
  }
  m.add_options()
      ("variant", po::value<std::string>()->default_value(""), "weights variant (fp16: *.fp16.safetensors)")
      ("dtype", po::value<std::string>()->default_value("fp32"), "compute dtype: fp32 | bf16 | fp16")
      ("shard-modulation", po::bool_switch(),
       "also shard the AdaLN modulation linears (rowwise_split_input; one more AllReduce per forward)")
      ("hidden-layers", po::value<std::string>(),
       "decoder text encoders: the hidden states to return, as transformers numbers output.hidden_states "
       "(e.g. 9,18,27 for FLUX.2 klein, 10,20,30 for dev); later layers are neither loaded nor run");
  desc.add(m);
  add_memory_option(desc);
}

std::vector<int64_t> parse_hidden_layers(const std::string& text, const std::string& option) {
  std::vector<int64_t> layers;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(start, end - start);
    char* stop = nullptr;
    const long v = std::strtol(item.c_str(), &stop, 10);
    if (item.empty() || *stop != '\0' || v < 0 || v > 100000) {
      throw ConfigError(fmt::format("{} '{}': expected layer numbers like 9,18,27", option, text), true);
    }
    layers.push_back(v);
    start = end + 1;
  }
  return layers;
}

ModelArgs model_args_from(const po::variables_map& vm) {
  ModelArgs a;
  if (!vm.count("model")) throw ConfigError("--model is required", true);
  a.model = vm["model"].as<std::string>();
  if (vm.count("component")) a.component = vm["component"].as<std::string>();
  a.variant = vm["variant"].as<std::string>();
  a.dtype = vm["dtype"].as<std::string>();
  (void)checkpoint::parse_compute_dtype(a.dtype, "--dtype");  // ConfigError naming the option
  a.shard_modulation = vm["shard-modulation"].as<bool>();
  if (vm.count("hidden-layers")) a.hidden_layers = parse_hidden_layers(vm["hidden-layers"].as<std::string>());
  a.memory = memory_from(vm);
  if (!std::filesystem::exists(a.model)) throw ConfigError(fmt::format("--model {}: no such file or folder", a.model), true);
  std::string folder = a.component;
  if (a.component == "vae_decoder" || a.component == "vae_encoder") {
    folder = "vae";
    a.part = a.component == "vae_decoder" ? "decoder" : "encoder";
  }
  a.path = a.model;
  if (checkpoint::is_pipeline_folder(a.model)) {
    auto pipeline = checkpoint::open_pipeline_folder(a.model);
    const auto* c = pipeline.find(folder);
    if (!c) {
      throw ConfigError(fmt::format("--component {}: pipeline {} has no such component", a.component, a.model), true);
    }
    a.path = c->path;
  }
  return a;
}

std::unique_ptr<models::Model> load_component(const ModelArgs& a, const parallel::TpContext& tp,
                                              const std::string& device) {
  std::string config_path;
  const auto config = models::read_component_config(a.path, &config_path);
  auto source = checkpoint::open_weight_source(a.path, a.variant);
  models::ModelOptions o;
  o.memory = a.memory;
  spdlog::info("{}", memory::describe(a.memory));
  o.dtype = a.dtype;
  o.device = device;
  o.shard_modulation = a.shard_modulation;
  o.part = a.part;
  o.hidden_layers = a.hidden_layers;
  return models::load_model(*source, config, config_path, tp, o);
}

}  // namespace tprun::cli
