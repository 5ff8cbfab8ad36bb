#pragma once
// Logging for every rank through spdlog (compiled library).
//   console (stderr): rank 0 at the chosen level (default info), other ranks at
//                     warning and up, so only rank 0 narrates;
//   file:             every rank at debug (or finer) into <dir>/rank-NNNN.log,
//                     appended to across runs. The folder is never a model
//                     folder nor inside one (model_index.json at or above it;
//                     config.json, a tokenizer file or weights in it),
//                     and the file is opened without following a symlink and
//                     must be new, empty or a log tprun wrote (its first line
//                     one of tprun's): ConfigError naming --log-dir otherwise.
// Every line carries "[r{rank}/{world}]". Level: --log-level, else the
// SPDLOG_LEVEL environment variable, else info. The level is coloured only
// when stderr is a terminal (and NO_COLOR is unset, TERM is not "dumb"):
// never escape codes in a file, a pipe or mpirun's collected output.

#include <string>

namespace tprun {

struct LogOptions {
  int rank = 0;
  int world = 1;
  std::string level;  // trace|debug|info|warn|error|critical|off; "" = SPDLOG_LEVEL or info
  std::string dir;    // "" = no per-rank file
};

// Installs the default logger. Safe to call again (e.g. once the rank is known).
void init_logging(const LogOptions& options);

// The logger before a command installs its own (an option error, a bad
// --set): the same prefix, with the rank and world from the launcher's
// variables (0/1 without a launcher), console only. Never throws.
void init_launch_logging() noexcept;

// Whether console lines are coloured (see above).
bool console_colour();

// Validates a level name; throws ConfigError naming `option` otherwise.
void check_log_level(const std::string& level, const std::string& option);

// Flushes every sink (before an abort or exit).
void flush_logs() noexcept;

}  // namespace tprun
