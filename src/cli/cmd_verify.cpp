// `tprun verify`: the acceptance test of a TP plan (SPEC §3). The same inputs
// go through the model at tp 1 (every rank computes it on its own, no
// communicator) and through the TP group; the max and mean absolute
// differences of `sample` and of every block's outputs are printed.
#include <cstdio>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/stack.h>
#include <fmt/format.h>

#include "checkpoint/tensor_file.h"
#include "checkpoint/torch_dtype.h"
#include "cli/command.h"
#include "cli/component_forward.h"
#include "cli/flux_args.h"
#include "cli/session_options.h"
#include "dist/communicator.h"
#include "dist/device_mesh.h"
#include "dist/mesh.h"
#include "runtime/error.h"
#include "runtime/session.h"

namespace tprun::cli {
namespace {

constexpr uint64_t kSeed = 1234;
constexpr int64_t kGrid = 8;       // image tokens: an 8 x 8 grid
constexpr int64_t kTextTokens = 8;

double default_tolerance(const std::string& dtype) {
  const auto t = checkpoint::parse_compute_dtype(dtype, "--dtype");
  // bf16 keeps 8 significant bits: one ulp is 1.6e-2 for outputs in [2, 4), and
  // TP rounds each rank's partial sum once more; 2e-2 failed on O(3) outputs.
  return t == at::kBFloat16 ? 5e-2 : t == at::kHalf ? 1e-2 : 1e-4;
}

// Random inputs with a fixed seed, shapes from the config (identical on every rank).
models::TensorMap random_inputs(const models::FluxConfig& c) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(kSeed);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  models::TensorMap in;
  in["hidden_states"] = at::randn({1, kGrid * kGrid, c.in_channels}, gen, f32);
  in["encoder_hidden_states"] = at::randn({1, kTextTokens, c.joint_dim}, gen, f32);
  in["pooled_projections"] = at::randn({1, c.pooled_dim}, gen, f32);
  in["timestep"] = at::full({1}, 0.5, f32);
  if (c.guidance) in["guidance"] = at::full({1}, 3.5, f32);
  at::Tensor r = at::arange(kGrid * kGrid, f32);
  in["img_ids"] = at::stack({at::zeros({kGrid * kGrid}, f32), (r / kGrid).floor(), r.fmod(kGrid)}, 1);
  in["txt_ids"] = at::zeros({kTextTokens, 3}, f32);
  return in;
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
  c.summary = "compare the TP forward (transformer, or T5 with --component text_encoder_2) against tp 1, per block";
  c.add_options = [](po::options_description& desc, po::positional_options_description&) {
    add_flux_options(desc, true);
    po::options_description v("Verify");
    v.add_options()
        ("tp", po::value<int>()->default_value(1), "tensor-parallel group size to verify (world = tp x dp)")
        ("inputs", po::value<std::string>(),
         "safetensors inputs as for 'tprun forward'; default: random N(0,1) with a fixed seed, an 8x8 "
         "image grid, 8 text tokens, timestep 0.5, guidance 3.5, shapes from config.json")
        ("tolerance", po::value<double>(),
         "max abs diff of 'sample' allowed; default 1e-4 (fp32), 5e-2 (bf16: 8 significant bits, "
         "1 ulp = 1.6e-2 at |x| in [2,4)), 1e-2 (fp16). Exit 1 beyond it");
    desc.add(v);
    add_session_options(desc);
  };
  c.run = [](const po::variables_map& vm, int* argc, char*** argv) {
    Session session(argc, argv, session_options_from(vm));
    FluxArgs args = flux_args_from(vm);
    if (args.component != "transformer" && args.component != "text_encoder_2") {
      throw ConfigError(fmt::format("--component {}: only the transformer and text_encoder_2 (T5) have a TP plan; "
                                    "the other components are replicated",
                                    args.component),
                        true);
    }
    const double tol = vm.count("tolerance") ? vm["tolerance"].as<double>() : default_tolerance(args.dtype);
    dist::MeshSpec spec;
    spec.tp = vm["tp"].as<int>();
    auto mesh = session.make_mesh(spec);
    parallel::TpContext tp{mesh->tp_rank(), mesh->tp_size(), mesh->tp_size() > 1 ? &mesh->tp_device() : nullptr};
    const std::string device = session.device().device;

    models::Trace ref_trace, tp_trace;
    at::Tensor ref, out;
    uint64_t reduces = 0;
    int64_t planned = 0;
    if (args.component == "text_encoder_2") {
      // T5: random token ids (seeded) of config vocab_size, batch 2 x 16 tokens.
      std::string config_path;
      const auto config = models::read_component_config(args.path, &config_path);
      const int64_t vocab = models::config_int(config, "vocab_size", config_path);
      models::TensorMap inputs;
      if (vm.count("inputs")) {
        inputs = checkpoint::read_tensor_file(vm["inputs"].as<std::string>());
      } else {
        auto gen = at::make_generator<at::CPUGeneratorImpl>(kSeed);
        inputs["input_ids"] = at::randint(vocab, {2, 2 * kTextTokens}, gen, at::TensorOptions().dtype(at::kLong));
      }
      if (tp.comm) tp.comm->reset_stats();
      out = run_component(args, inputs, tp, device, &tp_trace, &planned).at("last_hidden_state");
      reduces = tp.comm ? tp.comm->stats()[dist::CollectiveKind::AllReduce].calls : 0;
      ref = run_component(args, inputs, parallel::TpContext{}, device, &ref_trace).at("last_hidden_state");
    } else {
      // The TP model first: a plan error stops before the reference is loaded.
      auto sharded = load_flux(args, tp, device);
      auto local = load_flux(args, parallel::TpContext{}, device);
      auto inputs = vm.count("inputs") ? checkpoint::read_tensor_file(vm["inputs"].as<std::string>())
                                       : random_inputs(local.config());
      ref = local.forward(inputs, &ref_trace);
      if (tp.comm) tp.comm->reset_stats();
      out = sharded.forward(inputs, &tp_trace);
      reduces = tp.comm ? tp.comm->stats()[dist::CollectiveKind::AllReduce].calls : 0;
      planned = sharded.all_reduces_per_forward();
    }
    const Diff total = diff(ref, out);
    int bad = total.max > tol ? 1 : 0;
    at::Tensor verdict = at::full({1}, bad, at::TensorOptions().dtype(at::kInt));
    mesh->world().all_reduce(verdict, {dist::ReduceOp::Max});
    bad = verdict.item().toInt();
    if (session.rank() == 0) {
      std::printf("verify %s: tp %d vs tp 1, dtype %s, %s inputs\n", args.path.c_str(), tp.size, args.dtype.c_str(),
                  vm.count("inputs") ? "given" : "random (seed 1234)");
      std::printf("%-52s %12s %12s\n", "tensor", "max_abs", "mean_abs");
      for (size_t i = 0; i < ref_trace.size() && i < tp_trace.size(); ++i) {
        const auto& name = ref_trace[i].first;
        if (name.rfind("transformer_blocks.", 0) != 0 && name.rfind("single_transformer_blocks.", 0) != 0 &&
            name != "norm_out" && name.rfind("block_output.", 0) != 0)
          continue;
        const Diff d = diff(ref_trace[i].second, tp_trace[i].second);
        std::printf("%-52s %12.3e %12.3e\n", name.c_str(), d.max, d.mean);
      }
      std::printf("%-52s %12.3e %12.3e\n", args.component == "transformer" ? "sample" : "last_hidden_state", total.max,
                  total.mean);
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
