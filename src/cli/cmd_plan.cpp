// `tprun plan MANIFEST | --model DIR`: per-rank memory of each TP size and
// way of holding the components, from configs and safetensors headers only,
// and the plan with the most replicas that fits (pipelines/fit_planner.h).
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "jobs/job_fit.h"
#include "jobs/lora_paths.h"
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

// An integer flag in [lo, hi] (decimal, nothing else): ConfigError naming it
// otherwise, before any product of sizes can wrap. The flags are read as
// text so that a value past 64 bits is this error too (exit 3), not a usage one.
int64_t int_flag(const po::variables_map& vm, const char* name, int64_t lo, int64_t hi) {
  const std::string text = vm[name].as<std::string>();
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  const bool number = !text.empty() && end != text.c_str() && *end == '\0' && !std::isspace(static_cast<unsigned char>(text[0]));
  if (!number) throw ConfigError(fmt::format("--{} '{}' is not an integer", name, clip_text(text)), true);
  if (errno == ERANGE || v < lo || v > hi) {
    throw ConfigError(fmt::format("--{} {} is outside [{}, {}]", name, clip_text(text), lo, hi), true);
  }
  return v;
}

// The manifest's part of the query (jobs/job_fit.h, as `tprun run` asks
// it): its world where it fixes tp and dp, its device, its requests.
void query_from_manifest(const std::string& path, pipelines::FitQuery& q, int& world) {
  jobs::Manifest m = jobs::parse_manifest(path);
  // tp x dp is at most kMaxWorld (parse_manifest refuses more).
  if (m.tp > 0) world = m.dp > 0 ? m.tp * m.dp : std::max(world, m.tp);
  std::error_code ec;
  std::vector<jobs::JobRequest> requests;
  // Each request's adapters resolved as `tprun run` resolves them (relative to the manifest, held to the path rule).
  if (std::filesystem::is_regular_file(m.requests, ec)) {
    requests = jobs::read_job_requests(m);
  } else {
    jobs::resolve_manifest_loras(m);
  }
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
  if (vm.count("world")) world = static_cast<int>(int_flag(vm, "world", 1, kMaxWorld));
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
  // The bounds of a manifest and a requests file (pipelines/generation_request.h).
  if (vm.count("height")) q.height = int_flag(vm, "height", 1, pipelines::kMaxImageSide);
  if (vm.count("width")) q.width = int_flag(vm, "width", 1, pipelines::kMaxImageSide);
  if (vm.count("batch")) q.batch = int_flag(vm, "batch", 1, pipelines::kMaxBatchSize);
  if (vm.count("frames")) q.frames = int_flag(vm, "frames", 1, pipelines::kMaxFrames);
  if (vm["stage-experts"].as<bool>()) q.options.stage_experts = true;
  if (vm.count("stage-requests")) q.stage_requests = int_flag(vm, "stage-requests", 1, pipelines::kMaxStageRequests);
  if (!manifest && !vm.count("stage-requests")) q.stage_requests = q.batch;
  if (vm["true-cfg"].as<bool>()) q.true_cfg = true;
  if (vm.count("lora")) {
    for (const auto& p : vm["lora"].as<std::vector<std::string>>()) q.loras.push_back({p, 1.0});
  }
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
                    {"true_cfg", plan.true_cfg},     {"stage_requests", plan.stage_requests},
                    {"frames", plan.frames},         {"experts", plan.staged_experts ? "staged" : "resident"}};
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

// `plan --json`'s answer when there is no plan to print: {"error": {"kind",
// "exit_code", "message"}} on standard output, so a reader of the JSON
// always has an object (the exit code is the error's).
void print_json_error(const std::string& kind, int code, const std::string& message) {
  const nlohmann::json j = {{"error", {{"kind", kind}, {"exit_code", code}, {"message", message}}}};
  std::cout << j.dump(2) << "\n";
  std::cout.flush();
}

// The query and its plan; with --json an error on the way is also printed as JSON.
pipelines::FitPlan query_and_plan(const po::variables_map& vm, pipelines::FitQuery& q) {
  try {
    q = query_from(vm);
    return pipelines::plan_fit(q);
  } catch (const Error& e) {
    if (vm["json"].as<bool>()) print_json_error(e.kind_name(), e.exit_code(), e.what());
    throw;
  } catch (const std::exception& e) {
    if (vm["json"].as<bool>()) print_json_error("internal error", exit_code::kInternal, e.what());
    throw;
  }
}

int run_plan(const po::variables_map& vm) {
  pipelines::FitQuery q;
  const pipelines::FitPlan plan = query_and_plan(vm, q);
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
    const std::string world_help = fmt::format(
        "ranks of the job, at most {} (default: the manifest's tp x dp, the launcher's, or 1)", kMaxWorld);
    const std::string height_help =
        fmt::format("image height of the largest request (at most {})", pipelines::kMaxImageSide);
    const std::string width_help =
        fmt::format("image width of the largest request (at most {})", pipelines::kMaxImageSide);
    const std::string batch_help =
        fmt::format("requests denoised together (output.batch_size, at most {})", pipelines::kMaxBatchSize);
    o.add_options()
        ("manifest", po::value<std::string>(), "job manifest (its model, dtype, [memory], requests, batch size)")
        ("model", po::value<std::string>(), "pipeline folder (instead of a manifest)")
        ("world", po::value<std::string>(), world_help.c_str())
        ("device-memory", po::value<std::string>(),
         "memory of one rank, e.g. 80GB or 24GiB (default: this node's: the GPU's free memory, or the host's "
         "available memory shared by the node's ranks)")
        ("device", po::value<std::string>(), "cpu | cuda | auto (default: the manifest's, else auto)")
        ("dtype", po::value<std::string>(), "compute dtype: fp32 | bf16 | fp16 (default: the manifest's, else fp32)")
        ("height", po::value<std::string>(), height_help.c_str())
        ("width", po::value<std::string>(), width_help.c_str())
        ("batch", po::value<std::string>(), batch_help.c_str())
        ("stage-requests", po::value<std::string>(), "staged: requests whose embeddings a round keeps")
        ("true-cfg", po::bool_switch(), "requests with a negative prompt (true CFG)")
        ("frames", po::value<std::string>(), "frames of the longest video (a video pipeline; default: the requests')")
        ("stage-experts", po::bool_switch(),
         "two experts (Wan 2.2 A14B) held one at a time (schedule.experts = \"staged\"); default: both resident")
        ("lora", po::value<std::vector<std::string>>()->composing(),
         "a LoRA adapter file the run reads (repeatable): each rank's slices count with the transformer")
        ("json", po::bool_switch(), "print JSON instead of a table")
        ("log-level", po::value<std::string>()->default_value(""), "trace|debug|info|warn|error");
    desc.add(o);
    pos.add("manifest", 1);
  };
  c.run = [](const po::variables_map& vm, int*, char***) {
    return run_file_tool(vm["log-level"].as<std::string>(), [&] { return run_plan(vm); });
  };
  // An option the parser refuses (unknown, misspelt, given twice): with --json, a JSON error too.
  c.on_option_error = [](const std::vector<std::string>& args, const std::string& message) {
    if (std::find(args.begin(), args.end(), "--json") != args.end()) {
      print_json_error("usage error", exit_code::kUsage, message);
    }
  };
  return c;
}

}  // namespace tprun::cli
