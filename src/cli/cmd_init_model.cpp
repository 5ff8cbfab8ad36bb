// `tprun init-model DIR --arch flux|flux2-klein|flux2-dev`: a complete diffusers-layout pipeline
// folder with random weights and tokenizers learned from the bundled corpus,
// for demos and tests without a download.
#include <chrono>
#include <iostream>

#include <fmt/format.h>

#include "cli/command.h"
#include "presets/flux2_presets.h"
#include "presets/flux_presets.h"
#include "runtime/error.h"
#include "runtime/logging.h"
#include "runtime/rank_env.h"
#include "runtime/size_string.h"

namespace tprun::cli {

Command init_model_command() {
  Command c;
  c.name = "init-model";
  c.summary = "write a pipeline folder with random weights and its own tokenizers (no download)";
  c.usage = "DIR";
  c.add_options = [](po::options_description& desc, po::positional_options_description& pos) {
    po::options_description o("Init model");
    o.add_options()
        ("dir", po::value<std::string>()->required(), "output folder (diffusers layout)")
        ("arch", po::value<std::string>()->required(),
         "pipeline architecture: flux (FLUX.1, FluxPipeline), flux2-klein (Flux2KleinPipeline, Qwen3 text "
         "encoder), flux2-dev (Flux2Pipeline, Mistral3 text encoder)")
        ("preset", po::value<std::string>()->default_value("tiny"), "model sizes: tiny or small")
        ("seed", po::value<uint64_t>()->default_value(0), "seed of the random weights")
        ("force", po::bool_switch(), "replace DIR when it exists and is not empty");
    desc.add(o);
    pos.add("dir", 1);
  };
  c.run = [](const po::variables_map& vm, int*, char***) {
    auto env = rank_env_from_variables(process_env());
    init_logging({env ? env->rank : 0, env ? env->world : 1, "", ""});
    const std::string dir = vm["dir"].as<std::string>(), arch = vm["arch"].as<std::string>();
    const std::string preset = vm["preset"].as<std::string>();
    const uint64_t seed = vm["seed"].as<uint64_t>();
    presets::InitModelSummary s;
    std::string what;
    const auto start = std::chrono::steady_clock::now();
    try {
      if (arch == "flux") {
        const auto p = presets::flux_preset(preset);
        if (env && env->rank != 0) return 0;  // one writer; the others have nothing to do
        s = presets::write_flux_pipeline(dir, p, seed, vm["force"].as<bool>());
        what = fmt::format("FLUX.1 pipeline '{}'", preset);
      } else if (arch == "flux2-klein" || arch == "flux2-dev") {
        const auto p = presets::flux2_preset(arch, preset);
        if (env && env->rank != 0) return 0;
        s = presets::write_flux2_pipeline(dir, p, seed, vm["force"].as<bool>());
        what = fmt::format("FLUX.2 {} pipeline '{}'", p.klein ? "[klein]" : "[dev]", preset);
      } else {
        throw ConfigError(fmt::format("--arch '{}' is not known (flux, flux2-klein, flux2-dev)", arch));
      }
    } catch (const Error& e) {
      rethrow_on_all_ranks(e);
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cout << fmt::format("wrote {} (seed {}) to {}: {} tensors, {}; ", what, seed, dir, s.tensors,
                             format_size(static_cast<uint64_t>(s.bytes)));
    if (arch == "flux") {
      std::cout << fmt::format("CLIP vocabulary {}, T5 tokenizer {}", s.clip_vocab_size, s.t5_tokenizer_length);
    } else {
      std::cout << fmt::format("text vocabulary {}", s.text_vocab_size);
    }
    std::cout << fmt::format(" in {:.1f} s\n", secs);
    return 0;
  };
  return c;
}

}  // namespace tprun::cli
