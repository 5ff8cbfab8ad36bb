// `tprun merge-results --out DIR CHUNK...`: merges the outputs of job chunks
// (jobs/merge_results.h). A file tool: one process.
#include <iostream>

#include <fmt/format.h>

#include "cli/command.h"
#include "jobs/merge_results.h"
#include "runtime/error.h"
#include "runtime/logging.h"

namespace tprun::cli {

Command merge_results_command() {
  Command c;
  c.name = "merge-results";
  c.summary = "merge the outputs of job chunks (tprun run --shard I/N): --out DIR CHUNK_DIR...";
  c.usage = "CHUNK_DIR...";
  c.add_options = [](po::options_description& desc, po::positional_options_description& pos) {
    po::options_description o("Merge");
    o.add_options()
        ("chunks", po::value<std::vector<std::string>>()->composing(), "chunk output folders (each with results.jsonl)")
        ("out", po::value<std::string>(), "merged folder: results.jsonl, images/, store/ (hard links where possible)")
        ("log-level", po::value<std::string>()->default_value(""), "trace|debug|info|warn|error");
    desc.add(o);
    pos.add("chunks", -1);
  };
  c.run = [](const po::variables_map& vm, int*, char***) {
    init_logging({0, 1, vm["log-level"].as<std::string>(), ""});
    if (!vm.count("out")) throw ConfigError("--out is required", true);
    if (!vm.count("chunks")) throw ConfigError("name the chunk folders to merge", true);
    const auto s = jobs::merge_results(vm["chunks"].as<std::vector<std::string>>(), vm["out"].as<std::string>());
    std::cout << fmt::format("merged {} chunk(s) into {}: {} done, {} failed, {} file(s) linked\n", s.chunks,
                             vm["out"].as<std::string>(), s.done, s.failed, s.files);
    return 0;
  };
  return c;
}

}  // namespace tprun::cli
