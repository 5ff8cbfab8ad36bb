#include "pipelines/request_memory.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <new>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "checkpoint/torch_dtype.h"
#include "dist/communicator.h"
#include "dist/session.h"
#include "models/nn_ops.h"
#include "pipelines/pipeline.h"
#include "runtime/error.h"
#include "runtime/host_memory.h"
#include "runtime/out_of_memory.h"

namespace tprun::pipelines {
namespace {

using u64 = uint64_t;

// A byte count from a double: 0 for NaN or below, UINT64_MAX from 2^64 up (a
// plain cast is undefined there, and gave 0 for a 2147483648^2 image).
u64 bytes(double x) {
  if (!(x > 0)) return 0;
  if (x >= 18446744073709551616.0) return UINT64_MAX;
  return static_cast<u64>(x);
}

double dbl(int64_t x) { return static_cast<double>(x); }

// The flash kernels' working set: per thread a block of queries x a block of
// keys (fp32 scores, probabilities and the accumulator), plus the
// log-sum-exp rows. libtorch's CPU kernel splits 256 x 512 at most.
double flash_blocks(int64_t threads, int64_t batch, int64_t heads, double tokens) {
  return dbl(std::max<int64_t>(1, threads)) * 256.0 * 512.0 * 4.0 * 3.0 + dbl(batch) * dbl(heads) * tokens * 4.0 * 2.0;
}

// Scores [B, heads, rows, keys] with the softmax and its input alive.
double scores(int64_t batch, int64_t heads, double queries, double keys, int64_t chunk, int64_t elem) {
  const double rows = chunk > 0 ? std::min(dbl(chunk), queries) : queries;
  return dbl(batch) * dbl(heads) * rows * keys * dbl(elem) * 3.0;
}

// One result (an image, or `frames` frames) through the VAE decoder.
double vae_decode(const MemoryModel& m, int64_t height, int64_t width, int64_t frames) {
  const VaeShape& v = m.vae;
  const auto& ch = v.decoder_channels;
  if (ch.empty()) return 0;
  const int64_t sf = std::max<int64_t>(1, v.scale_factor);
  int64_t lh = height / sf, lw = width / sf;  // latent sides
  const int64_t tile_latent = v.tile_sample > 0 ? v.tile_sample / sf : 0;
  const bool tiled = v.tiling && tile_latent > 0 && (lh > tile_latent || lw > tile_latent);
  double extra = 0;
  if (tiled) {
    // Decoded tiles kept until they are blended, and the blended image.
    extra = 3.0 * dbl(height) * dbl(width) * dbl(v.elem_bytes) * 2.5;
    lh = std::min(lh, tile_latent);
    lw = std::min(lw, tile_latent);
  }
  double widest = 0;
  for (size_t l = 0; l < ch.size(); ++l) {
    // Level l's resolution (the sides doubled l times); it also holds the
    // previous level's upsampled output.
    const int64_t c = std::max(ch[l], l > 0 ? ch[l - 1] : ch[l]);
    const double up = std::ldexp(1.0, static_cast<int>(std::min<size_t>(l, 64)));
    const double pixels = dbl(lh) * up * dbl(lw) * up;
    widest = std::max(widest, 3.5 * dbl(c) * pixels * dbl(v.elem_bytes));
  }
  // A video VAE decodes one latent frame at a time: its activations span the
  // frames that latent frame becomes; the output and the tiles all frames.
  const int64_t f = std::max<int64_t>(1, frames);
  const int64_t chunk = std::min(f, std::max<int64_t>(1, v.temporal_scale));
  if (chunk > 1) widest *= dbl(chunk);
  if (f > 1) extra *= dbl(f);
  const double mid_tokens = dbl(lh) * dbl(lw);
  const double attn = v.scores_materialised
                          ? scores(1, 1, mid_tokens, mid_tokens, m.attention_chunk, v.elem_bytes)
                          : flash_blocks(m.threads, 1, 1, mid_tokens);
  // The decoded image in the pipeline's float and byte copies.
  double image = dbl(height) * dbl(width) * 3.0 * (dbl(v.elem_bytes) + 4.0 + 4.0 + 1.0 + 1.0);
  if (f > 1) image *= dbl(f);
  return widest + attn + image + extra;
}

}  // namespace

std::string MemoryEstimate::largest() const {
  const u64 denoise = add_bytes(step, attention);
  if (decode >= denoise && decode >= text) return "VAE decode";
  if (text > denoise) return "text encoder";
  return "denoising step";
}

MemoryEstimate estimate_request_memory(const MemoryModel& m, const RequestShape& r) {
  MemoryEstimate e;
  const auto& t = m.transformer;
  const int64_t tp = std::max<int64_t>(1, m.tp_size);
  const double elem = static_cast<double>(m.elem_bytes);
  const double B = static_cast<double>(std::max<int64_t>(1, r.batch));
  const double S = dbl(r.image_tokens) + dbl(r.text_tokens);
  const double D = static_cast<double>(t.inner());
  const double fp32_rope = 2.0 * 4.0 / elem;  // q and k rotated in fp32
  // This rank's share: q, k, v, q and k in fp32, the attention output, the
  // MLP's input and activation, and the single blocks' [attention, MLP] concat.
  const double mlp_in = static_cast<double>(t.mlp_in), mlp_hidden = static_cast<double>(t.mlp_hidden);
  const double local = (D * (3.0 + fp32_rope + 1.0) + mlp_in + mlp_hidden + D + mlp_hidden) / static_cast<double>(tp);
  e.step = bytes(B * S * elem * (6.0 * D + local));
  const int64_t heads_local = std::max<int64_t>(1, t.heads / tp);
  e.attention = bytes(m.scores_materialised
                          ? scores(r.batch, heads_local, S, S, m.attention_chunk, m.elem_bytes)
                          : flash_blocks(m.threads, r.batch, heads_local, S));
  if (r.encodes_text && m.text_hidden > 0) {
    // Hidden states, the gated feed-forward and the eager attention scores
    // (heads of 64, fp32 softmax) of one prompt at a time.
    const double T = static_cast<double>(r.text_tokens), H = static_cast<double>(m.text_hidden);
    e.text = bytes(T * H * elem * 16.0 + scores(1, std::max<int64_t>(1, m.text_hidden / 64), T, T,
                                                m.attention_chunk, 4));
  }
  if (m.decodes) e.decode = bytes(vae_decode(m, r.height, r.width, r.frames));
  // Latents (and the step's noise and update), prompt embeddings (x 2 for CFG).
  e.kept = bytes(B * dbl(r.image_tokens) * dbl(t.in_channels) * elem * 4.0 +
                 B * dbl(r.text_tokens) * dbl(t.joint_dim) * elem * 2.0);
  const u64 stage = std::max({e.text, add_bytes(e.step, e.attention), e.decode});
  e.peak = add_bytes(bytes(static_cast<double>(add_bytes(e.kept, stage)) * 1.15), u64{64} << 20);
  return e;
}

void fill_runtime(MemoryModel& m, const std::string& device, const std::string& dtype, const VaeShape* vae) {
  const c10::ScalarType st = checkpoint::parse_compute_dtype(dtype, "dtype");
  m.elem_bytes = static_cast<int64_t>(c10::elementSize(st));
  const auto& t = m.transformer;
  const int64_t heads_local = std::max<int64_t>(1, t.heads / std::max<int64_t>(1, m.tp_size));
  m.attention_backend = models::nn::sdpa_backend(device, st, heads_local, t.head_dim, false);
  m.scores_materialised = m.attention_backend.find("math") != std::string::npos;
  m.threads = at::get_num_threads();
  m.decodes = vae != nullptr;
  if (vae) m.vae = *vae;
}

RequestShape batch_shape(const Pipeline& pipeline, const std::vector<GenerationRequest>& rs) {
  RequestShape s;
  if (rs.empty()) return s;
  const GenerationRequest& r = rs.front();
  s.batch = static_cast<int64_t>(rs.size());
  s.height = r.height.value_or(0);
  s.width = r.width.value_or(0);
  s.frames = r.frame_count();
  s.image_tokens = pipeline.latent_tokens(r);
  s.encodes_text = !r.has_given("prompt_embeds");
  s.text_tokens = s.encodes_text ? r.max_sequence_length.value_or(512) : r.given->at("prompt_embeds").size(1);
  return s;
}

void check_batch_memory(const MemoryModel& m, const RequestShape& r, const parallel::TpContext& tp,
                        const std::string& device) {
  if (const char* off = std::getenv("TPRUN_MEMORY_CHECK"); off && std::string(off) == "0") return;
  const MemoryEstimate e = estimate_request_memory(m, r);
  const c10::Device dev(device);
  const int cuda_index = dev.is_cuda() ? static_cast<int>(dev.has_index() ? dev.index() : 0) : -1;
  const HostMemory mem = device_memory(cuda_index);
  // Node-wide limits (cgroup, MemAvailable) are shared with this node's other ranks.
  const Session* session = Session::current();
  const int sharing = session && session->env().local_size > 0 ? session->env().local_size : 1;
  const MemoryLimit* tight = mem.tightest(sharing);
  const auto avail = mem.available(sharing);
  // Per rank: need, have (-1: unknown), the limit and what counts against it.
  // Saturated at INT64_MAX for the exchange: a peak past it must not turn negative (and pass).
  auto signed_bytes = [](u64 b) { return static_cast<int64_t>(std::min<u64>(b, INT64_MAX)); };
  std::vector<int64_t> mine = {signed_bytes(e.peak), avail ? signed_bytes(*avail) : -1,
                               tight ? signed_bytes(tight->limit) : 0, tight ? signed_bytes(tight->used) : 0, 0};
  if (tight) {
    static const char* kinds[] = {"RLIMIT_AS", "MemAvailable", "cuda"};
    for (int64_t k = 0; k < 3; ++k) {
      if (tight->name.rfind(kinds[k], 0) == 0) mine[4] = k + 1;
    }
  }
  at::Tensor all = at::tensor(mine, at::TensorOptions().dtype(at::kLong));
  if (tp.size > 1 && tp.comm) {
    all = tp.comm->all_gather(all.to(dev)).cpu();
  }
  const auto* v = all.data_ptr<int64_t>();
  const int64_t ranks = all.numel() / 5;
  for (int64_t k = 0; k < ranks; ++k) {
    const int64_t need = v[k * 5], have = v[k * 5 + 1];
    if (have < 0 || need <= have) continue;
    static const char* names[] = {"cgroup memory limit", "RLIMIT_AS (ulimit -v)", "MemAvailable", "free device memory"};
    const std::string limit = fmt::format("{}: {} limit, {} in use{}", names[std::clamp<int64_t>(v[k * 5 + 4], 0, 3)],
                                          format_bytes(static_cast<u64>(v[k * 5 + 2])),
                                          format_bytes(static_cast<u64>(v[k * 5 + 3])),
                                          sharing > 1 && v[k * 5 + 4] != 1 && v[k * 5 + 4] != 3
                                              ? fmt::format(", shared by {} ranks of the node", sharing)
                                              : std::string());
    std::vector<std::string> hints = {"a smaller height/width"};
    if (m.decodes && e.decode >= add_bytes(e.step, e.attention) && !m.vae.tiling) {
      hints.push_back("--memory vae_tiling=true (decode bounded by one tile)");
    }
    if (m.scores_materialised && m.attention_chunk == 0) {
      hints.push_back("--memory attention_chunk=4096 (attention scores bounded by the chunk)");
    }
    if (e.step > e.decode) hints.push_back("a larger tp (activations split over the group)");
    if (r.batch > 1) hints.push_back("a smaller batch_size");
    const std::string where = ranks > 1 ? fmt::format(" on TP rank {} of {}", k, ranks) : std::string();
    if (r.frames > 1) hints.push_back("fewer frames");
    throw RequestError(
        fmt::format("{}x{}{} (batch {}) needs about {} of memory{} (VAE decode {}, denoising step {}, attention {}, "
                    "text encoder {}; beyond the {} of weights held) but only {} is available ({}); try {}",
                    r.height, r.width, r.frames > 1 ? fmt::format(", {} frames", r.frames) : std::string(), r.batch,
                    format_bytes(static_cast<u64>(need)), where, format_bytes(e.decode),
                    format_bytes(e.step), format_bytes(e.attention), format_bytes(e.text),
                    format_bytes(m.weights_bytes), format_bytes(static_cast<u64>(have)), limit,
                    fmt::join(hints, ", or ")),
        true);
  }
  spdlog::debug("memory estimate ({}) {}x{} (batch {}): {}, largest the {} (step {}, attention {} with the {}, VAE decode "
                "{}, text {}, kept {}), available {}",
                m.pipeline, r.height, r.width, r.batch, format_bytes(e.peak), e.largest(), format_bytes(e.step),
                format_bytes(e.attention),
                m.attention_backend, format_bytes(e.decode), format_bytes(e.text), format_bytes(e.kept),
                avail ? format_bytes(*avail) : std::string("unknown"));
}

void rethrow_generation_failure(const parallel::TpContext& tp) {
  const std::exception_ptr ex = std::current_exception();
  try {
    std::rethrow_exception(ex);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    // One rule for what an allocation failure is: the job loop's (runtime/out_of_memory.h).
    if (!is_out_of_memory(ex)) throw;
    std::string what = e.what();
    if (const auto nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
    const HostMemory mem = host_memory();
    const auto avail = mem.available();
    const std::string msg = fmt::format(
        "ran out of memory while generating ({}; {} available now); try a smaller height/width, "
        "--memory vae_tiling=true or --memory attention_chunk=4096",
        what, avail ? format_bytes(*avail) : std::string("availability unknown"));
    // Nested: the caller that knows the request (runtime/out_of_memory.h) can
    // still read the allocator's exception.
    if (tp.size <= 1) std::throw_with_nested(RequestError(msg, true));
    // Peers of the TP group may be waiting in a collective this rank will
    // never join: the job cannot go on in step.
    std::throw_with_nested(
        Error(Error::Kind::Request, fmt::format("TP rank {} of {} {}; the TP group cannot continue in step, ending "
                                                "the job", tp.rank, tp.size, msg)));
  }
}

}  // namespace tprun::pipelines
