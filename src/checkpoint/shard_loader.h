#pragma once
// Turns (tensor, shard request) into a tensor on this rank's device holding
// only its slice, in the compute dtype.
//
//   ShardOnLoad   (default) reads only the slice's bytes from storage, then
//                 to the device: no rank ever holds a whole planned weight.
//   LoadThenShard reads every requested tensor whole, then slices in memory,
//                 as diffusers' enable_parallelism does; for comparison and
//                 for weights already in memory.
//
// For a CUDA device the slices go through a StagingPipeline
// (pinned_staging.h): two pinned host buffers reused for every slice (grown
// to the largest), the next slice read from storage while the previous one
// is copied on a copy stream; the compute stream waits for each copy, then
// converts the stored-dtype device tensor to the compute/kept dtype.
//
// On the host, a slice kept in another dtype than it is stored in (a bf16
// checkpoint computed in fp32, fp8 layerwise storage) is read into a staging
// buffer the loader reuses for every such slice and converted from there into
// the tensor that is kept. The staging buffer is a mapping of its own,
// unmapped with the loader: the stored-dtype copies never pass through the
// heap, where glibc keeps the pages of freed chunks mapped (they would stay
// in the process's RSS after the load).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include "checkpoint/slice_plan.h"
#include "checkpoint/weight_source.h"

namespace at {
class Tensor;
}

namespace tprun::checkpoint {

class StagingPipeline;

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
  ~ShardLoader();
  ShardLoader(const ShardLoader&) = delete;
  ShardLoader& operator=(const ShardLoader&) = delete;

  // One tensor. CheckpointError naming the tensor, dtype or dimension.
  at::Tensor load(const std::string& name, const ShardRequest& request);
  // The same in another compute dtype than the loader's ("fp32" for a layer
  // kept in full precision); "" keeps the stored dtype.
  at::Tensor load_as(const std::string& name, const ShardRequest& request, const std::string& dtype);
  // The same in the loader's compute dtype, then kept in `storage`
  // (layerwise casting's float8 types): equal to load(...).to(storage), with
  // only the kept tensor allocated on the host.
  at::Tensor load_cast(const std::string& name, const ShardRequest& request, c10::ScalarType storage);
  // Many tensors, read file by file (one open at a time); results in item order.
  std::vector<at::Tensor> load_many(const std::vector<LoadItem>& items);

  uint64_t bytes_read() const { return source_.bytes_read(); }
  const LoadOptions& options() const { return options_; }

 private:
  class Staging;
  // load_as / load_cast: kept = `storage`, or the compute dtype where it is Undefined.
  at::Tensor load_kept(const std::string& name, const ShardRequest& request, const std::string& dtype,
                       c10::ScalarType storage);
  at::Tensor read_whole(const std::string& name);
  // The dtype `dtype` ("" = as stored) computes `info` in; CheckpointError for a stored type that cannot be.
  c10::ScalarType compute_type(const std::string& name, const StoredTensor& info, const std::string& dtype) const;
  at::Tensor finish(at::Tensor host, const std::string& name, const StoredTensor& info, const std::string& dtype);
  // A host slice read into the staging buffer and converted stored -> compute -> kept from there.
  at::Tensor load_staged(const std::string& name, const ShardRequest& request, const SlicePlan& plan,
                         c10::ScalarType stored, c10::ScalarType compute, c10::ScalarType kept);
  // A slice read through the device staging pipeline into a new device
  // tensor in the stored dtype, ordered before the compute stream's later work.
  at::Tensor upload_slice(const std::string& name, const ShardRequest& request, const SlicePlan& plan,
                          c10::ScalarType stored);
  WeightSource& source_;
  LoadOptions options_;
  std::unique_ptr<Staging> staging_;
  std::unique_ptr<StagingPipeline> uploads_;  // made on the first CUDA load
};

// Slices a whole tensor in memory exactly as plan_slice slices it on disk.
at::Tensor slice_in_memory(const at::Tensor& full, const std::string& name, const ShardRequest& request);

}  // namespace tprun::checkpoint
