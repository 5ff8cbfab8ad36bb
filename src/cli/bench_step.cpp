// `tprun bench step --model DIR --inputs IN.safetensors [--dtype fp32|bf16]
// [--iters 5] [--warmup 1]` under mpirun: loads the Flux transformer at
// tp = world (or --tp), runs `warmup` untimed forwards, then times `iters`
// forwards (world barrier before each, the slowest rank's seconds). Rank 0
// prints one JSON line:
//   median_s / min_s          forward seconds
//   matmul_gflop              analytic FLOPs of the whole forward's matmuls:
//                             every linear layer (2 M K N) and attention's
//                             QK^T and PV (2 * 2 * heads * S^2 * head_dim)
//   rank_matmul_gflop         the same for this rank's slices (heads / tp,
//                             colwise N / tp, rowwise K / tp; the replicated
//                             layers in full)
//   gflops                    matmul_gflop / median_s
//   bare_median_s             the rank's matmul shapes run back to back with
//                             at::addmm (linears, with bias) and at::matmul
//                             (attention), same dtype, slowest rank, median
//   share_in_matmul           bare_median_s / median_s
// --out FILE: rank 0 writes the last forward's `sample` (F32).
#include "cli/bench_step.h"

#include <algorithm>
#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/randn.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/pipeline_folder.h"
#include "checkpoint/tensor_file.h"
#include "checkpoint/torch_dtype.h"
#include "cli/flux_args.h"
#include "cli/session_options.h"
#include "dist/communicator.h"
#include "dist/device_mesh.h"
#include "dist/mesh.h"
#include "dist/mpi_world.h"
#include "runtime/error.h"
#include "runtime/session.h"

namespace tprun::cli {
namespace po = boost::program_options;
namespace {

using Clock = std::chrono::steady_clock;

// One matmul of the forward: a linear [M, K] x [K, N] (+ bias), or attention's
// batched [batch, M, K] x [batch, K, N].
struct Matmul {
  int64_t batch, m, k, n;
  bool linear;
  double flops() const { return 2.0 * static_cast<double>(batch) * m * k * n; }
};

// The forward's matmuls for TP size p (p = 1: the whole model). Mirrors
// FluxTransformer::forward and the model table's plan.
std::vector<Matmul> forward_matmuls(const models::FluxConfig& c, int64_t b, int64_t img, int64_t txt, int64_t p,
                                    bool shard_modulation) {
  const int64_t d = c.inner(), mlp = 4 * d, s = img + txt, hp = c.heads / p;
  std::vector<Matmul> v;
  auto lin = [&](int64_t m, int64_t k, int64_t n) { v.push_back({1, m, k, n, true}); };
  auto attn = [&] {
    v.push_back({b * hp, s, c.head_dim, s, false});  // Q K^T
    v.push_back({b * hp, s, s, c.head_dim, false});  // P V
  };
  lin(b * img, c.in_channels, d);  // x_embedder
  lin(b, 256, d);                  // timestep embedder
  lin(b, d, d);
  if (c.guidance) {
    lin(b, 256, d);
    lin(b, d, d);
  }
  lin(b, c.pooled_dim, d);  // pooled text embedder
  lin(b, d, d);
  lin(b * txt, c.joint_dim, d);  // context_embedder
  const int64_t mk = shard_modulation ? d / p : d;
  for (int64_t i = 0; i < c.layers; ++i) {
    lin(b, mk, 6 * d);  // norm1, norm1_context
    lin(b, mk, 6 * d);
  }
  for (int64_t i = 0; i < c.single_layers; ++i) lin(b, mk, 3 * d);
  for (int64_t i = 0; i < c.layers; ++i) {
    for (int j = 0; j < 3; ++j) lin(b * img, d, d / p);  // to_q/k/v
    for (int j = 0; j < 3; ++j) lin(b * txt, d, d / p);  // add_q/k/v
    attn();
    lin(b * img, d / p, d);    // to_out.0
    lin(b * txt, d / p, d);    // to_add_out
    lin(b * img, d, mlp / p);  // ff
    lin(b * img, mlp / p, d);
    lin(b * txt, d, mlp / p);  // ff_context
    lin(b * txt, mlp / p, d);
  }
  for (int64_t i = 0; i < c.single_layers; ++i) {
    for (int j = 0; j < 3; ++j) lin(b * s, d, d / p);  // to_q/k/v
    lin(b * s, d, mlp / p);                            // proj_mlp
    attn();
    lin(b * s, (d + mlp) / p, d);  // proj_out, packed rowwise
  }
  lin(b, d, 2 * d);                                          // norm_out
  lin(b * img, d, c.patch * c.patch * c.out_channels);  // proj_out
  return v;
}

double total_flops(const std::vector<Matmul>& v) {
  double f = 0;
  for (const auto& m : v) f += m.flops();
  return f;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds of `fn` on this rank after a world barrier; the slowest rank's.
template <typename Fn>
double timed_max(dist::Communicator& world, Fn fn) {
  world.barrier();
  const auto t0 = Clock::now();
  fn();
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  double worst = 0;
  MPI_Allreduce(&s, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}

}  // namespace

void add_step_bench_options(po::options_description& desc) {
  po::options_description o("Step benchmark (bench step; also --model, --tp, --dtype, --shard-modulation)");
  o.add_options()
      ("inputs", po::value<std::string>(), "safetensors with the forward's inputs (as `tprun forward`)")
      ("iters", po::value<int>()->default_value(5), "timed forwards; the median is reported")
      ("warmup", po::value<int>()->default_value(1), "untimed forwards first")
      ("out", po::value<std::string>(), "rank 0 writes the last forward's 'sample' here (F32)");
  desc.add(o);
}

int run_step_bench(const po::variables_map& vm, int* argc, char*** argv) {
  if (!vm.count("model")) throw ConfigError("bench step needs --model DIR", true);
  if (!vm.count("inputs")) throw ConfigError("bench step needs --inputs IN.safetensors", true);
  FluxArgs args;
  args.model = args.path = vm["model"].as<std::string>();
  args.dtype = vm["dtype"].as<std::string>().empty() ? "fp32" : vm["dtype"].as<std::string>();
  (void)checkpoint::parse_compute_dtype(args.dtype, "--dtype");
  args.shard_modulation = vm["shard-modulation"].as<bool>();
  if (checkpoint::is_pipeline_folder(args.model)) {
    auto folder = checkpoint::open_pipeline_folder(args.model);
    const auto* c = folder.find("transformer");
    if (!c) throw ConfigError(fmt::format("--model {}: pipeline has no transformer", args.model), true);
    args.path = c->path;
  }
  const int iters = std::max(1, vm["iters"].as<int>()), warmup = std::max(0, vm["warmup"].as<int>());

  Session session(argc, argv, session_options_from(vm));
  dist::MeshSpec spec;
  spec.tp = vm["tp"].defaulted() ? session.world() : vm["tp"].as<int>();
  auto mesh = session.make_mesh(spec);
  auto& world = mesh->world();
  parallel::TpContext tp{mesh->tp_rank(), mesh->tp_size(), mesh->tp_size() > 1 ? &mesh->tp_device() : nullptr};

  auto inputs = checkpoint::read_tensor_file(vm["inputs"].as<std::string>());
  auto model = load_flux(args, tp, session.device().device);
  const auto& cfg = model.config();
  for (const char* name : {"hidden_states", "encoder_hidden_states"}) {
    if (!inputs.count(name) || inputs.at(name).dim() != 3) {
      throw RequestError(fmt::format("--inputs: '{}' [B, S, C] is required", name), true);
    }
  }
  const int64_t b = inputs.at("hidden_states").size(0), img = inputs.at("hidden_states").size(1),
                txt = inputs.at("encoder_hidden_states").size(1);

  at::Tensor sample;
  for (int i = 0; i < warmup; ++i) sample = model.forward(inputs);
  std::vector<double> fwd;
  for (int i = 0; i < iters; ++i) fwd.push_back(timed_max(world, [&] { sample = model.forward(inputs); }));

  // Bare baseline: this rank's matmul shapes, distinct operands per layer (as
  // the model's weights are), same dtype, back to back.
  const auto rank_mm = forward_matmuls(cfg, b, img, txt, tp.size, args.shard_modulation);
  const auto dt = checkpoint::parse_compute_dtype(args.dtype, "--dtype");
  const auto opts = at::TensorOptions().dtype(dt).device(session.device().device);
  struct Operands {
    at::Tensor a, w, bias;
  };
  std::vector<Operands> ops;
  for (const auto& m : rank_mm) {
    if (m.linear) {
      ops.push_back({at::randn({m.m, m.k}, opts), at::randn({m.n, m.k}, opts), at::randn({m.n}, opts)});
    } else {
      ops.push_back({at::randn({m.batch, m.m, m.k}, opts), at::randn({m.batch, m.k, m.n}, opts), {}});
    }
  }
  auto bare_pass = [&] {
    for (const auto& o : ops) {
      if (o.bias.defined()) (void)at::addmm(o.bias, o.a, o.w.t());
      else (void)at::matmul(o.a, o.w);
    }
  };
  for (int i = 0; i < warmup; ++i) bare_pass();
  std::vector<double> bare;
  for (int i = 0; i < iters; ++i) bare.push_back(timed_max(world, bare_pass));

  const double flops = total_flops(forward_matmuls(cfg, b, img, txt, 1, false));
  const double rank_flops = total_flops(rank_mm);
  const double med = median(fwd), bare_med = median(bare);
  if (session.rank() == 0) {
    nlohmann::json j = {{"model", args.path},
                        {"dtype", args.dtype},
                        {"tp", tp.size},
                        {"world", session.world()},
                        {"threads", session.threads()},
                        {"batch", b},
                        {"image_tokens", img},
                        {"text_tokens", txt},
                        {"layers", cfg.layers},
                        {"single_layers", cfg.single_layers},
                        {"heads", cfg.heads},
                        {"head_dim", cfg.head_dim},
                        {"warmup", warmup},
                        {"iters", iters},
                        {"times_s", fwd},
                        {"median_s", med},
                        {"min_s", *std::min_element(fwd.begin(), fwd.end())},
                        {"all_reduces_per_forward", model.all_reduces_per_forward()},
                        {"matmul_gflop", flops / 1e9},
                        {"rank_matmul_gflop", rank_flops / 1e9},
                        {"gflops", flops / med / 1e9},
                        {"rank_gflops", rank_flops / med / 1e9},
                        {"bare_times_s", bare},
                        {"bare_median_s", bare_med},
                        {"bare_rank_gflops", rank_flops / bare_med / 1e9},
                        {"share_in_matmul", bare_med / med}};
    std::cout << j.dump() << std::endl;
    if (vm.count("out")) checkpoint::write_tensor_file_f32(vm["out"].as<std::string>(), {{"sample", sample}});
  }
  world.barrier();
  return 0;
}

}  // namespace tprun::cli
