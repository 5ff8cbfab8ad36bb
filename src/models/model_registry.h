#pragma once
// One registry from a config's class name (diffusers' "_class_name",
// transformers' "architectures"[0]) to its model family. Each family's own
// .cpp registers itself with one line:
//
//   TPRUN_REGISTER_MODEL(FluxTransformer, FluxConfig);
//
// for a class that has `static constexpr const char* kClass`,
// `static ModelTable table_for(const Config&, const ModelOptions&)` and
// `static std::unique_ptr<M> load(WeightSource&, const nlohmann::json&,
// const std::string& config_path, const parallel::TpContext&, const ModelOptions&)`,
// with `static Config Config::from_json(const nlohmann::json&, const std::string&,
// const TensorCensus*)` (block counts checked against the census when there is one)
// and nothing else names it: inspect, init-model, forward, verify and the
// pipelines find it here. (The models library is linked whole-archive so the
// registrations are kept; see src/CMakeLists.txt.)

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/model.h"

namespace tprun::checkpoint {
class WeightSource;
}

namespace tprun::models {

class TensorCensus;

struct ModelFamily {
  // Reads the config (checked and bounded: CheckpointError naming file and
  // field; block counts against `census` when not null) and records the
  // table without touching a checkpoint.
  std::function<ModelTable(const nlohmann::json& config, const std::string& config_path, const ModelOptions&,
                           const TensorCensus* census)>
      table;
  // Validates against `source` before any weight byte is read, then loads
  // this rank's slices.
  std::function<std::unique_ptr<Model>(checkpoint::WeightSource& source, const nlohmann::json& config,
                                       const std::string& config_path, const parallel::TpContext& tp,
                                       const ModelOptions&)>
      load;
  // The layerwise-casting skip patterns the class adds (its
  // class_skip_patterns(), where it has one): what the fit planner's tables
  // need to count fp8 storage as the load does.
  std::vector<std::string> class_skip;
};

// The family of `cls`, or nullptr.
const ModelFamily* find_model_family(const std::string& cls);
// Every registered class name, sorted.
std::vector<std::string> model_family_names();

// The table of a component's config, or nullopt for a class tprun has no
// model for. With `census` (the checkpoint's tensor names) the config's block
// counts are checked against the blocks the checkpoint holds first.
std::optional<ModelTable> model_table_for(const nlohmann::json& config, const std::string& config_path,
                                          const ModelOptions& options = {}, const TensorCensus* census = nullptr);
// Loads the component `config` describes. ConfigError naming the class and
// the known ones when tprun has no model for it.
std::unique_ptr<Model> load_model(checkpoint::WeightSource& source, const nlohmann::json& config,
                                  const std::string& config_path, const parallel::TpContext& tp,
                                  const ModelOptions& options);

namespace detail {
bool register_model_family(const char* cls, ModelFamily family);
}

namespace detail {
template <class M, class = void>
struct HasClassSkip : std::false_type {};
template <class M>
struct HasClassSkip<M, std::void_t<decltype(M::class_skip_patterns())>> : std::true_type {};
}  // namespace detail

// The family of a model class with the static interface described above.
template <class M, class Config>
ModelFamily model_family() {
  ModelFamily f;
  if constexpr (detail::HasClassSkip<M>::value) f.class_skip = M::class_skip_patterns();
  f.table = [](const nlohmann::json& config, const std::string& path, const ModelOptions& o,
                const TensorCensus* census) { return M::table_for(Config::from_json(config, path, census), o); };
  f.load = [](checkpoint::WeightSource& source, const nlohmann::json& config, const std::string& path,
              const parallel::TpContext& tp, const ModelOptions& o) -> std::unique_ptr<Model> {
    return M::load(source, config, path, tp, o);
  };
  return f;
}

}  // namespace tprun::models

#define TPRUN_MODEL_CONCAT_(a, b) a##b
#define TPRUN_MODEL_CONCAT(a, b) TPRUN_MODEL_CONCAT_(a, b)
// A class that serves several config class names (one implementation
// parameterised by config): TPRUN_REGISTER_MODEL_AS("Qwen3ForCausalLM", DecoderTextEncoder, DecoderConfig);
#define TPRUN_REGISTER_MODEL_AS(name, M, Config)                                             \
  static const bool TPRUN_MODEL_CONCAT(tprun_model_registered_, __LINE__) [[maybe_unused]] = \
      ::tprun::models::detail::register_model_family(name, ::tprun::models::model_family<M, Config>())
#define TPRUN_REGISTER_MODEL(M, Config)                                                    \
  static const bool TPRUN_MODEL_CONCAT(tprun_model_registered_, __LINE__) [[maybe_unused]] = \
      ::tprun::models::detail::register_model_family(M::kClass, ::tprun::models::model_family<M, Config>())
