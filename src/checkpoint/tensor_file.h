#pragma once
// Whole small safetensors files as named tensors: model inputs and outputs
// (`tprun forward --inputs/--out`, reference cases). Reading goes through the
// strict reader (ComponentCheckpoint + SafetensorsSource); writing through
// write_safetensors.

#include <map>
#include <string>

namespace at {
class Tensor;
}

namespace tprun::checkpoint {

// Every tensor of one .safetensors file, in its stored dtype, on the CPU.
// CheckpointError naming the file (and tensor) when malformed.
std::map<std::string, at::Tensor> read_tensor_file(const std::string& path);

// The safetensors __metadata__ entry write_tensor_file_f32 adds, by which
// tprun knows a file it may replace (jobs/output_folder.h).
inline constexpr const char* kTensorFileWriterKey = "written_by";
inline constexpr const char* kTensorFileWriter = "tprun";

// Writes the tensors as F32 (converted, moved to the CPU), atomically, with
// the metadata {kTensorFileWriterKey: kTensorFileWriter}.
void write_tensor_file_f32(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                           bool overwrite = true);

}  // namespace tprun::checkpoint
