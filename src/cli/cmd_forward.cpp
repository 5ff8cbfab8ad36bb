// `tprun forward`: one forward of a model component under tensor parallelism,
// inputs and outputs as safetensors files (diffusers' / transformers' argument
// and output names). Any component whose class the model registry knows.
#include <chrono>

#include <ATen/core/Tensor.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint/tensor_file.h"
#include "cli/command.h"
#include "cli/lora_args.h"
#include "cli/model_args.h"
#include "cli/session_options.h"
#include "dist/communicator.h"
#include "dist/control_plane.h"
#include "dist/device_mesh.h"
#include "dist/mesh.h"
#include "dist/session.h"
#include "jobs/output_folder.h"
#include "lora/lora_adapters.h"
#include "models/model_inputs.h"
#include "models/vae.h"
#include "models/vae_split_decode.h"
#include "runtime/error.h"
#include "runtime/strict_json.h"

namespace tprun::cli {

Command forward_command() {
  Command c;
  c.name = "forward";
  c.summary = "one forward of a component (transformers under TP, text encoders, VAE): --inputs IN -> --out OUT";
  c.add_options = [](po::options_description& desc, po::positional_options_description&) {
    add_model_options(desc, true);
    po::options_description io("Forward");
    io.add_options()
        ("inputs", po::value<std::string>(),
         "safetensors inputs, by the model's argument names: Flux transformers: hidden_states, "
         "encoder_hidden_states, timestep, img_ids, txt_ids (+ pooled_projections for FLUX.1, + guidance "
         "with guidance_embeds); QwenImageTransformer2DModel: hidden_states, encoder_hidden_states, optional "
         "encoder_hidden_states_mask, timestep (t / 1000), img_shapes (int64 [B, 3]: frames, h, w in patches); "
         "WanTransformer3DModel: hidden_states [B, C, F, H, W], timestep [B] (0..1000), encoder_hidden_states; "
         "text encoders: input_ids (int64 [B, S]); vae_decoder: latents (or diffusers' z; already "
         "/ scaling_factor + shift_factor; [B, C, F, h, w] for video VAEs; at --tp > 1 decoded across the group); vae_encoder: image in [-1, 1]")
        ("out", po::value<std::string>(), "safetensors file rank 0 writes (F32; an existing file only if tprun wrote it; never in the model folder) with every "
         "output: transformers 'sample'; CLIP 'last_hidden_state' + 'pooler_output'; T5 'last_hidden_state'; "
         "vae_decoder 'sample'; vae_encoder 'mean' + 'std'")
        ("tp", po::value<int>()->default_value(1), "tensor-parallel group size (world = tp x dp)");
    desc.add(io);
    add_lora_options(desc);
    add_session_options(desc);
  };
  c.run = [](const po::variables_map& vm, int* argc, char*** argv) {
    Session session(argc, argv, session_options_from(vm));
    const ModelArgs args = model_args_from(vm);
    if (!vm.count("inputs")) throw ConfigError("--inputs is required", true);
    if (!vm.count("out")) throw ConfigError("--out is required", true);
    const LoraArgs loras = lora_args_from(vm);
    dist::MeshSpec spec;
    spec.tp = vm["tp"].as<int>();
    auto mesh = session.make_mesh(spec);
    {  // the output path: never the model, --inputs, or a file tprun did not write (jobs/output_folder.h)
      dist::ControlPlane control(session.watchdog());
      control.agree([&] {
        std::vector<jobs::ReadPath> reads = {{"the model folder", args.model},
                                                   {"the component folder", args.path},
                                                   {"the --inputs file", vm["inputs"].as<std::string>()}};
        for (const auto& l : loras.set) reads.push_back({"a --lora file", l.path});
        jobs::check_output_path(vm["out"].as<std::string>(), "--out", reads, jobs::OutputKind::Tensors);
        jobs::check_offload_folders(args.memory, "--memory", reads);
        jobs::check_output_file(vm["out"].as<std::string>(), "--out");
      });
    }
    parallel::TpContext tp{mesh->tp_rank(), mesh->tp_size(), mesh->tp_size() > 1 ? &mesh->tp_device() : nullptr};

    auto inputs = checkpoint::read_tensor_file(vm["inputs"].as<std::string>());
    const auto t0 = std::chrono::steady_clock::now();
    auto model = load_component(args, tp, session.device().device);
    // A VAE decoder's latents may carry diffusers' name for them (decode(z)).
    if (dynamic_cast<const models::Vae*>(model.get()) && inputs.count("z") && !inputs.count("latents")) {
      inputs.emplace("latents", inputs.at("z"));
      inputs.erase("z");
    }
    models::check_input_names(inputs, *model, "--inputs " + vm["inputs"].as<std::string>());
    // Adapters on this component alone: its keys as a pipeline's `<component>.` keys.
    std::unique_ptr<lora::LoraAdapters> adapters;
    nlohmann::json config;
    if (!loras.set.empty()) {
      if (!model->lora_targets()) {
        throw ConfigError(fmt::format("--lora: {} ({}) has no Linear layers an adapter can reach", args.path,
                                      model->table().cls),
                          true);
      }
      config = read_json_file(args.path + "/config.json", "config");
      adapters = std::make_unique<lora::LoraAdapters>(
          std::vector<lora::LoraComponent>{{args.component, model.get(), &config, {}, false}});
      adapters->prepare({loras.set}, loras.strict, lora::parse_lora_apply(loras.apply, "--lora-apply"));
      adapters->activate(loras.set);
    }
    const auto t1 = std::chrono::steady_clock::now();
    if (tp.comm) tp.comm->reset_stats();
    // A VAE decode at tp > 1 is spread over the group (models/vae_split_decode.h), as a pipeline's can be.
    const auto* vae = dynamic_cast<const models::Vae*>(model.get());
    const bool split_decode = vae != nullptr && tp.size > 1 && inputs.size() == 1 && inputs.count("latents") != 0;
    auto outputs = split_decode
                       ? models::TensorMap{{"sample", models::decode_across_group(*vae, inputs.at("latents"), tp)}}
                       : model->forward(inputs);
    const auto t2 = std::chrono::steady_clock::now();
    // The main output, or (a component with parts, e.g. a whole VAE given an image) the first one.
    const std::string shown = outputs.count(model->primary_output()) ? model->primary_output() : outputs.begin()->first;
    const at::Tensor& primary = outputs.at(shown);
    spdlog::info("forward: {} {} ({}) tp {} dtype {} {} {} | load {:.2f} s ({} bytes this rank) stored {} bytes, forward {:.3f} s | {}",
                 args.path, args.component, model->table().cls, tp.size, args.dtype, shown,
                 fmt::join(primary.sizes().vec(), "x"), std::chrono::duration<double>(t1 - t0).count(),
                 model->bytes_loaded(), model->bytes_stored(), std::chrono::duration<double>(t2 - t1).count(),
                 tp.comm ? tp.comm->stats().summary() : std::string("no collectives (tp 1)"));
    if (session.rank() == 0) {
      jobs::OutputTemp tmp(vm["out"].as<std::string>());  // placed as check_output_path allowed, race-free
      checkpoint::write_tensor_file_f32(tmp.path(), outputs);
      tmp.place(jobs::OutputKind::Tensors);
      spdlog::info("wrote {}", vm["out"].as<std::string>());
    }
    mesh->world().barrier();
    return 0;
  };
  return c;
}

}  // namespace tprun::cli
