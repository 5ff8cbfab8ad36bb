#pragma once
// The fit planner (`tprun plan`, and jobs with parallel.tp = "auto" or
// schedule.phases = "auto"): for each TP size the model allows on a world of
// ranks and each way of holding the components, the bytes one rank needs in
// each phase, whether that fits the rank's memory, and the plan with the most
// replicas. Reads config.json files and safetensors headers only.
//
// Per rank (the rank of the TP group whose peak is highest: TP rank 0, which
// holds the VAE, unless a split is uneven):
//   weights    each component this rank holds (pipeline_layout.h: sharded
//              ones by the table's TP plan, the others whole; the VAE's
//              decoder on TP rank 0), as the load keeps them
//              (models/weight_bytes.h: compute dtype, fp8 layerwise storage,
//              offload and device-map groups: those off the device count
//              their largest group, twice with prefetch)
//   act(x)     estimate_request_memory's estimate for one stage x of a
//              request of the planned size (request_memory.h): kept + x,
//              kept = the batch's latents and prompt embeddings (the check
//              before each request adds a margin: (kept + x) x 1.15 + 64 MiB)
//   overhead   what a rank holds besides (libtorch, the CUDA context)
// "together" (every component resident, as `tprun run` runs today):
//   encode  = all weights + act(text encoder)
//   denoise = all weights + act(denoising step + attention)
//   decode  = all weights + act(VAE decode)
// "staged" (encoders freed before the transformer and VAE load):
//   encode  = encoders + act(text encoder, nothing kept) + embeddings kept
//   denoise = transformer + VAE + act(step + attention) + embeddings kept
//   decode  = transformer + VAE + act(VAE decode) + embeddings kept
// where "embeddings kept" are a round's encodes (stage_requests, x 2 with
// true CFG) on a CPU rank; a GPU rank keeps them in host memory. peak = the
// largest phase + overhead (the estimate: within 15 % of the measured peak
// RSS on every CPU run of docs/memory.md "Planning a job"); fits = the same
// with the request check's margin <= the rank's memory, so a chosen plan
// is never refused by that check. The chosen
// plan: the most replicas (dp = world / tp) that fit, a tie broken by less
// memory; none when nothing fits. schedule.phases = "auto" then runs that tp
// together where together fits at it (nothing is gained by staging a job
// that fits), else staged: FitPlan::auto_stages. Byte counts saturate at
// UINT64_MAX (request_memory.h add_bytes): an absurd size never wraps small.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "pipelines/pipeline.h"

namespace tprun::pipelines {

struct FitQuery {
  std::string folder;  // the pipeline folder
  int world = 1;       // ranks of the job (at most kMaxWorld, runtime/rank_env.h)
  // "cpu" or "cuda": where the ranks compute (one rank per accelerator).
  std::string device = "cpu";
  // Memory of one rank (the device's on "cuda", the host's share on "cpu");
  // nullopt: this node's now (default_rank_memory).
  std::optional<uint64_t> rank_memory;
  // Ranks sharing this node's host memory for the default (0: all of `world`).
  int ranks_per_node = 0;
  // What a rank holds besides weights and activations; nullopt: the
  // device's default (kCpuProcessOverhead / kCudaProcessOverhead).
  std::optional<uint64_t> overhead;
  // dtype, variant, memory options (component_base.memory), shard_text_encoders,
  // shard_modulation, decode_on_every_rank; device is set from `device`.
  PipelineOptions options;
  // The requests to plan for (their height, width, max_sequence_length; an
  // unset one takes the pipeline's default): the largest image and the
  // longest text are planned for. None: one request of the defaults.
  std::vector<GenerationRequest> requests;
  // Set (> 0): every request's, overriding `requests`.
  int64_t height = 0, width = 0, max_sequence_length = 0, frames = 0;
  // The adapter files the run reads (every request's sets; the query's
  // requests' loras are added): each rank keeps its slices of every one,
  // counted with the transformer's weights (an upper bound when fused,
  // where they end in the weights). `lora_strict`: as the run maps them.
  std::vector<LoraChoice> loras;
  bool lora_strict = true;
  int64_t batch = 1;      // requests denoised together (output.batch_size)
  bool true_cfg = false;  // a negative prompt encoded and denoised too
  int64_t stage_requests = 1;  // staged: requests whose embeddings a round keeps
  // Compute threads of one rank (CPU attention keeps a block per thread);
  // 0: this process's.
  int threads = 0;
  // "" = both; "together" | "staged": only that way.
  std::string stages;
};

// What a rank holds besides weights and activations. CPU: the resident set
// of a tprun process (libtorch with its CUDA libraries, MPI) before any
// weight, measured as the peak RSS of `tprun env` and of a `tprun generate`
// refused after loading a tiny model: 478-483 MiB. GPU: the CUDA context and
// the cuBLAS workspaces on the device (an allowance, not measured here).
constexpr uint64_t kCpuProcessOverhead = uint64_t{480} << 20;
constexpr uint64_t kCudaProcessOverhead = uint64_t{1} << 30;

struct FitPhases {
  uint64_t encode = 0, denoise = 0, decode = 0;
  uint64_t peak() const;
};

struct FitCandidate {
  int tp = 1, dp = 1;
  std::string stages;  // "together" | "staged"
  int rank = 0;        // the TP rank whose numbers these are (the highest peak)
  FitPhases phases;    // without the overhead
  std::map<std::string, uint64_t> components;  // weights this rank holds on its device, per component
  uint64_t activations = 0;  // the largest act(x) of the phases
  uint64_t kept_embeddings = 0;  // staged: a round's embeddings (counted on CPU ranks)
  uint64_t peak = 0;   // largest phase + overhead: the estimate
  // The peak with the margin of the check before each request (activations
  // x 1.15 + 64 MiB, request_memory.h), over the group's ranks.
  uint64_t checked_peak = 0;
  bool fits = false;   // checked_peak <= the rank's memory
};

// A TP size the world allows that the model does not.
struct FitRefusal {
  int tp = 1;
  std::string reason;
};

struct FitChoice {
  int tp = 1, dp = 1;
  std::string stages;
};

struct FitPlan {
  std::string pipeline;  // the class
  std::string device;
  uint64_t rank_memory = 0;
  std::string rank_memory_source;  // "--device-memory", "MemAvailable / 4 ranks", ...
  uint64_t overhead = 0;
  // The request planned for.
  int64_t height = 0, width = 0, batch = 1, text_tokens = 0, frames = 1;
  bool staged_experts = false;  // the query's options.stage_experts
  bool true_cfg = false;
  int64_t stage_requests = 1;
  std::vector<FitCandidate> candidates;  // by tp, then together before staged
  std::vector<FitRefusal> refused;
  std::optional<FitChoice> chosen;
  // What schedule.phases = "auto" runs at the chosen tp: "together" where
  // together fits there, else "staged" ("" without a choice).
  std::string auto_stages;
  // The candidate (tp, stages), or nullptr.
  const FitCandidate* find(int tp, const std::string& stages) const;
  // What schedule.phases = "auto" runs at `tp`: "together" where the
  // together candidate of that tp fits, else "staged".
  std::string auto_stages_at(int tp) const;
};

// ConfigError naming the field for a world outside [1, kMaxWorld], a batch
// outside [1, kMaxBatchSize], a side above kMaxImageSide, stage_requests
// outside [1, kMaxStageRequests] (generation_request.h), an unknown dtype,
// device or stages; ConfigError as load_pipeline for a
// folder that is not a pipeline tprun has; CheckpointError for bad configs
// or checkpoints. No weight byte is read.
FitPlan plan_fit(const FitQuery& query);

// The memory one rank may use on this node now: on "cuda" device 0's free
// memory; on "cpu" the host's (cgroup, ulimit -v, MemAvailable) shared by
// `ranks_per_node`. nullopt where nothing can be read. `source` says which.
std::optional<uint64_t> default_rank_memory(const std::string& device, int ranks_per_node, std::string* source);

}  // namespace tprun::pipelines
