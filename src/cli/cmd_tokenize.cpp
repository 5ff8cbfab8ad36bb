// `tprun tokenize`: the ids a pipeline folder's tokenizers give a prompt,
// exactly as the pipeline passes them to its text encoders (each pipeline
// family registers how: FLUX.1 CLIP + T5, FLUX.2 its chat template, Qwen-Image its
// prompt template).
#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "pipelines/pipeline.h"
#include "pipelines/request_checks.h"
#include "runtime/error.h"

namespace tprun::cli {
namespace {

int run_tokenize(const std::string& model, const std::string& prompt, int64_t max_len, bool json) {
  // The bound every request shares, then the pipeline's own limit (from its configs).
  pipelines::GenerationRequest r;
  r.max_sequence_length = max_len;
  pipelines::check_request_options(r, pipelines::request_options(model), [](const std::string&, const std::string& what) {
    throw ConfigError(fmt::format("--max-sequence-length: {}", what), true);
  });
  const auto all = pipelines::tokenize_prompt(model, prompt, max_len);
  if (json) {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& t : all) out[t.component] = t.output.input_ids;
    std::cout << out.dump() << "\n";
    return exit_code::kOk;
  }
  bool truncated = false;
  for (const auto& t : all) {
    int64_t used = 0;
    for (int64_t m : t.output.attention_mask) used += m;
    std::cout << fmt::format("{} ({}, {} ids, {} used, {} before truncation):\n  {}\n", t.component, t.description,
                             t.output.input_ids.size(), used, t.output.untruncated_length,
                             fmt::join(t.output.input_ids, " "));
    truncated = truncated || t.output.untruncated_length > static_cast<int64_t>(t.output.input_ids.size());
  }
  if (truncated) std::cout << "note: the prompt was truncated (as the pipeline truncates it)\n";
  return exit_code::kOk;
}

}  // namespace

Command tokenize_command() {
  Command c;
  c.name = "tokenize";
  c.summary = "the tokenizers' ids for a prompt, as the pipeline passes them: --model DIR --prompt TEXT [--json]";
  c.add_options = [](po::options_description& desc, po::positional_options_description&) {
    po::options_description o("Tokenize");
    o.add_options()
        ("model", po::value<std::string>(), "diffusers pipeline folder (FluxPipeline: tokenizer/ and tokenizer_2/; "
                                            "FLUX.2: tokenizer/ with its chat template; "
                                            "QwenImagePipeline: tokenizer/ with its prompt template)")
        ("prompt", po::value<std::string>(), "the prompt")
        ("max-sequence-length", po::value<int64_t>()->default_value(512),
         "text-encoder length (T5 for FLUX.1, the chat-templated prompt for FLUX.2 and Qwen-Image; default 512; "
         "at most the pipeline's limit: 512, QwenImagePipeline 1024)")
        ("json", po::bool_switch(), "one JSON object {\"tokenizer\": [ids], ...}, a key per tokenizer component")
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
