#pragma once
// Turns (tensor, shard request) into a tensor on this rank's device holding
// only its slice, in the compute dtype.
//
//   ShardOnLoad   (default) reads only the slice's bytes from storage, into a
//                 host buffer of the slice's size (pinned for CUDA), then to
//                 the device: no rank ever holds a whole planned weight.
//   LoadThenShard reads every requested tensor whole, then slices in memory,
//                 as diffusers' enable_parallelism does; for comparison and
//                 for weights already in memory.

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/slice_plan.h"
#include "checkpoint/weight_source.h"

namespace at {
class Tensor;
}

namespace tprun::checkpoint {

enum class LoadMode { ShardOnLoad, LoadThenShard };

struct LoadOptions {
  LoadMode mode = LoadMode::ShardOnLoad;
  std::string device = "cpu";  // "cpu" or "cuda:N"
  std::string dtype;           // "" keeps the stored dtype; else fp32 | bf16 | fp16
};

struct LoadItem {
  std::string name;
  ShardRequest request;
};

class ShardLoader {
 public:
  ShardLoader(WeightSource& source, LoadOptions options);

  // One tensor. CheckpointError naming the tensor, dtype or dimension.
  at::Tensor load(const std::string& name, const ShardRequest& request);
  // The same in another compute dtype than the loader's ("fp32" for a layer
  // kept in full precision); "" keeps the stored dtype.
  at::Tensor load_as(const std::string& name, const ShardRequest& request, const std::string& dtype);
  // Many tensors, read file by file (one open at a time); results in item order.
  std::vector<at::Tensor> load_many(const std::vector<LoadItem>& items);

  uint64_t bytes_read() const { return source_.bytes_read(); }
  const LoadOptions& options() const { return options_; }

 private:
  at::Tensor read_whole(const std::string& name);
  at::Tensor finish(at::Tensor host, const std::string& name, const StoredTensor& info, const std::string& dtype);
  WeightSource& source_;
  LoadOptions options_;
};

// Slices a whole tensor in memory exactly as plan_slice slices it on disk.
at::Tensor slice_in_memory(const at::Tensor& full, const std::string& name, const ShardRequest& request);

}  // namespace tprun::checkpoint
