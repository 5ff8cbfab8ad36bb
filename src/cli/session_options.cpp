#include "cli/session_options.h"

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
      ("comm-timeout", po::value<double>()->default_value(1800.0),
       "seconds a collective may wait for its peers before the job is ended; 0: forever");
  desc.add(rt);
}

SessionOptions session_options_from(const po::variables_map& vm) {
  SessionOptions o;
  o.device = vm["device"].as<std::string>();
  o.threads = vm["threads"].as<int>();
  o.log_level = vm["log-level"].as<std::string>();
  if (!o.log_level.empty()) check_log_level(o.log_level, "--log-level");
  o.log_dir = vm["log-dir"].as<std::string>();
  o.comm_timeout_s = vm["comm-timeout"].as<double>();
  return o;
}

}  // namespace tprun::cli
