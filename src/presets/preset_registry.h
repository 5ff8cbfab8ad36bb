#pragma once
// The architectures `tprun init-model --arch` knows. A pipeline family
// registers its own from its presets .cpp with TPRUN_REGISTER_PRESET, as it
// registers its pipeline (pipelines/pipeline.h): the command names no
// family, and its --arch help and unknown-arch message come from here.
//
// Contract: `resolve` runs on every rank (a bad preset is one error on all of
// them) before any folder is touched; `write` then runs on one rank.

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "presets/preset_writer.h"

namespace tprun::presets {

// What a writer reports for init-model's summary line.
struct WrittenPreset {
  InitModelSummary summary;
  std::string details;  // the family's part: "CLIP vocabulary 965, T5 tokenizer 600"
};

// One preset of one architecture, checked and ready to write.
struct ResolvedPreset {
  std::string what;  // "FLUX.1 pipeline 'tiny'", as in "wrote <what> (seed 0) to DIR"
  // Writes the folder `dir` atomically (write_output_folder), refusing a
  // non-empty one unless `force`.
  std::function<WrittenPreset(const std::string& dir, uint64_t seed, bool force)> write;
};

struct PresetArch {
  std::string family;  // "FLUX.1": --arch lists families by name, a family's archs in registration order
  std::string arch;    // the --arch value: "flux"
  std::string help;    // "FLUX.1, FluxPipeline": --arch's help shows "flux (FLUX.1, FluxPipeline)"
  std::vector<std::string> preset_names;  // "tiny", "small"
  // ConfigError naming the known presets for an unknown `preset`.
  std::function<ResolvedPreset(const std::string& arch, const std::string& preset)> resolve;
};

// A ResolvedPreset that writes `preset` with `write` (the family's
// write_*_pipeline) and describes its tokenizers with `details(summary)`.
template <typename Preset>
ResolvedPreset resolved_preset(std::string what, Preset preset,
                               InitModelSummary (*write)(const std::string&, const Preset&, uint64_t, bool),
                               std::string (*details)(const InitModelSummary&)) {
  return {std::move(what), [preset = std::move(preset), write, details](const std::string& dir, uint64_t seed,
                                                                        bool force) {
            WrittenPreset w;
            w.summary = write(dir, preset, seed, force);
            w.details = details(w.summary);
            return w;
          }};
}

// Every registered architecture, in --arch's order.
std::vector<PresetArch> preset_archs();
// nullptr for an architecture nobody registered.
const PresetArch* find_preset_arch(const std::string& arch);

namespace detail {
bool register_preset(PresetArch arch);
}

}  // namespace tprun::presets

#define TPRUN_PRESET_CONCAT_(a, b) a##b
#define TPRUN_PRESET_CONCAT(a, b) TPRUN_PRESET_CONCAT_(a, b)
// In the family's presets .cpp, once per architecture:
//   TPRUN_REGISTER_PRESET({"FLUX.1", "flux", "FLUX.1, FluxPipeline", flux_preset_names(), resolve_flux});
#define TPRUN_REGISTER_PRESET(...)                                                                   \
  static const bool TPRUN_PRESET_CONCAT(tprun_preset_registered_, __LINE__) [[maybe_unused]] = \
      ::tprun::presets::detail::register_preset(::tprun::presets::PresetArch __VA_ARGS__)
