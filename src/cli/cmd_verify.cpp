// `tprun verify`: the acceptance test of a TP plan (SPEC §3). The same inputs
// go through the component at tp 1 (every rank computes it on its own, no
// communicator) and through the TP group; the max and mean absolute
// differences of the output and of every traced intermediate are printed.
#include <cmath>
#include <cstdio>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/full.h>
#include <fmt/format.h>

#include "checkpoint/tensor_file.h"
#include "checkpoint/torch_dtype.h"
#include "cli/command.h"
#include "cli/model_args.h"
#include "cli/session_options.h"
#include "dist/communicator.h"
#include "dist/device_mesh.h"
#include "dist/mesh.h"
#include "runtime/error.h"
#include "runtime/rank_env.h"
#include "dist/session.h"

namespace tprun::cli {
namespace {

constexpr uint64_t kSeed = 1234;

double default_tolerance(const std::string& dtype) {
  const auto t = checkpoint::parse_compute_dtype(dtype, "--dtype");
  // bf16 keeps 8 significant bits: one ulp is 1.6e-2 for outputs in [2, 4), and
  // TP rounds each rank's partial sum once more; 2e-2 failed on O(3) outputs.
  return t == at::kBFloat16 ? 5e-2 : t == at::kHalf ? 1e-2 : 1e-4;
}

// --tolerance: a finite number >= 0 (ConfigError naming it otherwise).
void check_tolerance(double tol) {
  if (!std::isfinite(tol) || tol < 0) {
    throw ConfigError(fmt::format("--tolerance {} must be a finite number >= 0", tol), true);
  }
}

struct Diff {
  double max = 0, mean = 0;
};
Diff diff(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor d = at::abs(a.to(at::kFloat) - b.to(at::kFloat));
  return {d.max().item().toDouble(), d.mean().item().toDouble()};
}

}  // namespace

Command verify_command() {
  Command c;
  c.name = "verify";
  c.summary = "compare a component's TP forward (any with a TP plan) against tp 1, per block";
  c.add_options = [](po::options_description& desc, po::positional_options_description&) {
    add_model_options(desc, true);
    po::options_description v("Verify");
    v.add_options()
        ("tp", po::value<int>()->default_value(1), "tensor-parallel group size to verify (world = tp x dp)")
        ("inputs", po::value<std::string>(),
         "safetensors inputs as for 'tprun forward'; default: the model's example inputs with a fixed seed "
         "(transformers: N(0,1) latents and text on an 8x8 image grid with 8 text tokens; text encoders: "
         "random ids, 2 x 16), shapes from config.json")
        ("tolerance", po::value<double>(),
         "max abs diff of the output allowed; default 1e-4 (fp32), 5e-2 (bf16: 8 significant bits, "
         "1 ulp = 1.6e-2 at |x| in [2,4)), 1e-2 (fp16). Exit 1 beyond it");
    desc.add(v);
    add_session_options(desc);
  };
  c.run = [](const po::variables_map& vm, int* argc, char*** argv) {
    // Checked before MPI starts, alike on every rank: a NaN tolerance passed every comparison.
    if (vm.count("tolerance")) check_tolerance(vm["tolerance"].as<double>());
    const int tp_size = vm["tp"].as<int>();
    if (tp_size < 1 || tp_size > kMaxWorld) {
      throw ConfigError(fmt::format("--tp {} is outside [1, {}]", tp_size, kMaxWorld), true);
    }
    Session session(argc, argv, session_options_from(vm));
    const ModelArgs args = model_args_from(vm);
    const double tol = vm.count("tolerance") ? vm["tolerance"].as<double>() : default_tolerance(args.dtype);
    dist::MeshSpec spec;
    spec.tp = tp_size;
    auto mesh = session.make_mesh(spec);
    parallel::TpContext tp{mesh->tp_rank(), mesh->tp_size(), mesh->tp_size() > 1 ? &mesh->tp_device() : nullptr};
    const std::string device = session.device().device;

    // The TP model first: a plan error stops before the reference is loaded.
    auto sharded = load_component(args, tp, device);
    if (sharded->table().tp_plan().empty()) {
      throw ConfigError(fmt::format("--component {}: {} has no TP plan (it is replicated on every rank); nothing "
                                    "to verify",
                                    args.component, sharded->table().cls),
                        true);
    }
    auto local = load_component(args, parallel::TpContext{}, device);
    const auto inputs = vm.count("inputs") ? checkpoint::read_tensor_file(vm["inputs"].as<std::string>())
                                           : local->example_inputs(kSeed);
    models::Trace ref_trace, tp_trace;
    const std::string output = local->primary_output();
    const at::Tensor ref = local->forward(inputs, &ref_trace).at(output);
    if (tp.comm) tp.comm->reset_stats();
    const at::Tensor out = sharded->forward(inputs, &tp_trace).at(output);
    const uint64_t reduces = tp.comm ? tp.comm->stats()[dist::CollectiveKind::AllReduce].calls : 0;
    const int64_t planned = sharded->all_reduces_per_forward();

    const Diff total = diff(ref, out);
    int bad = total.max <= tol ? 0 : 1;  // a NaN difference fails too
    at::Tensor verdict = at::full({1}, bad, at::TensorOptions().dtype(at::kInt));
    mesh->world().all_reduce(verdict, {dist::ReduceOp::Max});
    bad = verdict.item().toInt();
    if (session.rank() == 0) {
      std::printf("verify %s (%s): tp %d vs tp 1, dtype %s, %s inputs\n", args.path.c_str(),
                  sharded->table().cls.c_str(), tp.size, args.dtype.c_str(),
                  vm.count("inputs") ? "given" : "example (seed 1234)");
      std::printf("%-52s %12s %12s\n", "tensor", "max_abs", "mean_abs");
      for (size_t i = 0; i < ref_trace.size() && i < tp_trace.size(); ++i) {
        const auto& [name, a] = ref_trace[i];
        const auto& b = tp_trace[i].second;
        if (name != tp_trace[i].first || a.sizes() != b.sizes()) continue;
        const Diff d = diff(a, b);
        std::printf("%-52s %12.3e %12.3e\n", name.c_str(), d.max, d.mean);
      }
      std::printf("%-52s %12.3e %12.3e\n", output.c_str(), total.max, total.mean);
      std::printf("all_reduce calls per forward: %llu (plan: %lld)\n", static_cast<unsigned long long>(reduces),
                  static_cast<long long>(planned));
      std::printf("%s: max abs diff %.3e %s tolerance %.1e\n", bad ? "FAIL" : "OK", total.max, bad ? ">" : "<=", tol);
      std::fflush(stdout);
    }
    return bad ? 1 : 0;
  };
  return c;
}

}  // namespace tprun::cli
