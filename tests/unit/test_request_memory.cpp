// Per-request memory checks: the per-request memory estimate (monotone in size
// and batch, the memory features accounted for), the host limit parsers,
// allocation failures as request errors, and the CPU binding / thread rules.
#include <map>
#include <new>

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include "pipelines/request_memory.h"
#include "runtime/cpu_binding.h"
#include "runtime/error.h"
#include "runtime/host_memory.h"
#include "runtime/out_of_memory.h"

namespace tprun {
namespace {

using pipelines::MemoryModel;
using pipelines::RequestShape;
using pipelines::estimate_request_memory;

// FLUX.1 [dev]'s shapes on one CPU rank, fp32, flash CPU kernel.
MemoryModel flux1() {
  MemoryModel m;
  m.pipeline = "FluxPipeline";
  m.transformer = {24, 128, 4 * 3072, 4 * 3072, 64, 4096};
  m.elem_bytes = 4;
  m.text_hidden = 4096;
  m.decodes = true;
  m.vae.decoder_channels = {512, 512, 256, 128};
  m.vae.latent_channels = 16;
  m.vae.scale_factor = 8;
  m.vae.elem_bytes = 4;
  m.vae.tile_sample = 1024;
  m.threads = 2;
  return m;
}

RequestShape shape(int64_t side, int64_t batch = 1) {
  RequestShape r;
  r.batch = batch;
  r.height = r.width = side;
  r.image_tokens = (side / 16) * (side / 16);
  r.text_tokens = 512;
  return r;
}

TEST(RequestMemory, GrowsWithSizeAndBatch) {
  const MemoryModel m = flux1();
  uint64_t last = 0;
  for (int64_t side : {256, 512, 1024, 2048, 4096, 16384}) {
    const auto e = estimate_request_memory(m, shape(side));
    EXPECT_GT(e.peak, last) << side;
    EXPECT_GE(e.peak, e.decode) << side;
    last = e.peak;
  }
  EXPECT_GT(estimate_request_memory(m, shape(1024, 4)).step, estimate_request_memory(m, shape(1024, 1)).step);
  // Decode is per image whatever the batch.
  EXPECT_EQ(estimate_request_memory(m, shape(1024, 4)).decode, estimate_request_memory(m, shape(1024, 1)).decode);
  // 16384² is far beyond any host (a size the estimate once let through).
  EXPECT_GT(estimate_request_memory(m, shape(16384)).peak, uint64_t{256} << 30);
}

// Issue 32: results are frame sequences. One frame is the image it always
// was (whatever the VAE's temporal factor); more frames grow the decode by
// the frames a latent frame becomes and the output by all of them.
TEST(RequestMemory, FramesScaleTheDecodeAndLeaveImagesAlone) {
  const MemoryModel image_vae = flux1();
  MemoryModel video_vae = flux1();
  video_vae.vae.temporal_scale = 4;
  const RequestShape one = shape(512);
  EXPECT_EQ(one.frames, 1);
  const auto e1 = estimate_request_memory(image_vae, one);
  const auto v1 = estimate_request_memory(video_vae, one);
  EXPECT_EQ(v1.decode, e1.decode);
  EXPECT_EQ(v1.peak, e1.peak);
  RequestShape two = one, nine = one, eightyone = one;
  two.frames = 2;
  nine.frames = 9;
  eightyone.frames = 81;
  const uint64_t d2 = estimate_request_memory(video_vae, two).decode;
  const uint64_t d9 = estimate_request_memory(video_vae, nine).decode;
  const uint64_t d81 = estimate_request_memory(video_vae, eightyone).decode;
  EXPECT_GT(d2, e1.decode);
  EXPECT_GT(d9, d2);
  EXPECT_GT(d81, d9);
  // Past the temporal chunk only the decoded frames grow, by the same bytes a frame.
  const double per_frame = 512.0 * 512 * 3 * (4 + 4 + 4 + 1 + 1);
  EXPECT_NEAR(static_cast<double>(d81 - d9), 72 * per_frame, 1.0);
  // An image VAE's activations do not span frames: only the output grows.
  EXPECT_NEAR(static_cast<double>(estimate_request_memory(image_vae, nine).decode - e1.decode), 8 * per_frame, 1.0);
  // The step and the text do not depend on frames here (the pipeline's latent tokens carry them).
  EXPECT_EQ(estimate_request_memory(video_vae, nine).step, e1.step);
}

TEST(RequestMemory, DecodeMatchesTheMeasuredFluxVae) {
  // docs/benchmarks.md "Memory": FLUX.1's VAE decode, fp32, peak RSS minus
  // ~0.6 GiB of weights and libtorch: 1024² 3.5 GiB, 2048² 14.0 GiB.
  MemoryModel m = flux1();
  const double gib = 1024.0 * 1024 * 1024;
  const double d1 = static_cast<double>(estimate_request_memory(m, shape(1024)).decode) / gib;
  const double d2 = static_cast<double>(estimate_request_memory(m, shape(2048)).decode) / gib;
  EXPECT_GT(d1, 3.5 * 0.95);
  EXPECT_LT(d1, 3.5 * 1.4);
  EXPECT_GT(d2, 14.0 * 0.95);
  EXPECT_LT(d2, 14.0 * 1.4);
}

TEST(RequestMemory, VaeTilingBoundsTheDecode) {
  MemoryModel plain = flux1(), tiled = flux1();
  tiled.vae.tiling = true;
  const auto p4 = estimate_request_memory(plain, shape(4096)), t4 = estimate_request_memory(tiled, shape(4096));
  const auto t2 = estimate_request_memory(tiled, shape(2048));
  EXPECT_LT(t4.decode * 4, p4.decode);
  // Beyond one tile, only the 3-channel image grows (16x the pixels, not 16x the decode).
  EXPECT_LT(t4.decode, t2.decode * 2);
  // At or below the tile, tiling changes nothing.
  EXPECT_EQ(estimate_request_memory(plain, shape(1024)).decode, estimate_request_memory(tiled, shape(1024)).decode);
  // A rank that does not decode has no decode term.
  MemoryModel no_vae = flux1();
  no_vae.decodes = false;
  EXPECT_EQ(estimate_request_memory(no_vae, shape(4096)).decode, 0u);
}

TEST(RequestMemory, AttentionChunkBoundsMaterialisedScores) {
  MemoryModel math = flux1();
  math.scores_materialised = true;
  math.decodes = false;
  MemoryModel chunked = math;
  chunked.attention_chunk = 1024;
  const auto a = estimate_request_memory(math, shape(2048)), b = estimate_request_memory(chunked, shape(2048));
  EXPECT_GT(a.attention, 10 * b.attention);  // S = 16896 rows vs 1024
  EXPECT_LT(b.peak, a.peak);
  // The flash kernels never build the scores: the chunk changes nothing there.
  MemoryModel flash = flux1(), flash_chunked = flux1();
  flash_chunked.attention_chunk = 1024;
  EXPECT_EQ(estimate_request_memory(flash, shape(2048)).attention,
            estimate_request_memory(flash_chunked, shape(2048)).attention);
  EXPECT_LT(estimate_request_memory(flash, shape(2048)).attention, a.attention / 100);
}

TEST(RequestMemory, TensorParallelSplitsTheStep) {
  MemoryModel one = flux1(), four = flux1();
  four.tp_size = 4;
  EXPECT_LT(estimate_request_memory(four, shape(2048)).step, estimate_request_memory(one, shape(2048)).step);
  // Given prompt embeddings: no text encoder pass.
  RequestShape r = shape(512);
  r.encodes_text = false;
  EXPECT_EQ(estimate_request_memory(one, r).text, 0u);
  EXPECT_GT(estimate_request_memory(one, shape(512)).text, 0u);
}

TEST(RequestMemory, AllocationFailuresBecomeRequestErrors) {
  // What counts as an allocation failure is runtime/out_of_memory.h's rule.
  EXPECT_TRUE(is_out_of_memory(std::make_exception_ptr(std::bad_alloc())));
  const c10::Error cpu_oom({"f", "x.cpp", 1},
                           "DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes");
  EXPECT_TRUE(is_out_of_memory(std::make_exception_ptr(cpu_oom)));
  const c10::Error other({"f", "x.cpp", 1}, "shape mismatch");
  EXPECT_FALSE(is_out_of_memory(std::make_exception_ptr(other)));
  EXPECT_FALSE(is_out_of_memory(std::make_exception_ptr(std::runtime_error("out of memory"))));

  auto convert = [](const parallel::TpContext& tp, auto thrower) {
    try {
      try {
        thrower();
      } catch (...) {
        pipelines::rethrow_generation_failure(tp);
      }
    } catch (const RequestError& e) {
      return std::string("request: ") + e.what();
    } catch (const Error& e) {
      return std::string("error ") + e.kind_name() + (e.all_ranks() ? " all" : " one") + ": " + e.what();
    } catch (const std::exception& e) {
      return std::string("other: ") + e.what();
    }
    return std::string("none");
  };
  const parallel::TpContext alone{}, group{1, 2, nullptr};
  const std::string r1 = convert(alone, [&] { throw cpu_oom; });
  EXPECT_EQ(r1.rfind("request: ran out of memory", 0), 0u) << r1;
  EXPECT_NE(r1.find("vae_tiling=true"), std::string::npos) << r1;
  EXPECT_EQ(convert(alone, [] { throw std::bad_alloc(); }).rfind("request: ", 0), 0u);
  // Inside a TP group it ends the job (not a RequestError the runner would swallow).
  const std::string r2 = convert(group, [] { throw std::bad_alloc(); });
  EXPECT_EQ(r2.rfind("error request error one: TP rank 1 of 2 ran out of memory", 0), 0u) << r2;
  EXPECT_EQ(convert(alone, [&] { throw other; }).rfind("other: ", 0), 0u);
  EXPECT_EQ(convert(alone, [] { throw ConfigError("x"); }), "error config error one: x");
}

TEST(HostMemory, ParsersAndTheTightestLimit) {
  EXPECT_FALSE(parse_cgroup_limit("max\n"));
  EXPECT_FALSE(parse_cgroup_limit("12ab"));
  EXPECT_EQ(parse_cgroup_limit("4294967296\n").value(), 4294967296u);
  const std::string status = "Name:\ttprun\nVmPeak:\t  9000 kB\nVmSize:\t  4096 kB\n";
  EXPECT_EQ(parse_status_kb(status, "VmSize").value(), 4096u * 1024);
  EXPECT_FALSE(parse_status_kb(status, "VmRSS"));
  HostMemory m;
  m.limits.push_back({"MemAvailable", 0, 0, 8ull << 30, true});
  m.limits.push_back({"RLIMIT_AS (ulimit -v)", 4ull << 30, 1ull << 30, 3ull << 30, false});
  EXPECT_EQ(m.available(1).value(), 3ull << 30);
  EXPECT_EQ(m.tightest(1)->name, "RLIMIT_AS (ulimit -v)");
  // Shared by 4 ranks of the node, MemAvailable leaves each 2 GiB.
  EXPECT_EQ(m.available(4).value(), 2ull << 30);
  EXPECT_EQ(m.tightest(4)->name, "MemAvailable");
  EXPECT_FALSE(HostMemory{}.available());
  // This process: at least MemAvailable is readable on Linux.
  EXPECT_TRUE(host_memory().available());
  EXPECT_EQ(format_bytes(3ull << 29), "1.50 GiB");
}

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& k) -> std::optional<std::string> {
    auto it = vars.find(k);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(CpuBinding, WarnsWhenOpenMpisBindingLeavesTheNodeIdle) {
  EXPECT_EQ(parse_cpu_list("0-3,8,10-11"), (std::set<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_TRUE(parse_cpu_list("0-x").empty());
  const auto ompi_default = env_of({{"OMPI_COMM_WORLD_SIZE", "1"}, {"OMPI_MCA_orte_bound_at_launch", "1"}});
  // mpirun -np 1 on 64 CPUs: bound to one core.
  auto w = binding_warning(cpu_binding_facts(ompi_default, 64, 1, {"0"}));
  ASSERT_TRUE(w);
  EXPECT_NE(w->find("--bind-to none"), std::string::npos) << *w;
  EXPECT_NE(w->find("--map-by slot:PE=64"), std::string::npos) << *w;
  EXPECT_NE(w->find("leaving 63 of the node's 64 CPUs idle"), std::string::npos) << *w;
  // mpirun -np 1 on 2 CPUs leaves half: warns; -np 2 uses both: no warning.
  EXPECT_TRUE(binding_warning(cpu_binding_facts(ompi_default, 2, 1, {"0"})));
  EXPECT_FALSE(binding_warning(cpu_binding_facts(ompi_default, 2, 1, {"0", "1"})));
  // -np 2 on 64 CPUs bound to cores: warns, PE = 32.
  w = binding_warning(cpu_binding_facts(ompi_default, 64, 1, {"0", "1"}));
  ASSERT_TRUE(w);
  EXPECT_NE(w->find("PE=32"), std::string::npos) << *w;
  // --bind-to core said explicitly still leaves the node idle: warns.
  const auto core = env_of({{"OMPI_COMM_WORLD_SIZE", "1"}, {"OMPI_MCA_orte_bound_at_launch", "1"},
                            {"OMPI_MCA_hwloc_base_binding_policy", "core"}});
  EXPECT_TRUE(binding_warning(cpu_binding_facts(core, 64, 1, {"0"})));
  // --bind-to none, another launcher, or a binding that uses the node: silent.
  const auto none = env_of({{"OMPI_COMM_WORLD_SIZE", "1"}, {"OMPI_MCA_hwloc_base_binding_policy", "none"}});
  EXPECT_FALSE(binding_warning(cpu_binding_facts(none, 64, 64, {"0-63"})));
  EXPECT_FALSE(binding_warning(cpu_binding_facts(none, 64, 1, {"0"})));
  EXPECT_FALSE(binding_warning(cpu_binding_facts(env_of({{"SLURM_PROCID", "0"}}), 64, 1, {"0"})));
  EXPECT_FALSE(binding_warning(cpu_binding_facts(ompi_default, 64, 16, {"0-15", "16-31", "32-47", "48-63"})));
}

TEST(CpuBinding, ThreadsFromFlagSlurmOrTheMask) {
  const auto plain = env_of({});
  auto t = choose_threads(0, 8, 2, "0-7", plain);
  EXPECT_EQ(t.threads, 4);
  EXPECT_FALSE(t.warning);
  t = choose_threads(0, 64, 4, "0-63", env_of({{"SLURM_CPUS_PER_TASK", "8"}}));
  EXPECT_EQ(t.threads, 8);
  EXPECT_EQ(t.reason, "SLURM_CPUS_PER_TASK=8");
  EXPECT_EQ(choose_threads(0, 4, 1, "0-3", env_of({{"SLURM_CPUS_PER_TASK", "8"}})).threads, 4);
  EXPECT_THROW(choose_threads(0, 4, 1, "0-3", env_of({{"SLURM_CPUS_PER_TASK", "x"}})), ConfigError);
  t = choose_threads(8, 2, 1, "0-1", plain);
  EXPECT_EQ(t.threads, 8);
  ASSERT_TRUE(t.warning);
  EXPECT_NE(t.warning->find("--threads 8 exceeds the 2 CPU(s)"), std::string::npos) << *t.warning;
  EXPECT_FALSE(choose_threads(2, 2, 1, "0-1", plain).warning);
  EXPECT_THROW(choose_threads(-1, 2, 1, "0-1", plain), ConfigError);
}

}  // namespace
}  // namespace tprun
