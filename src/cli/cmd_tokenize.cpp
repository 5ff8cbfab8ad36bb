// `tprun tokenize`: the ids both tokenizers of a FLUX.1 pipeline folder give a
// prompt, exactly as the pipeline passes them to the text encoders (CLIP padded
// to its model_max_length, T5 to --max-sequence-length).
#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "checkpoint/pipeline_folder.h"
#include "cli/command.h"
#include "pipelines/clip_tokenizer.h"
#include "pipelines/t5_tokenizer.h"
#include "runtime/error.h"

namespace tprun::cli {
namespace {

std::string tokenizer_dir(const checkpoint::PipelineFolder& f, const std::string& name) {
  const auto* c = f.find(name);
  if (!c) throw CheckpointError(fmt::format("{}: model_index.json names no '{}' component", f.path, name), true);
  return c->path;
}

int run_tokenize(const std::string& model, const std::string& prompt, int64_t max_len, bool json) {
  if (!checkpoint::is_pipeline_folder(model)) {
    throw ConfigError(fmt::format("--model {}: not a diffusers pipeline folder (no model_index.json)", model), true);
  }
  if (max_len < 1 || max_len > 512) {
    throw ConfigError(fmt::format("--max-sequence-length must be in [1, 512], got {}", max_len), true);
  }
  const auto folder = checkpoint::open_pipeline_folder(model);
  pipelines::ClipTokenizer clip(tokenizer_dir(folder, "tokenizer"));
  pipelines::T5Tokenizer t5(tokenizer_dir(folder, "tokenizer_2"));
  const auto a = clip.encode(prompt, clip.model_max_length());
  const auto b = t5.encode(prompt, max_len);
  if (json) {
    nlohmann::json out = {{"tokenizer", a.input_ids}, {"tokenizer_2", b.input_ids}};
    std::cout << out.dump() << "\n";
  } else {
    auto used = [](const pipelines::TokenizerOutput& o) {
      int64_t n = 0;
      for (int64_t m : o.attention_mask) n += m;
      return n;
    };
    std::cout << fmt::format("tokenizer (CLIP, {} ids, {} used, {} before truncation):\n  {}\n", a.input_ids.size(),
                             used(a), a.untruncated_length, fmt::join(a.input_ids, " "));
    std::cout << fmt::format("tokenizer_2 (T5, {} ids, {} used, {} before truncation):\n  {}\n", b.input_ids.size(),
                             used(b), b.untruncated_length, fmt::join(b.input_ids, " "));
    if (a.untruncated_length > static_cast<int64_t>(a.input_ids.size()) ||
        b.untruncated_length > static_cast<int64_t>(b.input_ids.size())) {
      std::cout << "note: the prompt was truncated (as FluxPipeline truncates it)\n";
    }
  }
  return exit_code::kOk;
}

}  // namespace

Command tokenize_command() {
  Command c;
  c.name = "tokenize";
  c.summary = "both tokenizers' ids for a prompt, as the pipeline passes them: --model DIR --prompt TEXT [--json]";
  c.add_options = [](po::options_description& desc, po::positional_options_description&) {
    po::options_description o("Tokenize");
    o.add_options()
        ("model", po::value<std::string>(), "diffusers FluxPipeline folder (tokenizer/, tokenizer_2/)")
        ("prompt", po::value<std::string>(), "the prompt")
        ("max-sequence-length", po::value<int64_t>()->default_value(512), "T5 length (FluxPipeline's default 512)")
        ("json", po::bool_switch(), "one JSON object {\"tokenizer\": [ids], \"tokenizer_2\": [ids]}")
        ("log-level", po::value<std::string>()->default_value(""), "trace|debug|info|warn|error");
    desc.add(o);
  };
  c.run = [](const po::variables_map& vm, int*, char***) {
    return run_file_tool(vm["log-level"].as<std::string>(), [&] {
      if (!vm.count("model")) throw ConfigError("--model is required", true);
      if (!vm.count("prompt")) throw ConfigError("--prompt is required", true);
      return run_tokenize(vm["model"].as<std::string>(), vm["prompt"].as<std::string>(),
                          vm["max-sequence-length"].as<int64_t>(), vm["json"].as<bool>());
    });
  };
  return c;
}

}  // namespace tprun::cli
