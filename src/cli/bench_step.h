#pragma once
// `tprun bench step`: timed transformer forwards under TP (mpirun world), with
// the analytic matmul FLOPs and a bare-matmul baseline of the same shapes.

#include <boost/program_options.hpp>

namespace tprun::cli {

// Options of its own; --model, --tp, --dtype and --shard-modulation are
// shared with `bench load` (add_load_bench_options).
void add_step_bench_options(boost::program_options::options_description& desc);
int run_step_bench(const boost::program_options::variables_map& vm, int* argc, char*** argv);

}  // namespace tprun::cli
