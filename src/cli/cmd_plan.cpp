// `tprun plan MANIFEST | --model DIR`: per-rank memory of each TP size and
// way of holding the components, from configs and safetensors headers only,
// and the plan with the most replicas that fits (pipelines/fit_planner.h).
#include <algorithm>
#include <filesystem>
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "jobs/job_fit.h"
#include "jobs/manifest.h"
#include "jobs/request_list.h"
#include "pipelines/fit_planner.h"
#include "runtime/cpu_binding.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/host_memory.h"
#include "runtime/rank_env.h"
#include "runtime/size_string.h"

namespace tprun::cli {
namespace {

// A positive integer flag, ConfigError naming it otherwise.
int64_t positive_flag(const po::variables_map& vm, const char* name) {
  const int64_t v = vm[name].as<int64_t>();
  if (v < 1) throw ConfigError(fmt::format("--{} {} must be at least 1", name, v), true);
  return v;
}

// The manifest's part of the query (jobs/job_fit.h, as `tprun run` asks
// it): its world where it fixes tp and dp, its device, its requests.
void query_from_manifest(const std::string& path, pipelines::FitQuery& q, int& world) {
  const jobs::Manifest m = jobs::parse_manifest(path);
  if (m.tp > 0) world = m.dp > 0 ? m.tp * m.dp : std::max(world, m.tp);
  std::error_code ec;
  std::vector<jobs::JobRequest> requests;
  if (std::filesystem::is_regular_file(m.requests, ec)) requests = jobs::read_requests(m.requests, m.defaults);
  q = jobs::fit_query(m, requests, world, m.device);  // auto | cpu | cuda: planned_device resolves auto
}

// "auto": cuda when this build has CUDA and a GPU is visible here.
std::string planned_device(const std::string& flag) {
  if (flag == "cpu" || flag == "cuda") return flag;
  if (flag != "auto") throw ConfigError(fmt::format("--device '{}' is not cpu, cuda or auto", flag), true);
  return cuda_built() && cuda_device_count() > 0 ? "cuda" : "cpu";
}

pipelines::FitQuery query_from(const po::variables_map& vm) {
  pipelines::FitQuery q;
  const auto env = rank_env_from_variables(process_env());
  int world = env ? env->world : 1;
  const bool manifest = vm.count("manifest") > 0;
  if (manifest == (vm.count("model") > 0)) {
    throw ConfigError("give a manifest or --model DIR (one of them)", true);
  }
  std::string device = "auto";
  if (manifest) {
    query_from_manifest(vm["manifest"].as<std::string>(), q, world);
    device = q.device;
  } else {
    q.folder = vm["model"].as<std::string>();
  }
  if (vm.count("device")) device = vm["device"].as<std::string>();
  q.device = planned_device(device);
  if (vm.count("world")) {
    world = vm["world"].as<int>();
    if (world < 1) throw ConfigError(fmt::format("--world {} must be at least 1", world), true);
  }
  q.world = world;
  q.ranks_per_node = env && env->local_size > 0 ? env->local_size : world;
  // A job's rank computes with its share of this node's CPUs (dist/session).
  q.threads = choose_threads(0, cpus_in_affinity_mask(), std::max(1, std::min(q.ranks_per_node, world)),
                             affinity_mask_string(), process_env())
                  .threads;
  if (vm.count("device-memory")) q.rank_memory = parse_size(vm["device-memory"].as<std::string>(), "--device-memory");
  if (vm.count("dtype")) {
    q.options.dtype = vm["dtype"].as<std::string>();
    if (q.options.dtype != "fp32" && q.options.dtype != "bf16" && q.options.dtype != "fp16") {
      throw ConfigError(fmt::format("--dtype '{}' is not fp32, bf16 or fp16", q.options.dtype), true);
    }
  }
  if (vm.count("height")) q.height = positive_flag(vm, "height");
  if (vm.count("width")) q.width = positive_flag(vm, "width");
  if (vm.count("batch")) q.batch = positive_flag(vm, "batch");
  if (vm.count("stage-requests")) q.stage_requests = positive_flag(vm, "stage-requests");
  if (!manifest && !vm.count("stage-requests")) q.stage_requests = q.batch;
  if (vm["true-cfg"].as<bool>()) q.true_cfg = true;
  return q;
}

nlohmann::json plan_json(const pipelines::FitPlan& plan) {
  nlohmann::json out;
  out["pipeline"] = plan.pipeline;
  out["device"] = plan.device;
  out["rank_memory"] = plan.rank_memory;
  out["rank_memory_source"] = plan.rank_memory_source;
  out["overhead"] = plan.overhead;
  out["request"] = {{"height", plan.height},         {"width", plan.width},
                    {"batch", plan.batch},           {"text_tokens", plan.text_tokens},
                    {"true_cfg", plan.true_cfg},     {"stage_requests", plan.stage_requests}};
  out["candidates"] = nlohmann::json::array();
  for (const auto& c : plan.candidates) {
    out["candidates"].push_back({{"tp", c.tp},
                                 {"dp", c.dp},
                                 {"stages", c.stages},
                                 {"rank", c.rank},
                                 {"phases", {{"encode", c.phases.encode}, {"denoise", c.phases.denoise},
                                             {"decode", c.phases.decode}}},
                                 {"components", c.components},
                                 {"activations", c.activations},
                                 {"kept_embeddings", c.kept_embeddings},
                                 {"peak", c.peak},
                                 {"checked_peak", c.checked_peak},
                                 {"fits", c.fits}});
  }
  out["refused"] = nlohmann::json::array();
  for (const auto& r : plan.refused) out["refused"].push_back({{"tp", r.tp}, {"reason", r.reason}});
  out["chosen"] = nullptr;
  if (plan.chosen) {
    out["chosen"] = {{"tp", plan.chosen->tp},
                     {"dp", plan.chosen->dp},
                     {"stages", plan.chosen->stages},
                     {"auto_stages", plan.auto_stages}};
  }
  return out;
}

int run_plan(const po::variables_map& vm) {
  const pipelines::FitQuery q = query_from(vm);
  const pipelines::FitPlan plan = pipelines::plan_fit(q);
  if (vm["json"].as<bool>()) {
    std::cout << plan_json(plan).dump(2) << "\n";
  } else {
    std::cout << jobs::format_fit_plan(plan, q.folder, q.world);
  }
  std::cout.flush();
  if (!plan.chosen) throw ConfigError(jobs::no_fit_message(plan, q.folder, q.world), true);
  return exit_code::kOk;
}

}  // namespace

Command plan_command() {
  Command c;
  c.name = "plan";
  c.summary = "predict each rank's memory for every TP size from configs and headers, and pick the plan that fits";
  c.usage = "[MANIFEST]";
  c.add_options = [](po::options_description& desc, po::positional_options_description& pos) {
    po::options_description o("Plan");
    o.add_options()
        ("manifest", po::value<std::string>(), "job manifest (its model, dtype, [memory], requests, batch size)")
        ("model", po::value<std::string>(), "pipeline folder (instead of a manifest)")
        ("world", po::value<int>(), "ranks of the job (default: the manifest's tp x dp, the launcher's, or 1)")
        ("device-memory", po::value<std::string>(),
         "memory of one rank, e.g. 80GB or 24GiB (default: this node's: the GPU's free memory, or the host's "
         "available memory shared by the node's ranks)")
        ("device", po::value<std::string>(), "cpu | cuda | auto (default: the manifest's, else auto)")
        ("dtype", po::value<std::string>(), "compute dtype: fp32 | bf16 | fp16 (default: the manifest's, else fp32)")
        ("height", po::value<int64_t>(), "image height of the largest request")
        ("width", po::value<int64_t>(), "image width of the largest request")
        ("batch", po::value<int64_t>(), "requests denoised together (output.batch_size)")
        ("stage-requests", po::value<int64_t>(), "staged: requests whose embeddings a round keeps")
        ("true-cfg", po::bool_switch(), "requests with a negative prompt (true CFG)")
        ("json", po::bool_switch(), "print JSON instead of a table")
        ("log-level", po::value<std::string>()->default_value(""), "trace|debug|info|warn|error");
    desc.add(o);
    pos.add("manifest", 1);
  };
  c.run = [](const po::variables_map& vm, int*, char***) {
    return run_file_tool(vm["log-level"].as<std::string>(), [&] { return run_plan(vm); });
  };
  return c;
}

}  // namespace tprun::cli
