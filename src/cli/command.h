#pragma once
// A tprun subcommand: its name, one-line summary, options and body. The CLI
// (cli.cpp) parses argv with Boost.Program_options and dispatches.

#include <functional>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

namespace tprun::cli {

namespace po = boost::program_options;

struct Command {
  std::string name;
  std::string summary;
  std::string usage;  // positional part, e.g. "collectives"
  std::function<void(po::options_description&, po::positional_options_description&)> add_options;
  // argc/argv are the process's (for MPI_Init); returns the exit code.
  std::function<int(const po::variables_map&, int* argc, char*** argv)> run;
  // Optional: told an option error (the command's arguments, the message)
  // before the usage exit (2), on the printing rank; `plan --json` prints it as JSON.
  std::function<void(const std::vector<std::string>& args, const std::string& message)> on_option_error;
};

// Every subcommand, in the order `tprun --help` lists them.
const std::vector<Command>& all_commands();

// Defined next to each command.
Command env_command();
Command bench_command();
Command inspect_command();
Command plan_command();
Command shard_command();
Command convert_command();
Command forward_command();
Command verify_command();
Command tokenize_command();
Command generate_command();
Command run_command();
Command merge_results_command();
Command init_model_command();

int run_cli(int argc, char** argv);

// The file tools (inspect, tokenize) under mpirun: logging set up from the
// launcher's variables, every rank runs `body` (so every rank fails alike, a
// clean exit everywhere), only rank 0's standard output is kept.
int run_file_tool(const std::string& log_level, const std::function<int()>& body);

}  // namespace tprun::cli
