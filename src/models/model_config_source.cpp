// The parts of models/model_config.h that read a checkpoint: a component's
// config.json and the census of its tensor names. (model_config.cpp itself
// stays free of checkpoint readers: the fuzz_model_config target builds it.)
#include "checkpoint/component_checkpoint.h"
#include "checkpoint/hdf5_source.h"
#include "checkpoint/weight_source.h"
#include "models/model_config.h"

namespace tprun::models {

TensorCensus census_of(const checkpoint::WeightSource& source) {
  return TensorCensus(source.tensor_names(), source.path());
}

nlohmann::json read_component_config(const std::string& path, std::string* config_path) {
  if (checkpoint::is_hdf5_file(path)) {
    if (config_path) *config_path = path + " (config attribute)";
    return checkpoint::hdf5_config(path);
  }
  auto ck = checkpoint::ComponentCheckpoint::open(path);
  if (config_path) *config_path = path + "/config.json";
  return ck.config();
}

}  // namespace tprun::models
