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
        ("chunks", po::value<std::vector<std::string>>()->composing(),
         "chunk output folders (each with results.jsonl; folders named shard-I-of-N must be every chunk of the "
         "array unless --partial). Each is checked before anything is written: record paths plain and inside the "
         "chunk, no symlink leading out, every PNG whole (signature to IEND, every CRC), no run still writing it")
        ("out", po::value<std::string>(),
         "merged folder: results.jsonl, images/, store/ (hard links where possible); not a chunk nor inside one "
         "(the folder holding the chunks is fine), no results.jsonl but one merge-results wrote. Written all or "
         "nothing: a failed merge leaves it as it was")
        ("partial", po::bool_switch(),
         "merge only some chunks of a shard-I-of-N array (a warning names the missing ones); without it a "
         "missing chunk is an error")
        ("log-level", po::value<std::string>()->default_value(""), "trace|debug|info|warn|error");
    desc.add(o);
    pos.add("chunks", -1);
  };
  c.run = [](const po::variables_map& vm, int*, char***) {
    init_logging({0, 1, vm["log-level"].as<std::string>(), ""});
    if (!vm.count("out")) throw ConfigError("--out is required", true);
    if (!vm.count("chunks")) throw ConfigError("name the chunk folders to merge", true);
    jobs::MergeOptions options;
    options.partial = vm["partial"].as<bool>();
    const auto s =
        jobs::merge_results(vm["chunks"].as<std::vector<std::string>>(), vm["out"].as<std::string>(), options);
    std::cout << fmt::format("merged {} chunk(s) into {}: {} done, {} failed, {} file(s) linked\n", s.chunks,
                             vm["out"].as<std::string>(), s.done, s.failed, s.files);
    return 0;
  };
  return c;
}

}  // namespace tprun::cli
