#include "checkpoint/tensor_file.h"

#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "checkpoint/component_checkpoint.h"
#include "checkpoint/safetensors_source.h"
#include "checkpoint/safetensors_writer.h"
#include "checkpoint/shard_loader.h"

namespace tprun::checkpoint {

std::map<std::string, at::Tensor> read_tensor_file(const std::string& path) {
  auto ck = std::make_shared<const ComponentCheckpoint>(ComponentCheckpoint::open(path));
  SafetensorsSource source(ck);
  ShardLoader loader(source, {});
  std::map<std::string, at::Tensor> out;
  for (const auto& name : ck->tensor_names()) out[name] = loader.load(name, {});
  source.close();
  return out;
}

void write_tensor_file_f32(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                           bool overwrite) {
  std::vector<at::Tensor> keep;  // owns the converted buffers while writing
  std::vector<TensorPayload> payloads;
  for (const auto& [name, t] : tensors) {
    keep.push_back(t.detach().to(at::kCPU, at::kFloat).contiguous());
    TensorPayload p;
    p.name = name;
    p.dtype = Dtype::F32;
    p.shape = keep.back().sizes().vec();
    p.data = keep.back().data_ptr();
    payloads.push_back(std::move(p));
  }
  write_safetensors(path, std::move(payloads), {{kTensorFileWriterKey, kTensorFileWriter}}, overwrite);
}

}  // namespace tprun::checkpoint
