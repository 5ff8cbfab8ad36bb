// `tprun bench step --model DIR --inputs IN.safetensors [--dtype fp32|bf16]
// [--iters 5] [--warmup 1]` under mpirun: loads the transformer (any class the
// model registry knows) at tp = world (or --tp), runs `warmup` untimed
// forwards (the first records this rank's matrix products), then times `iters`
// forwards (world barrier before each, the slowest rank's seconds). Rank 0
// prints one JSON line:
//   median_s / min_s          forward seconds
//   matmul_gflop              FLOPs of the whole forward's matmuls, from the
//                             recorded products (parallel/matmul_trace.h):
//                             every linear layer (2 M K N) and attention's
//                             QK^T and PV, split ones counted tp times
//   rank_matmul_gflop         the same for this rank's slices (heads / tp,
//                             colwise N / tp, rowwise K / tp; the replicated
//                             layers in full)
//   gflops                    matmul_gflop / median_s
//   bare_median_s             the rank's matmul shapes run back to back with
//                             at::addmm (linears, with a bias when the model's
//                             linears have biases, else at::mm: FLUX.2 has
//                             none) and at::matmul (attention), same dtype,
//                             slowest rank, median
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
#include <ATen/ops/full.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/randn.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/pipeline_folder.h"
#include "checkpoint/tensor_file.h"
#include "checkpoint/torch_dtype.h"
#include "cli/lora_args.h"
#include "cli/memory_args.h"
#include "cli/model_args.h"
#include "memory/group_offloader.h"
#include "parallel/matmul_trace.h"
#include "cli/session_options.h"
#include "dist/communicator.h"
#include "dist/device_mesh.h"
#include "dist/mesh.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/host_memory.h"
#include "dist/session.h"
#include "jobs/output_folder.h"
#include "lora/lora_adapters.h"
#include "runtime/strict_json.h"

namespace tprun::cli {
namespace po = boost::program_options;
namespace {

using Clock = std::chrono::steady_clock;

double total_flops(const std::vector<parallel::MatmulShape>& v, bool whole_model) {
  double f = 0;
  for (const auto& m : v) f += m.flops() * static_cast<double>(whole_model ? m.tp_share : 1);
  return f;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds of `fn` on this rank after a world barrier, the work it queued on
// `device` finished (CUDA runs asynchronously); the slowest rank's.
template <typename Fn>
double timed_max(dist::Communicator& world, const std::string& device, Fn fn) {
  synchronize_device(device);
  world.barrier();
  const auto t0 = Clock::now();
  fn();
  synchronize_device(device);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  at::Tensor worst = at::full({1}, s, at::TensorOptions().dtype(at::kDouble));
  world.all_reduce(worst, {dist::ReduceOp::Max});
  return worst.item<double>();
}

}  // namespace

void add_step_bench_options(po::options_description& desc) {
  po::options_description o("Step benchmark (bench step; also --model, --tp, --dtype, --shard-modulation)");
  o.add_options()
      ("inputs", po::value<std::string>(), "safetensors with the forward's inputs (as `tprun forward`)")
      ("iters", po::value<int>()->default_value(5), "timed forwards; the median is reported")
      ("warmup", po::value<int>()->default_value(1), "untimed forwards first")
      ("out", po::value<std::string>(), "rank 0 writes the last forward's 'sample' here (F32)")
      ("no-bare", po::bool_switch(), "skip the bare-matmul baseline (its operands take as much memory as the "
                                     "weights: off for memory measurements)");
  desc.add(o);
  add_lora_options(desc);
}

namespace {

// The model to load, checked before MPI starts: --model (a pipeline folder's
// transformer), --dtype, --memory and a writable --out.
ModelArgs step_model_args(const po::variables_map& vm) {
  if (!vm.count("model")) throw ConfigError("bench step needs --model DIR", true);
  if (!vm.count("inputs")) throw ConfigError("bench step needs --inputs IN.safetensors", true);
  ModelArgs args;
  args.model = args.path = vm["model"].as<std::string>();
  args.dtype = vm["dtype"].as<std::string>().empty() ? "fp32" : vm["dtype"].as<std::string>();
  (void)checkpoint::parse_compute_dtype(args.dtype, "--dtype");
  args.shard_modulation = vm["shard-modulation"].as<bool>();
  args.memory = memory_from(vm);
  if (vm.count("out")) {
    jobs::check_output_path(vm["out"].as<std::string>(), "--out",
                            {{"the model folder", args.model}, {"--inputs", vm["inputs"].as<std::string>()}},
                            jobs::OutputKind::Tensors);
  }
  if (checkpoint::is_pipeline_folder(args.model)) {
    auto folder = checkpoint::open_pipeline_folder(args.model);
    const auto* c = folder.find("transformer");
    if (!c) throw ConfigError(fmt::format("--model {}: pipeline has no transformer", args.model), true);
    args.path = c->path;
  }
  return args;
}

// What the forwards measured, for the report.
struct StepTimes {
  at::Tensor sample;                           // the last forward's output
  std::vector<parallel::MatmulShape> shapes;   // this rank's products, from the first forward
  std::vector<double> fwd;                     // timed forwards, slowest rank's seconds
  uint64_t peak_rss = 0;                       // this process's peak after the forwards
  memory::OffloadStats offload;
};

// `warmup` untimed forwards (the first records this rank's matrix products),
// then `iters` timed ones, on `device`.
StepTimes time_forwards(models::Model& model, const std::map<std::string, at::Tensor>& inputs,
                        dist::Communicator& world, const std::string& device, int warmup, int iters) {
  const std::string output = model.primary_output();
  StepTimes t;
  {
    parallel::MatmulRecorder recorder;  // the first (warm-up) forward records this rank's products
    t.sample = model.forward(inputs).at(output);
    t.shapes = recorder.shapes();
  }
  for (int i = 1; i < warmup; ++i) t.sample = model.forward(inputs).at(output);
  for (int i = 0; i < iters; ++i) {
    t.fwd.push_back(timed_max(world, device, [&] { t.sample = model.forward(inputs).at(output); }));
  }
  // Before the baseline allocates its operands: this process's peak so far.
  t.peak_rss = self_status_bytes("VmHWM");
  t.offload = memory::GroupOffloader::instance().stats();
  return t;
}

// Bare baseline: `shapes` run back to back with distinct operands per layer
// (as the model's weights are), in `opts`' dtype and device; `warmup` untimed
// passes, then `iters` timed ones (the slowest rank's seconds). No shapes:
// empty passes, the collectives still in step.
std::vector<double> time_bare_matmuls(dist::Communicator& world, const std::vector<parallel::MatmulShape>& shapes,
                                      bool has_bias, const at::TensorOptions& opts, int warmup, int iters) {
  struct Operands {
    at::Tensor a, w, bias;
  };
  std::vector<Operands> ops;
  for (const auto& m : shapes) {
    if (m.linear) {
      ops.push_back({at::randn({m.m, m.k}, opts), at::randn({m.n, m.k}, opts),
                     has_bias ? at::randn({m.n}, opts) : at::Tensor()});
    } else {
      ops.push_back({at::randn({m.batch, m.m, m.k}, opts), at::randn({m.batch, m.k, m.n}, opts), {}});
    }
  }
  auto bare_pass = [&] {
    for (const auto& o : ops) {
      if (o.bias.defined()) (void)at::addmm(o.bias, o.a, o.w.t());
      else if (o.w.dim() == 2) (void)at::mm(o.a, o.w.t());
      else (void)at::matmul(o.a, o.w);
    }
  };
  for (int i = 0; i < warmup; ++i) bare_pass();
  std::vector<double> bare;
  for (int i = 0; i < iters; ++i) bare.push_back(timed_max(world, opts.device().str(), bare_pass));
  return bare;
}

// Rank 0's JSON line (see the top of this file).
nlohmann::json step_report(const ModelArgs& args, const models::Model& model, const StepTimes& t,
                           const std::vector<double>& bare, bool has_bias, bool skip_bare, int tp, int warmup,
                           int iters, const Session& session, const std::map<std::string, at::Tensor>& inputs,
                           uint64_t rss_loaded) {
  const double flops = total_flops(t.shapes, true), rank_flops = total_flops(t.shapes, false);
  const double med = median(t.fwd), bare_med = median(bare);
  const memory::OffloadStats& offload = t.offload;
  nlohmann::json j = {{"model", args.path},
                      {"class", model.table().cls},
                      {"dtype", args.dtype},
                      {"tp", tp},
                      {"world", session.world()},
                      {"threads", session.threads()},
                      {"inputs", nlohmann::json::object()},
                      {"warmup", warmup},
                      {"iters", iters},
                      {"times_s", t.fwd},
                      {"median_s", med},
                      {"min_s", *std::min_element(t.fwd.begin(), t.fwd.end())},
                      {"all_reduces_per_forward", model.all_reduces_per_forward()},
                      {"matmuls", t.shapes.size()},
                      {"bare_linear_bias", has_bias},
                      {"matmul_gflop", flops / 1e9},
                      {"rank_matmul_gflop", rank_flops / 1e9},
                      {"gflops", flops / med / 1e9},
                      {"rank_gflops", rank_flops / med / 1e9},
                      {"bare_times_s", bare},
                      {"bare_median_s", bare_med},
                      {"bare_rank_gflops", rank_flops / bare_med / 1e9},
                      {"share_in_matmul", skip_bare ? 0.0 : bare_med / med},
                      {"memory", memory::describe(args.memory)},
                      {"bytes_loaded", model.bytes_loaded()},
                      {"bytes_resident_weights", model.bytes_stored()},
                      {"rss_after_load_bytes", rss_loaded},
                      {"peak_rss_bytes", t.peak_rss},
                      {"offload", {{"groups", offload.groups},
                                   {"loads", offload.loads},
                                   {"prefetch_hits", offload.prefetch_hits},
                                   {"bytes_moved", offload.bytes_moved},
                                   {"max_bytes_in_flight", offload.max_bytes_in_flight},
                                   {"wait_s", offload.wait_s},
                                   {"files_written", offload.files_written},
                                   {"files_reused", offload.files_reused}}}};
  for (const auto& [name, tensor] : inputs) j["inputs"][name] = tensor.sizes().vec();
  return j;
}

}  // namespace

int run_step_bench(const po::variables_map& vm, int* argc, char*** argv) {
  const ModelArgs args = step_model_args(vm);
  const int iters = std::max(1, vm["iters"].as<int>()), warmup = std::max(0, vm["warmup"].as<int>());

  Session session(argc, argv, session_options_from(vm));
  dist::MeshSpec spec;
  spec.tp = vm["tp"].defaulted() ? session.world() : vm["tp"].as<int>();
  auto mesh = session.make_mesh(spec);
  auto& world = mesh->world();
  parallel::TpContext tp{mesh->tp_rank(), mesh->tp_size(), mesh->tp_size() > 1 ? &mesh->tp_device() : nullptr};

  auto inputs = checkpoint::read_tensor_file(vm["inputs"].as<std::string>());
  auto model = load_component(args, tp, session.device().device);
  // Adapters (--lora): read as each rank's slices, fused or put in force for the forwards.
  const LoraArgs loras = lora_args_from(vm);
  std::unique_ptr<lora::LoraAdapters> adapters;
  nlohmann::json config;
  double lora_prepare_s = 0;
  if (!loras.set.empty()) {
    config = read_json_file(args.path + "/config.json", "config");
    world.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    adapters = std::make_unique<lora::LoraAdapters>(
        std::vector<lora::LoraComponent>{{"transformer", model.get(), &config, {}, false}});
    adapters->prepare({loras.set}, loras.strict, lora::parse_lora_apply(loras.apply, "--lora-apply"));
    adapters->activate(loras.set);
    lora_prepare_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const uint64_t rss_loaded = self_status_bytes("VmRSS");
  const StepTimes times = time_forwards(*model, inputs, world, session.device().device, warmup, iters);

  const bool skip_bare = vm["no-bare"].as<bool>();
  const auto dt = checkpoint::parse_compute_dtype(args.dtype, "--dtype");
  const auto opts = at::TensorOptions().dtype(dt).device(session.device().device);
  // The recorded shapes do not say which linear has a bias; the model's table
  // does for the model as a whole (FLUX.1: every linear, FLUX.2: none).
  const bool has_bias = std::any_of(model->table().tensors.begin(), model->table().tensors.end(),
                                    [](const models::TensorSpec& t) { return t.kind == models::TensorKind::Bias; });
  const std::vector<double> bare =
      time_bare_matmuls(world, skip_bare ? std::vector<parallel::MatmulShape>{} : times.shapes, has_bias, opts,
                        warmup, iters);

  if (session.rank() == 0) {
    nlohmann::json report = step_report(args, *model, times, bare, has_bias, skip_bare, tp.size, warmup, iters,
                                        session, inputs, rss_loaded);
    if (adapters) {
      const lora::LoraStats st = adapters->stats();
      report["lora"] = {{"files", st.files},
                        {"apply", st.fused ? "fused" : "runtime"},
                        {"why", st.why},
                        {"prepare_s", lora_prepare_s},
                        {"bytes_read", st.bytes_read},
                        {"bytes_resident", st.bytes_resident}};
    }
    std::cout << report
                     .dump()
              << std::endl;
    if (vm.count("out")) {
      jobs::OutputTemp tmp(vm["out"].as<std::string>());  // placed as check_output_path allowed, race-free
      checkpoint::write_tensor_file_f32(tmp.path(), {{model->primary_output(), times.sample}});
      tmp.place(jobs::OutputKind::Tensors);
    }
  }
  world.barrier();
  return 0;
}

}  // namespace tprun::cli
