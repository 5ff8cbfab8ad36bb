// `tprun generate`: one text-to-image request through a pipeline folder (the
// pipeline model_index.json names, from the pipeline registry),
// the transformer sharded over the TP group (world = tp), rank 0 writing the
// PNG (generation parameters in text chunks) and, for parity checks, the final
// packed latents and the decoded image as safetensors.
#include <cctype>
#include <chrono>
#include <filesystem>

#include <ATen/core/Tensor.h>
#include <fmt/format.h>

#include "checkpoint/tensor_file.h"
#include "cli/memory_args.h"
#include "cli/command.h"
#include "cli/lora_args.h"
#include "cli/session_options.h"
#include "dist/communicator.h"
#include "dist/control_plane.h"
#include "dist/device_mesh.h"
#include "dist/mesh.h"
#include "jobs/output_folder.h"
#include "jobs/video_output.h"
#include "pipelines/pipeline.h"
#include "pipelines/png_image.h"
#include "pipelines/request_checks.h"
#include "runtime/error.h"
#include "runtime/out_of_memory.h"
#include "dist/session.h"

namespace tprun::cli {
namespace {

using pipelines::GenerationRequest;
namespace fs = std::filesystem;

void add_generation_options(po::options_description& desc) {
  po::options_description g("Generation (the pipeline's arguments; unset ones take the pipeline's defaults, "
                            "FluxPipeline: 1024 x 1024, 28 steps, guidance 3.5, max sequence length 512)");
  g.add_options()
      ("prompt", po::value<std::string>(), "the prompt (every text encoder gets the same text)")
      ("negative-prompt", po::value<std::string>(), "negative prompt; used when --true-cfg-scale > 1")
      ("height", po::value<int64_t>(), "image height, a multiple of 2 x the VAE scale factor")
      ("width", po::value<int64_t>(), "image width, a multiple of 2 x the VAE scale factor")
      ("steps", po::value<int64_t>(), "denoising steps (FLUX.1-schnell: 1-4)")
      ("guidance", po::value<double>(),
       "guidance scale (FLUX.1-dev's distilled guidance, FLUX.2's; refused by pipelines without it: "
       "QwenImagePipeline, FLUX.1-schnell)")
      ("true-cfg-scale", po::value<double>(),
       "true classifier-free guidance when > 1 and a negative prompt is given (two forwards per step)")
      ("seed", po::value<uint64_t>()->default_value(0), "seed of the initial noise (CPU generator, any device)")
      ("max-sequence-length", po::value<int64_t>(),
       "text tokens of the (T5 / LLM) text encoder (at most 512; QwenImagePipeline 1024)")
      ("frames", po::value<int64_t>(),
       "frames of the result (image pipelines make 1 and refuse any other; a PNG --out holds one, an .mp4 any)")
      ("fps", po::value<int64_t>(),
       "frames per second of a video (1-240; default: the pipeline's, Wan: 16); image pipelines refuse it")
      ("guidance-2", po::value<double>(),
       "guidance scale of the second expert (Wan 2.2 A14B's transformer_2); other pipelines refuse it");
  desc.add(g);
}

GenerationRequest request_from(const po::variables_map& vm) {
  GenerationRequest r;
  if (vm.count("prompt")) r.prompt = vm["prompt"].as<std::string>();
  if (vm.count("negative-prompt")) r.negative_prompt = vm["negative-prompt"].as<std::string>();
  if (vm.count("height")) r.height = vm["height"].as<int64_t>();
  if (vm.count("width")) r.width = vm["width"].as<int64_t>();
  if (vm.count("steps")) r.steps = vm["steps"].as<int64_t>();
  if (vm.count("guidance")) r.guidance = vm["guidance"].as<double>();
  if (vm.count("true-cfg-scale")) r.true_cfg_scale = vm["true-cfg-scale"].as<double>();
  r.seed = vm["seed"].as<uint64_t>();
  if (vm.count("max-sequence-length")) r.max_sequence_length = vm["max-sequence-length"].as<int64_t>();
  if (vm.count("frames")) r.frames = vm["frames"].as<int64_t>();
  if (vm.count("fps")) r.fps = vm["fps"].as<int64_t>();
  if (vm.count("guidance-2")) r.guidance_2 = vm["guidance-2"].as<double>();
  return r;
}

std::vector<std::pair<std::string, std::string>> png_text(const GenerationRequest& r, const std::string& model,
                                                          const std::string& dtype, int tp) {
  auto t = pipelines::generation_text(r, model, dtype);
  for (auto& [k, v] : t) {
    if (k == "prompt" && r.has_given("prompt_embeds")) v = "(prompt_embeds given)";
    if (k == "seed" && r.has_given("latents")) v = "(latents given)";
  }
  t.emplace_back("tp", std::to_string(tp));
  return t;
}

void add_model_options(po::options_description& desc) {
  po::options_description m("Model");
  m.add_options()
      ("model", po::value<std::string>(), "diffusers pipeline folder (model_index.json names the pipeline)")
      ("variant", po::value<std::string>()->default_value(""), "weights variant (fp16: *.fp16.safetensors)")
      ("dtype", po::value<std::string>()->default_value("fp32"), "compute dtype: fp32 | bf16 | fp16")
      ("tp", po::value<int>(), "tensor-parallel group size; default and only choice: the world size")
      ("shard-text-encoders", po::bool_switch(),
       "shard the text encoders that have a TP plan over the TP group too (FLUX.1: T5; the FLUX.2 "
       "and Qwen-Image pipelines do by default)")
      ("shard-text-encoder-2", po::bool_switch(), "the same (the name of earlier releases)")
      ("replicate-text-encoders", po::bool_switch(),
       "every rank holds the whole text encoder (the FLUX.2 and Qwen-Image pipelines shard it by "
       "default)")
      ("shard-modulation", po::bool_switch(), "also shard the transformer's AdaLN modulation linears")
      ("stage-experts", po::bool_switch(),
       "a pipeline with two experts (Wan 2.2 A14B) holds one at a time, swapping them at the boundary step "
       "(default: both resident)");
  desc.add(m);
}

void add_output_options(po::options_description& desc) {
  po::options_description io("Output");
  io.add_options()
      ("out", po::value<std::string>(),
       "PNG (or, named *.mp4, an H.264 MP4 video through the ffmpeg program) that rank 0 writes (atomically; an "
       "existing file only if tprun wrote it; never in the model folder)")
      ("inputs", po::value<std::string>(),
       "safetensors with prompt_embeds + pooled_prompt_embeds (then no text encoders are loaded), "
       "negative_prompt_embeds + negative_pooled_prompt_embeds, latents (packed initial noise)")
      ("out-tensors", po::value<std::string>(),
       "safetensors rank 0 writes: 'latents' (final, packed) and 'image' (NHWC float in [0, 1]; a frame sequence: "
       "'video', [F, H, W, 3]); the same rules as --out");
  desc.add(io);
}

// ConfigError "--flag: what" for a request value (the request's key as its flag).
[[noreturn]] void fail_flag(const std::string& key, const std::string& what) {
  std::string flag = key;
  for (char& c : flag) c = c == '_' ? '-' : c;
  throw ConfigError(fmt::format("--{}: {}", flag, what), true);
}

// The request from the flags and --inputs; ConfigError for a missing --model, output or prompt.
GenerationRequest checked_request(const po::variables_map& vm) {
  if (!vm.count("model")) throw ConfigError("--model is required (a pipeline folder)", true);
  if (!vm.count("out") && !vm.count("out-tensors")) throw ConfigError("--out (or --out-tensors) is required", true);
  GenerationRequest req = request_from(vm);
  pipelines::check_request_bounds(req, fail_flag);
  if (vm.count("inputs")) {
    req.given = std::make_shared<const models::TensorMap>(checkpoint::read_tensor_file(vm["inputs"].as<std::string>()));
    pipelines::check_given_inputs(*req.given, "--inputs " + vm["inputs"].as<std::string>());
  }
  if (!req.has_given("prompt_embeds") && !vm.count("prompt")) {
    throw ConfigError("--prompt is required (or --inputs with prompt_embeds)", true);
  }
  return req;
}

// --out names an MP4 (*.mp4, any case) rather than a PNG.
bool out_is_mp4(const po::variables_map& vm) {
  if (!vm.count("out")) return false;
  std::string ext = fs::path(vm["out"].as<std::string>()).extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext == ".mp4";
}

// --out can hold the result, checked before any step (with the flags, then
// with the pipeline's defaults), naming --out: a PNG holds one frame; an MP4
// is a video (an image pipeline's is refused), of even sizes, written by an
// ffmpeg program that is there.
void check_out_frames(const po::variables_map& vm, const GenerationRequest& req,
                      const pipelines::RequestOptions& options) {
  if (!vm.count("out")) return;
  const std::string out = vm["out"].as<std::string>();
  if (!out_is_mp4(vm)) {
    if (const std::string why = jobs::png_frames_problem(req.frame_count()); !why.empty()) {
      throw ConfigError(fmt::format("--out {}: {}; name an .mp4 --out, or write --out-tensors alone", out, why), true);
    }
    return;
  }
  if (!options.makes_videos()) {
    throw ConfigError(fmt::format("--out {}: an MP4 is a video, and {} makes images: name a .png --out", out,
                                  options.cls),
                      true);
  }
  if (req.height && req.width) {
    if (const std::string why = jobs::mp4_size_problem(*req.height, *req.width); !why.empty()) {
      throw ConfigError(fmt::format("--out {}: {}", out, why), true);
    }
  }
  if (const std::string why = jobs::mp4_writer_problem(); !why.empty()) {
    throw ConfigError(fmt::format("--out {}: {}", out, why), true);
  }
}

// One TP group of the whole world.
std::unique_ptr<dist::DeviceMesh> make_generate_mesh(const po::variables_map& vm, const Session& session) {
  dist::MeshSpec spec;
  spec.tp = vm.count("tp") ? vm["tp"].as<int>() : session.world();
  if (spec.tp != session.world()) {
    throw ConfigError(fmt::format("tprun generate makes one image with every rank in one TP group: --tp {} must "
                                  "equal the world size {} (tprun run spreads requests over dp replicas)",
                                  spec.tp, session.world()),
                      true);
  }
  return session.make_mesh(spec);
}

// The outputs can be written: checked on every rank before any weight is loaded or step run.
void check_outputs(const po::variables_map& vm, const Session& session) {
  dist::ControlPlane control(session.watchdog());
  control.agree([&] {
    // Never the model, --inputs, or a file tprun did not write (jobs/output_folder.h).
    std::vector<jobs::ReadPath> reads = {{"the model folder", vm["model"].as<std::string>()}};
    if (vm.count("inputs")) reads.push_back({"the --inputs file", vm["inputs"].as<std::string>()});
    if (vm.count("lora")) {
      for (const auto& l : vm["lora"].as<std::vector<std::string>>()) reads.push_back({"a --lora file", l});
    }
    if (vm.count("out")) {
      jobs::check_output_path(vm["out"].as<std::string>(), "--out", reads,
                              out_is_mp4(vm) ? jobs::OutputKind::Mp4 : jobs::OutputKind::Png);
      reads.push_back({"the --out file", vm["out"].as<std::string>()});
    }
    if (vm.count("out-tensors")) {
      jobs::check_output_path(vm["out-tensors"].as<std::string>(), "--out-tensors", reads,
                              jobs::OutputKind::Tensors);
    }
    jobs::check_offload_folders(memory_from(vm), "--memory", reads);
    if (vm.count("out")) jobs::check_output_file(vm["out"].as<std::string>(), "--out");
    if (vm.count("out-tensors")) jobs::check_output_file(vm["out-tensors"].as<std::string>(), "--out-tensors");
  });
}

pipelines::PipelineOptions pipeline_options(const po::variables_map& vm, const Session& session,
                                            const GenerationRequest& req) {
  pipelines::PipelineOptions opts;
  opts.dtype = vm["dtype"].as<std::string>();
  opts.device = session.device().device;
  opts.variant = vm["variant"].as<std::string>();
  if (vm["shard-text-encoders"].as<bool>() || vm["shard-text-encoder-2"].as<bool>()) opts.shard_text_encoders = true;
  if (vm["replicate-text-encoders"].as<bool>()) opts.shard_text_encoders = false;
  opts.shard_modulation = vm["shard-modulation"].as<bool>();
  opts.stage_experts = vm["stage-experts"].as<bool>();
  const memory::MemoryOptions mem = memory_from(vm);
  opts.component_base.memory = mem;
  spdlog::info("{}", memory::describe(mem));
  // Text encoders are loaded unless --inputs gives every embedding the request uses.
  const bool embeds_given = req.has_given("prompt_embeds");
  opts.text_encoders =
      !(embeds_given && (req.true_cfg_scale.value_or(1.0) <= 1.0 || req.has_given("negative_prompt_embeds")));
  return opts;
}

// Rank 0: the timings, the PNG and the tensors.
void report_and_write(const po::variables_map& vm, const pipelines::GenerationResult& res,
                      const GenerationRequest& req, const std::string& model, const std::string& dtype,
                      const parallel::TpContext& tp) {
  spdlog::info("timings: encode {:.3f} s, denoise {:.3f} s ({} steps, {:.3f} s/step), decode {:.3f} s",
               res.times.encode_s, res.times.denoise_s(), res.times.step_s.size(),
               res.times.denoise_s() / static_cast<double>(res.times.step_s.size()), res.times.decode_s);
  if (tp.comm) spdlog::info("collectives: {}", tp.comm->stats().summary());
  if (vm.count("out")) {
    const std::string out = vm["out"].as<std::string>();
    // A new file or one tprun wrote, checked again as it is placed (a file put there since is never replaced).
    if (out_is_mp4(vm)) {
      jobs::write_mp4_output(out, {res.rgb.data(), res.frames, res.height, res.width}, req.fps.value_or(0));
      spdlog::info("wrote {} ({}x{}, {} frames at {} fps)", out, res.width, res.height, res.frames,
                   req.fps.value_or(0));
    } else {
      jobs::write_png_output(out, res.rgb.data(), static_cast<int>(res.width), static_cast<int>(res.height),
                             res.frames, png_text(req, model, dtype, tp.size));
      spdlog::info("wrote {} ({}x{})", out, res.width, res.height);
    }
  }
  if (vm.count("out-tensors")) {
    const std::string out = vm["out-tensors"].as<std::string>();
    jobs::OutputTemp tmp(out);
    // An image as it always was ([1, H, W, 3]); frames as diffusers' output_type="np" video [F, H, W, 3].
    checkpoint::write_tensor_file_f32(tmp.path(),
                                      {{"latents", *res.latents}, {res.frames > 1 ? "video" : "image", *res.image}});
    tmp.place(jobs::OutputKind::Tensors);
    spdlog::info("wrote {}", out);
  }
}

// Inside the catch around the request: out of memory as a RequestError
// naming the request (exit 6); in a TP group of several ranks not marked
// all_ranks, so every rank is ended at once (the others wait in a
// collective). Anything else unchanged.
[[noreturn]] void throw_generate_out_of_memory(const GenerationRequest& req, const parallel::TpContext& tp,
                                               const std::string& device) {
  const RequestError e = out_of_memory_error(
      std::current_exception(),
      fmt::format("the request ({}x{}, seed {})", req.height.value_or(0), req.width.value_or(0), req.seed),
      device);
  if (tp.size <= 1) throw e;
  throw Error(Error::Kind::Request,
              fmt::format("{}. On TP rank {} of {} the group cannot go on in step (its other ranks wait in the same "
                          "forward), so every rank ends here",
                          e.what(), tp.rank, tp.size));
}

}  // namespace

Command generate_command() {
  Command c;
  c.name = "generate";
  c.summary = "one image (or video) from a pipeline folder under TP: --model DIR --prompt TEXT --out x.png | x.mp4";
  c.add_options = [](po::options_description& desc, po::positional_options_description&) {
    add_model_options(desc);
    add_memory_option(desc);
    add_generation_options(desc);
    add_output_options(desc);
    add_lora_options(desc);
    add_session_options(desc);
  };
  c.run = [](const po::variables_map& vm, int* argc, char*** argv) {
    Session session(argc, argv, session_options_from(vm));
    GenerationRequest req = checked_request(vm);
    const LoraArgs loras = lora_args_from(vm);
    req.loras = loras.set;
    auto mesh = make_generate_mesh(vm, session);
    check_outputs(vm, session);
    const pipelines::RequestOptions options = pipelines::request_options(vm["model"].as<std::string>());
    pipelines::check_request_options(req, options, fail_flag);
    check_out_frames(vm, req, options);
    parallel::TpContext tp{mesh->tp_rank(), mesh->tp_size(), mesh->tp_size() > 1 ? &mesh->tp_device() : nullptr};
    const pipelines::PipelineOptions opts = pipeline_options(vm, session, req);
    const std::string model = vm["model"].as<std::string>();

    const auto t0 = std::chrono::steady_clock::now();
    auto pipe = pipelines::load_pipeline(model, tp, opts);
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    req = pipe->with_defaults(req);
    pipe->check_request(req);
    check_out_frames(vm, req, options);
    pipe->prepare_loras({loras.set}, loras.strict, loras.apply);
    spdlog::info("loaded {} ({}) in {:.2f} s ({} bytes on this rank), tp {}, dtype {}", model, pipe->class_name(),
                 load_s, pipe->bytes_loaded(), tp.size, opts.dtype);
    const bool lead = session.rank() == 0;
    pipelines::GenerationResult res;
    try {
      res = pipe->generate(req, [&](int64_t i, int64_t n, double s) {
        if (lead) spdlog::info("step {}/{}: {:.3f} s", i + 1, n, s);
      });
    } catch (...) {
      throw_generate_out_of_memory(req, tp, session.device().device);
    }
    if (lead) report_and_write(vm, res, req, model, opts.dtype, tp);
    mesh->world().barrier();
    return 0;
  };
  return c;
}

}  // namespace tprun::cli
