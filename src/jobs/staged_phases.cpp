// The encode phase of a staged job: rounds, distinct texts, the chunk file
// written by TP rank 0 and agreed on by its group. See staged_phases.h.
#include "jobs/staged_phases.h"

#include <chrono>
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include "checkpoint/torch_dtype.h"
#include "dist/communicator.h"
#include "dist/control_plane.h"
#include "dist/device_mesh.h"
#include "memory/memory_options.h"
#include "runtime/error.h"

namespace tprun::jobs {

namespace {

using Clock = std::chrono::steady_clock;

// "r<replica>-<hash of the keys>.safetensors": the same keys make the same name.
std::string chunk_name(int replica, const std::vector<std::pair<std::string, models::TensorMap>>& entries) {
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0);
  for (const auto& [key, value] : entries) {
    XXH64_update(state, key.data(), key.size());
    XXH64_update(state, "\0", 1);
  }
  const uint64_t h = XXH64_digest(state);
  XXH64_freeState(state);
  return fmt::format("r{}-{:016x}.safetensors", replica, h);
}

// TP rank 0 writes the chunk (under another name when a file has its name:
// one the sweeper could not move aside); the group agrees on the outcome and
// the name (its "-<n>") before every rank indexes it.
void write_agreed(const std::vector<std::pair<std::string, models::TensorMap>>& entries, int replica,
                  EmbeddingCache& cache, dist::DeviceMesh& mesh) {
  const std::string name = chunk_name(replica, entries);
  const std::string stem = name.substr(0, name.size() - std::string(".safetensors").size());
  std::string error;
  int suffix = 0;
  if (mesh.tp_rank() == 0) {
    try {
      const std::string written = cache.write_chunk(name, entries);
      if (written != name) suffix = std::stoi(written.substr(stem.size() + 1));
    } catch (const Error& e) {
      error = e.what();
    }
  }
  at::Tensor agreed = at::tensor(std::vector<int>{error.empty() ? 0 : 1, suffix}, at::TensorOptions().dtype(at::kInt));
  if (mesh.tp_size() > 1) mesh.tp().all_reduce(agreed, {dist::ReduceOp::Max});
  if (agreed[0].item<int>() != 0) {
    if (!error.empty()) throw IoError(fmt::format("cannot write the embedding cache {}/{}: {}", cache.folder(), name, error));
    throw IoError(fmt::format("the embedding cache {}/{} could not be written by TP rank 0 of replica {} (its log "
                              "names the cause)",
                              cache.folder(), name, replica));
  }
  const int n = agreed[1].item<int>();
  if (mesh.tp_rank() != 0) cache.index_chunk(n == 0 ? name : fmt::format("{}-{}.safetensors", stem, n));
}

// The checkpoint dtype of a manifest's compute dtype.
std::optional<checkpoint::Dtype> compute_dtype(const std::string& dtype) {
  if (dtype == "fp32") return checkpoint::Dtype::F32;
  if (dtype == "bf16") return checkpoint::Dtype::BF16;
  if (dtype == "fp16") return checkpoint::Dtype::F16;
  return std::nullopt;
}

}  // namespace

std::vector<std::vector<Unit>> stage_rounds(const std::vector<Unit>& units, int64_t stage_requests) {
  std::vector<std::vector<Unit>> rounds;
  int64_t in_round = 0;
  for (const Unit& unit : units) {
    const auto n = static_cast<int64_t>(unit.size());
    if (rounds.empty() || (stage_requests > 0 && in_round + n > stage_requests && in_round > 0)) {
      rounds.emplace_back();
      in_round = 0;
    }
    rounds.back().push_back(unit);
    in_round += n;
  }
  return rounds;
}

std::string embedding_settings(const Manifest& m, int tp_size, const std::string& device) {
  const std::string kind = device.substr(0, device.find(':'));  // "cuda:1" and "cuda:0" compute alike
  return fmt::format("tprun={}\ndtype={}\ndevice={}\ntp={}\nshard_text_encoders={}\nmemory={}", TPRUN_VERSION,
                     m.dtype, kind, tp_size,
                     m.shard_text_encoders ? (*m.shard_text_encoders ? "true" : "false") : "default",
                     memory::describe(m.memory));
}

ChunkRules chunk_rules(const Manifest& manifest, const pipelines::Pipeline& pipeline,
                       const std::vector<const JobRequest*>& requests) {
  // Per key a request that needs it and the encode (the first: any gives the same check).
  auto needs = std::make_shared<std::map<std::string, std::pair<const JobRequest*, pipelines::TextEncode>>>();
  for (const JobRequest* r : requests) {
    for (auto& e : pipeline.text_encodes(r->gen)) needs->emplace(e.key, std::make_pair(r, e));
  }
  ChunkRules rules;
  rules.float_dtype = compute_dtype(manifest.dtype);
  rules.check_entry = [needs, &pipeline](const std::string& key,
                                         const std::vector<checkpoint::TensorEntry>& tensors) -> std::string {
    auto it = needs->find(key);
    if (it == needs->end()) return "";
    const auto& [request, encode] = it->second;
    auto given = std::make_shared<models::TensorMap>(request->gen.given ? *request->gen.given : models::TensorMap{});
    for (const auto& [from, to] : encode.gives) {
      auto t = std::find_if(tensors.begin(), tensors.end(), [&](const auto& e) { return e.name == from; });
      if (t == tensors.end()) return fmt::format("no '{}' tensor, which the {} of request {} needs", from,
                                                 encode.field, request->id);
      if (!checkpoint::dtype_is_computable(t->dtype))
        return fmt::format("'{}' is {}, not a floating-point embedding", from, checkpoint::dtype_name(t->dtype));
      // Only its shape and dtype are looked at: no bytes.
      (*given)[to] = at::empty(t->shape, at::TensorOptions().dtype(*checkpoint::to_torch(t->dtype)).device(at::kMeta));
    }
    pipelines::GenerationRequest trial = request->gen;
    trial.given = std::move(given);
    try {
      pipeline.check_request(trial);
    } catch (const RequestError& e) {
      return fmt::format("as the {} of request {}: {}", encode.field, request->id, e.what());
    }
    return "";
  };
  return rules;
}

std::unique_ptr<EmbeddingCache> open_embedding_cache(const std::string& output_dir, const Manifest& manifest,
                                                     int tp_size, const std::string& device,
                                                     const pipelines::Pipeline& pipeline,
                                                     const std::vector<const JobRequest*>& requests,
                                                     dist::ControlPlane& control) {
  const std::string fingerprint =
      embedding_fingerprint(manifest.model, embedding_settings(manifest, tp_size, device));
  ChunkRules rules = chunk_rules(manifest, pipeline, requests);
  std::string kept;  // the good chunks' names, one a line (plain names hold no newline)
  control.agree([&] {
    for (const auto& name : EmbeddingCache::sweep(output_dir, fingerprint, rules)) kept += name + "\n";
  });
  control.broadcast(kept);
  std::vector<std::string> names;
  std::istringstream lines(kept);
  for (std::string line; std::getline(lines, line);) names.push_back(line);
  // The sweeper checked the kept chunks against the requests; the cache keeps
  // only the rules that need no pipeline (its own writes are checked by them).
  ChunkRules index_rules;
  index_rules.float_dtype = rules.float_dtype;
  auto cache = std::make_unique<EmbeddingCache>(output_dir, fingerprint, std::move(index_rules), names);
  // Every rank has indexed the same chunks before any replica writes one.
  control.barrier();
  return cache;
}

std::vector<PendingText> pending_texts(const pipelines::Pipeline& pipeline, const std::vector<Unit>& round,
                                       const EmbeddingCache& cache, int64_t& reused) {
  std::vector<PendingText> pending;
  std::map<std::string, size_t> index;
  std::set<std::string> cached;
  for (const Unit& unit : round) {
    for (const JobRequest* r : unit) {
      for (const auto& e : pipeline.text_encodes(r->gen)) {
        if (cache.contains(e.key)) {
          if (cached.insert(e.key).second) ++reused;
          continue;
        }
        const auto [it, fresh] = index.emplace(e.key, pending.size());
        if (fresh) pending.push_back({e, {}});
        pending[it->second].users.push_back(r);
      }
    }
  }
  return pending;
}

EncodeRound encode_texts(const pipelines::Pipeline& encoders, const std::vector<PendingText>& pending, int replica,
                         EmbeddingCache& cache, dist::DeviceMesh& mesh, const std::function<bool()>& agree_stop) {
  const auto t0 = Clock::now();
  EncodeRound out;
  std::vector<std::pair<std::string, models::TensorMap>> done;
  for (const PendingText& p : pending) {
    if (agree_stop()) {
      out.stopped = true;
      break;
    }
    try {
      models::TensorMap e = encoders.encode_text(p.encode);
      for (const JobRequest* u : p.users) encoders.warn_truncation(u->gen, p.encode, e);
      done.emplace_back(p.encode.key, std::move(e));
      ++out.encoded;
    } catch (const RequestError& err) {
      for (const JobRequest* u : p.users) out.failed[u->id] = err.what();
    }
  }
  if (!done.empty()) write_agreed(done, replica, cache, mesh);
  out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return out;
}

pipelines::GenerationRequest with_embeddings(const pipelines::Pipeline& pipeline,
                                             const pipelines::GenerationRequest& request,
                                             const EmbeddingCache& cache) {
  const std::vector<pipelines::TextEncode> encodes = pipeline.text_encodes(request);
  if (encodes.empty()) return request;
  auto given = std::make_shared<models::TensorMap>(request.given ? *request.given : models::TensorMap{});
  for (const auto& e : encodes) {
    const models::TensorMap stored = cache.get(e.key);
    for (const auto& [from, to] : e.gives) {
      auto it = stored.find(from);
      if (it == stored.end()) {
        throw CheckpointError(fmt::format("the embedding cache {} holds no '{}' for the {} of request {}",
                                          cache.folder(), from, e.field, request.id));
      }
      (*given)[to] = it->second;
    }
  }
  pipelines::GenerationRequest out = request;
  out.given = std::move(given);
  return out;
}

}  // namespace tprun::jobs
