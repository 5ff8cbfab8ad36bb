// `tprun shard SRC DST`: re-shard a component's safetensors weights.
#include <chrono>
#include <iostream>

#include <fmt/format.h>

#include "checkpoint/reshard.h"
#include "cli/command.h"
#include "jobs/output_folder.h"
#include "runtime/error.h"
#include "runtime/logging.h"
#include "runtime/rank_env.h"
#include "runtime/size_string.h"

namespace tprun::cli {

Command shard_command() {
  Command c;
  c.name = "shard";
  c.summary = "re-shard a component's safetensors weights (diffusers file names and index)";
  c.usage = "SRC DST";
  c.add_options = [](po::options_description& desc, po::positional_options_description& pos) {
    po::options_description o("Shard");
    o.add_options()
        ("src", po::value<std::string>()->required(), "component folder or .safetensors file")
        ("dst", po::value<std::string>()->required(), "output folder")
        ("max-shard-size", po::value<std::string>()->default_value("5GB"), "largest shard: 5GB, 500MB, 10GiB, ...")
        ("variant", po::value<std::string>()->default_value(""), "read and write this weight variant, e.g. fp16")
        ("force", po::bool_switch(), "overwrite existing files in DST");
    desc.add(o);
    pos.add("src", 1).add("dst", 1);
  };
  c.run = [](const po::variables_map& vm, int*, char***) {
    auto env = rank_env_from_variables(process_env());
    init_logging({env ? env->rank : 0, env ? env->world : 1, "", ""});
    const std::string src = vm["src"].as<std::string>(), dst = vm["dst"].as<std::string>();
    checkpoint::ReshardOptions o;
    o.variant = vm["variant"].as<std::string>();
    o.max_shard_bytes = parse_size(vm["max-shard-size"].as<std::string>(), "--max-shard-size");
    o.force = vm["force"].as<bool>();
    jobs::check_output_path(dst, "DST", {{"the source", src}}, jobs::OutputKind::Folder);
    if (env && env->rank != 0) return 0;  // one writer; the others have nothing to do
    const auto start = std::chrono::steady_clock::now();
    checkpoint::ReshardSummary r;
    try {
      r = checkpoint::reshard_component(src, dst, o);
    } catch (const Error& e) {
      rethrow_on_all_ranks(e);
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cout << fmt::format("wrote {} shard(s) of at most {} ({} tensors, {}) to {} in {:.1f} s\n", r.shards,
                             format_size(o.max_shard_bytes), r.tensors, format_size(r.bytes), dst, secs);
    return 0;
  };
  return c;
}

}  // namespace tprun::cli
