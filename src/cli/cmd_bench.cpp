// `tprun bench collectives`: all_reduce through tprun's Communicator against a
// bare MPI_Allreduce loop (dist/bare_all_reduce.h), in the same run, on the
// world communicator.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>

#include <ATen/core/Tensor.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "cli/bench_load.h"
#include "cli/bench_step.h"
#include "cli/memory_args.h"
#include "cli/command.h"
#include "cli/session_options.h"
#include "dist/bare_all_reduce.h"
#include "dist/device_mesh.h"
#include "dist/mpi_communicator.h"
#include "runtime/error.h"
#include "dist/session.h"
#include "runtime/size_string.h"

namespace tprun::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchOptions {
  uint64_t min_bytes = 4096;
  uint64_t max_bytes = 64ull << 20;
  std::vector<std::string> dtypes{"fp32", "bf16"};
  double seconds = 0.15;  // per measurement
  int rounds = 5;         // interleaved tprun / bare rounds; median reported
};

at::ScalarType dtype_of(const std::string& name) {
  if (name == "fp32") return at::kFloat;
  if (name == "bf16") return at::kBFloat16;
  if (name == "fp16") return at::kHalf;
  throw ConfigError(fmt::format("--dtypes: '{}' is not fp32, bf16 or fp16", name));
}

// Max over ranks of the seconds each rank spent in `fn` run `iters` times.
// `sync` (the world, under the session's watchdog) lines the ranks up before
// and takes the slowest after, outside the timed loop.
template <typename Fn>
double timed(dist::Communicator& sync, int iters, Fn fn) {
  sync.barrier();
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) fn();
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  at::Tensor worst = at::full({1}, s, at::TensorOptions().dtype(at::kDouble));
  sync.all_reduce(worst, {dist::ReduceOp::Max});
  return worst.item<double>();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int run_collectives(const BenchOptions& o, Session& session) {
  // What is measured: tprun's all_reduce without a deadline (as the bare loop).
  dist::MpiCommunicator world(MPI_COMM_WORLD, "world", nullptr);
  // The bench's own agreement (barriers, timings, iteration count) under the watchdog.
  dist::MpiCommunicator sync(MPI_COMM_WORLD, "world", session.watchdog());
  const int n = world.size();
  struct Row {
    std::string dtype;
    uint64_t bytes;
    int64_t elements;
    double tprun_us, bare_us;
  };
  std::vector<Row> rows;
  std::map<std::pair<std::string, int64_t>, double> by_elements;
  for (const auto& dname : o.dtypes) {
    const at::ScalarType dt = dtype_of(dname);
    for (uint64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 2) {
      const int64_t elems = static_cast<int64_t>(bytes / at::elementSize(dt));
      at::Tensor t = at::randn({elems}).to(dt);
      auto through_tprun = [&] { world.all_reduce(t); };
      // The bare baseline for 16-bit types is what MPI alone offers:
      // MPI_Allreduce with a user-defined op on a 2-byte datatype.
      dist::BareAllReduce bare(t);
      // Calibrate the iteration count on rank 0's clock; everyone uses it.
      double once = timed(sync, 3, through_tprun) / 3.0;
      at::Tensor iters_t = at::full({1}, static_cast<int>(std::clamp(o.seconds / std::max(once, 1e-7), 3.0, 20000.0)),
                                    at::TensorOptions().dtype(at::kInt));
      sync.broadcast(iters_t, {0});
      const int iters = iters_t.item<int>();
      std::vector<double> a, b;
      for (int r = 0; r < o.rounds; ++r) {
        a.push_back(timed(sync, iters, through_tprun) / iters * 1e6);
        b.push_back(timed(sync, iters, bare) / iters * 1e6);
      }
      rows.push_back({dname, bytes, elems, median(a), median(b)});
      by_elements[{dname, elems}] = median(a);
      spdlog::debug("bench {} {} B: tprun {:.1f} us, bare {:.1f} us", dname, bytes, median(a), median(b));
    }
  }
  if (session.rank() == 0) {
    std::cout << fmt::format("all_reduce (sum) over {} ranks, {} thread(s) per rank; times are the "
                             "median of {} rounds, each the slowest rank's mean\n\n",
                             n, session.threads(), o.rounds);
    std::cout << "| dtype | size | elements | tprun (us) | bare MPI_Allreduce (us) | tprun / bare "
                 "| bus bandwidth (GB/s) | vs fp32, same elements |\n"
                 "|---|---|---|---|---|---|---|---|\n";
    for (const auto& r : rows) {
      const double busbw = n > 1 ? 2.0 * (n - 1) / n * static_cast<double>(r.bytes) / (r.tprun_us * 1e-6) / 1e9 : 0.0;
      std::string vs = "-";
      auto it = by_elements.find({"fp32", r.elements});
      if (r.dtype != "fp32" && it != by_elements.end()) vs = fmt::format("{:.2f}x", r.tprun_us / it->second);
      std::cout << fmt::format("| {} | {} | {} | {:.1f} | {:.1f} | {:.3f} | {:.2f} | {} |\n", r.dtype,
                               format_size(r.bytes), r.elements, r.tprun_us, r.bare_us,
                               r.tprun_us / r.bare_us, busbw, vs);
    }
    std::cout.flush();
  }
  return 0;
}

}  // namespace

Command bench_command() {
  Command c;
  c.name = "bench";
  c.summary = "benchmarks: 'collectives' (all_reduce vs bare MPI), 'load' (one rank's checkpoint load), "
              "'step' (transformer forward time)";
  c.usage = "collectives|load|step";
  c.add_options = [](po::options_description& desc, po::positional_options_description& pos) {
    po::options_description b("Benchmark");
    b.add_options()
        ("what", po::value<std::string>()->required(), "what to measure: collectives | load | step")
        ("min-size", po::value<std::string>()->default_value("4KiB"), "smallest message")
        ("max-size", po::value<std::string>()->default_value("64MiB"), "largest message (x2 steps)")
        ("dtypes", po::value<std::string>()->default_value("fp32,bf16"), "comma-separated: fp32,bf16,fp16")
        ("seconds", po::value<double>()->default_value(0.15), "target seconds per measurement")
        ("rounds", po::value<int>()->default_value(5), "interleaved rounds; the median is reported");
    desc.add(b);
    pos.add("what", 1);
    add_load_bench_options(desc);
    add_step_bench_options(desc);
    add_memory_option(desc);
    add_session_options(desc);
  };
  c.run = [](const po::variables_map& vm, int* argc, char*** argv) {
    const std::string what = vm["what"].as<std::string>();
    if (what == "load") return run_load_bench(vm);
    if (what == "step") return run_step_bench(vm, argc, argv);
    if (what != "collectives") {
      throw ConfigError(fmt::format("tprun bench: unknown benchmark '{}'; available: collectives, load, step", what),
                        true);
    }
    BenchOptions o;
    o.min_bytes = parse_size(vm["min-size"].as<std::string>(), "--min-size");
    o.max_bytes = parse_size(vm["max-size"].as<std::string>(), "--max-size");
    o.dtypes.clear();
    std::string list = vm["dtypes"].as<std::string>();
    for (size_t s = 0; s <= list.size();) {
      size_t e = list.find(',', s);
      if (e == std::string::npos) e = list.size();
      if (e > s) {
        o.dtypes.push_back(list.substr(s, e - s));
        dtype_of(o.dtypes.back());
      }
      s = e + 1;
    }
    o.seconds = vm["seconds"].as<double>();
    o.rounds = std::max(1, vm["rounds"].as<int>());
    Session session(argc, argv, session_options_from(vm));
    return run_collectives(o, session);
  };
  return c;
}

}  // namespace tprun::cli
