// Where and how a loaded pipeline runs (see pipeline_context.h).
#include "pipelines/pipeline_context.h"

#include <fmt/format.h>

#include "checkpoint/torch_dtype.h"
#include "runtime/error.h"

namespace tprun::pipelines {

void PipelineContext::init(const std::string& pipeline_folder, const parallel::TpContext& group,
                           const PipelineOptions& options) {
  folder = pipeline_folder;
  dtype_name = options.dtype;
  dtype = checkpoint::parse_compute_dtype(options.dtype, "dtype");
  device = c10::Device(options.device);
  tp = group;
  denoiser = options.denoiser;
  if (!options.denoiser && !options.text_encoders) {
    throw ConfigError(fmt::format("{}: a pipeline loaded with neither its text encoders nor its denoiser "
                                  "(transformer and VAE) would load nothing; turn one of them on",
                                  pipeline_folder),
                      true);
  }
}

void PipelineContext::need_denoiser(const char* call) const {
  if (denoiser) return;
  throw Error(Error::Kind::Internal,
              fmt::format("{}: {} needs the transformer and the VAE, but this pipeline was loaded without them "
                          "(the text encoders only, for the encode phase of a staged job)",
                          folder, call));
}

}  // namespace tprun::pipelines
