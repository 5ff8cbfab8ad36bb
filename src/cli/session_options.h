#pragma once
// Options every rank-starting subcommand shares: device, threads, logging, the
// TP backend for CUDA tensors and the communication timeout.

#include <boost/program_options.hpp>

#include "dist/session.h"

namespace tprun::cli {

void add_session_options(boost::program_options::options_description& desc);
SessionOptions session_options_from(const boost::program_options::variables_map& vm);

}  // namespace tprun::cli
