#include <cstdio>
#include <iostream>
#include <sstream>

#include <fmt/format.h>

#include "cli/command.h"
#include "runtime/error.h"
#include "dist/guard.h"
#include "runtime/logging.h"
#include "runtime/rank_env.h"

namespace tprun::cli {
namespace {

// Before MPI starts, only the launcher's rank 0 (or a lone process) prints
// usage text, so N ranks do not print N copies.
bool is_printing_rank() {
  try {
    auto env = rank_env_from_variables(process_env());
    return !env || env->rank == 0;
  } catch (const Error&) {
    return true;
  }
}

std::string general_help() {
  std::ostringstream out;
  out << "tprun " << TPRUN_VERSION
      << " - tensor-parallel batch generation with diffusion transformers\n\n"
         "Usage: mpirun -np N tprun <command> [options]   (or srun tprun ..., or one process)\n\n"
         "Commands:\n";
  for (const auto& c : all_commands()) out << fmt::format("  {:<14} {}\n", c.name, c.summary);
  out << "\nRun 'tprun <command> --help' for a command's options.\n";
  return out.str();
}

int usage_error(const std::string& message) {
  if (is_printing_rank()) std::fprintf(stderr, "tprun: %s\n", message.c_str());
  return exit_code::kUsage;
}

}  // namespace

const std::vector<Command>& all_commands() {
  static const std::vector<Command> commands = {
      run_command(),     generate_command(), init_model_command(), tokenize_command(), env_command(),
      inspect_command(), shard_command(),    convert_command(),    forward_command(),  verify_command(),
      merge_results_command(), bench_command(), plan_command()};
  return commands;
}

int run_cli(int argc, char** argv) {
  init_launch_logging();  // until the command's session installs its own: the rank prefix, no stray colour
  if (argc < 2) {
    if (is_printing_rank()) std::cerr << general_help();
    return exit_code::kUsage;
  }
  const std::string first = argv[1];
  if (first == "--help" || first == "-h" || first == "help") {
    if (is_printing_rank()) std::cout << general_help();
    return exit_code::kOk;
  }
  if (first == "--version") {
    if (is_printing_rank()) std::cout << "tprun " << TPRUN_VERSION << "\n";
    return exit_code::kOk;
  }
  const Command* command = nullptr;
  for (const auto& c : all_commands())
    if (c.name == first) command = &c;
  if (command == nullptr) {
    return usage_error(fmt::format("unknown command '{}'; see 'tprun --help'", first));
  }

  po::options_description desc(fmt::format("Options of 'tprun {}'", command->name));
  desc.add_options()("help,h", "show this help");
  po::positional_options_description positional;
  command->add_options(desc, positional);
  po::variables_map vm;
  const std::vector<std::string> args(argv + 2, argv + argc);
  try {
    po::store(po::command_line_parser(args).options(desc).positional(positional).run(), vm);
    if (vm.count("help")) {
      if (is_printing_rank()) {
        std::cout << fmt::format("Usage: tprun {} {}[options]\n{}\n\n", command->name,
                                 command->usage.empty() ? "" : command->usage + " ",
                                 command->summary)
                  << desc << "\n";
      }
      return exit_code::kOk;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    const std::string message =
        fmt::format("{}: {}; see 'tprun {} --help'", command->name, e.what(), command->name);
    if (command->on_option_error && is_printing_rank()) command->on_option_error(args, message);
    return usage_error(message);
  }
  return run_guarded([&] { return command->run(vm, &argc, &argv); });
}

int run_file_tool(const std::string& log_level, const std::function<int()>& body) {
  auto env = rank_env_from_variables(process_env());
  const int rank = env ? env->rank : 0;
  init_logging({rank, env ? env->world : 1, log_level, ""});
  std::streambuf* saved = nullptr;
  std::ostringstream sink;
  if (rank != 0) saved = std::cout.rdbuf(sink.rdbuf());
  int rc = exit_code::kOk;
  try {
    rc = body();
  } catch (const Error& e) {
    if (saved) std::cout.rdbuf(saved);
    rethrow_on_all_ranks(e);  // identical on every rank: a clean exit everywhere, no MPI_Abort
  }
  if (saved) std::cout.rdbuf(saved);
  return rc;
}

}  // namespace tprun::cli
