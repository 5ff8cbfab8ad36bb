#include "cli/session_options.h"

#include <cmath>

#include <fmt/format.h>

#include "dist/device_mesh.h"
#include "runtime/error.h"
#include "runtime/logging.h"

namespace tprun::cli {

namespace po = boost::program_options;

void add_session_options(po::options_description& desc) {
  po::options_description rt("Runtime");
  rt.add_options()
      ("device", po::value<std::string>()->default_value(""),
       "cpu, cuda (cuda:<local rank>) or cuda:N; default: cuda:<local rank> where a GPU is "
       "visible, else cpu")
      ("threads", po::value<int>()->default_value(0),
       "CPU threads per rank; 0 splits the node's CPUs between its ranks")
      ("log-level", po::value<std::string>()->default_value(""),
       "trace|debug|info|warn|error|critical|off (default: $SPDLOG_LEVEL, else info)")
      ("log-dir", po::value<std::string>()->default_value("logs"),
       "per-rank debug logs go to <dir>/rank-NNNN.log; empty: none")
      ("comm", po::value<std::string>()->default_value("auto"),
       "auto|nccl|mpi: the TP group's backend for CUDA tensors; auto: NCCL where this build has it, "
       "else mpi (MPI staged through pinned host memory; also works with several ranks on one GPU, "
       "which NCCL refuses). CPU ranks always use MPI: nccl where a rank computes on the CPU is an error")
      ("comm-timeout", po::value<double>()->default_value(1800.0),
       "seconds a collective may wait for its peers before the job is ended (at least 0.001); 0: forever");
  desc.add(rt);
}

namespace {

constexpr double kMinCommTimeoutS = 0.001;  // the watchdog counts milliseconds
constexpr double kMaxCommTimeoutS = 1e9;    // ~31 years; more overflows the millisecond count

// 0 is the documented "no deadline"; anything else must be a deadline the watchdog can keep: the
// old code took every value <= 0 (and NaN, which compares false) as "off", and a sub-millisecond
// value rounded to 0 ms, so a typo silently disabled the watchdog.
void check_comm_timeout(double seconds) {
  if (seconds == 0) return;
  if (!std::isfinite(seconds) || seconds < kMinCommTimeoutS || seconds > kMaxCommTimeoutS) {
    throw ConfigError(fmt::format("--comm-timeout {}: must be 0 (no deadline) or a number of seconds from {} to {}",
                                  seconds, kMinCommTimeoutS, kMaxCommTimeoutS),
                      true);
  }
}

// Every rank parses the same command line, so this error is the same on all ranks. Whether NCCL can
// be used depends on the device each rank finds: the Session decides that (dist/session.cpp).
constexpr int kMaxThreads = 4096;  // CPU threads per rank: more than any node has cores

dist::CommChoice comm_choice(const std::string& name) {
  const auto choice = dist::comm_choice_from_name(name);
  if (!choice) throw ConfigError(fmt::format("--comm {}: must be auto, nccl or mpi", name), true);
  return *choice;
}

}  // namespace

SessionOptions session_options_from(const po::variables_map& vm) {
  SessionOptions o;
  o.device = vm["device"].as<std::string>();
  o.threads = vm["threads"].as<int>();
  if (o.threads < 0 || o.threads > kMaxThreads) {
    throw ConfigError(
        fmt::format("--threads {}: must be 0 (split the node's CPUs between its ranks) or 1-{}", o.threads, kMaxThreads),
        true);
  }
  o.log_level = vm["log-level"].as<std::string>();
  if (!o.log_level.empty()) check_log_level(o.log_level, "--log-level");
  o.log_dir = vm["log-dir"].as<std::string>();
  o.comm_timeout_s = vm["comm-timeout"].as<double>();
  check_comm_timeout(o.comm_timeout_s);
  o.comm = comm_choice(vm["comm"].as<std::string>());
  return o;
}

}  // namespace tprun::cli
