#pragma once
// `tprun bench load`: one rank's load of a checkpoint, measured alone.

#include <boost/program_options.hpp>

namespace tprun::cli {

void add_load_bench_options(boost::program_options::options_description& desc);
int run_load_bench(const boost::program_options::variables_map& vm);

}  // namespace tprun::cli
