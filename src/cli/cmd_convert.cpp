// `tprun convert SRC DST.h5`: a component's safetensors weights into tprun's
// HDF5 checkpoint format (checkpoint/hdf5_writer.h). One process does the
// work; under mpirun the other ranks have nothing to do and exit.
#include <chrono>
#include <filesystem>
#include <iostream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "checkpoint/component_checkpoint.h"
#include "checkpoint/hdf5_writer.h"
#include "checkpoint/pipeline_folder.h"
#include "cli/command.h"
#include "jobs/output_folder.h"
#include "runtime/error.h"
#include "runtime/logging.h"
#include "runtime/rank_env.h"
#include "runtime/size_string.h"

namespace tprun::cli {
namespace {

namespace fs = std::filesystem;
using namespace tprun::checkpoint;

struct ConvertOptions {
  std::string src, dst, variant;
  int tp_chunks = 8;
  bool force = false;
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

int run_convert(const ConvertOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  if (is_pipeline_folder(o.src)) {
    throw ConfigError(fmt::format("{} is a pipeline folder (it has model_index.json); name one component folder "
                                  "(e.g. {}/transformer)",
                                  o.src, o.src),
                      true);
  }
  if (!ends_with(o.dst, ".h5") && !ends_with(o.dst, ".hdf5"))
    throw ConfigError(fmt::format("{}: the destination must be an .h5 (or .hdf5) file", o.dst), true);
  if (o.tp_chunks < 1) throw ConfigError(fmt::format("--tp-chunks must be at least 1 (got {})", o.tp_chunks), true);
  std::error_code ec;
  if (fs::is_directory(o.dst, ec))
    throw ConfigError(fmt::format("{} is a folder; name the .h5 file to write", o.dst), true);
  if (!o.force && fs::exists(o.dst, ec))
    throw ConfigError(fmt::format("{}: already exists; pass --force to overwrite", o.dst), true);
  jobs::check_output_path(o.dst, "DST", {{"the source", o.src}}, jobs::OutputKind::Forced);

  const ComponentCheckpoint ck = ComponentCheckpoint::open(o.src, o.variant);
  size_t tensors = 0;
  for (const auto& f : ck.files()) tensors += f.tensors.size();
  spdlog::info("converting {} ({} tensors, {}) to {}, chunked for tp dividing {}", o.src, tensors,
               format_size(ck.total_bytes()), o.dst, o.tp_chunks);
  Hdf5WriteOptions w;
  w.tp_chunks = o.tp_chunks;
  w.overwrite = o.force;
  convert_to_hdf5(ck, o.dst, w);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << fmt::format("converted {} tensors ({}) from {} to {} in {:.1f} s\n", tensors,
                           format_size(ck.total_bytes()), o.src, o.dst, secs);
  return 0;
}

}  // namespace

Command convert_command() {
  Command c;
  c.name = "convert";
  c.summary = "convert a component's safetensors weights to tprun's HDF5 format (one dataset per tensor)";
  c.usage = "SRC DST.h5";
  c.add_options = [](po::options_description& desc, po::positional_options_description& pos) {
    po::options_description o("Convert");
    o.add_options()
        ("src", po::value<std::string>()->required(),
         "component folder (config.json + safetensors) or .safetensors file")
        ("dst", po::value<std::string>()->required(), "the .h5 file to write")
        ("variant", po::value<std::string>()->default_value(""), "read this weight variant, e.g. fp16")
        ("tp-chunks", po::value<int>()->default_value(8),
         "chunks per split dimension: TP slices for any tp dividing it are whole chunks")
        ("force", po::bool_switch(), "overwrite DST if it exists")
        ("log-level", po::value<std::string>()->default_value(""),
         "trace|debug|info|warn|error|critical|off (default: $SPDLOG_LEVEL, else info)");
    desc.add(o);
    pos.add("src", 1).add("dst", 1);
  };
  c.run = [](const po::variables_map& vm, int*, char***) {
    const std::string level = vm["log-level"].as<std::string>();
    if (!level.empty()) check_log_level(level, "--log-level");
    auto env = rank_env_from_variables(process_env());
    init_logging({env ? env->rank : 0, env ? env->world : 1, level, ""});
    ConvertOptions o;
    o.src = vm["src"].as<std::string>();
    o.dst = vm["dst"].as<std::string>();
    o.variant = vm["variant"].as<std::string>();
    o.tp_chunks = vm["tp-chunks"].as<int>();
    o.force = vm["force"].as<bool>();
    if (env && env->rank != 0) return 0;  // one writer; the others have nothing to do
    return run_convert(o);
  };
  return c;
}

}  // namespace tprun::cli
