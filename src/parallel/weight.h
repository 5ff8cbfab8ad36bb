#pragma once
// One parameter as a layer holds it: this rank's slice of a stored tensor,
// kept by a WeightStorage and handed to compute in the compute dtype on the
// compute device. The storage is the seam where other ways of keeping weights
// (layerwise casting: a storage dtype with an up-cast per use; offload to
// host or disk) slot in without the models knowing (vLLM's LinearMethodBase:
// create_weights / apply).

#include <cstdint>
#include <memory>
#include <string>

#include <c10/core/ScalarType.h>

namespace at {
class Tensor;
}

namespace tprun::parallel {

class WeightStorage {
 public:
  virtual ~WeightStorage() = default;
  // The tensor as compute uses it (compute dtype, compute device). Cheap for
  // resident storage; may cast or fetch for others.
  virtual at::Tensor get() const = 0;
  // Bytes this storage keeps resident.
  virtual uint64_t stored_bytes() const = 0;
  // Whether get() hands out the kept tensor itself, so that changing it in
  // place changes what compute uses (resident storage; fusing a LoRA
  // adapter relies on it). False for a cast copy or an offloaded fetch.
  virtual bool kept_as_computed() const { return false; }
};

// Keeps the tensor as given (already in the compute dtype, on the device).
std::shared_ptr<WeightStorage> resident_storage(const at::Tensor& tensor);
// Layerwise casting: keeps `stored` (in the storage dtype, e.g. fp8, on the
// compute device) and hands compute a fresh `stored.to(compute)` at every
// get(): the up-cast copy lives only as long as the caller holds it
// (diffusers' LayerwiseCastingHook).
std::shared_ptr<WeightStorage> layerwise_cast_storage(const at::Tensor& stored, c10::ScalarType compute);
// Tensor `index` of offload group `group` (memory/group_offloader.h): off the
// compute device between uses, brought in by get() with its group; keeps
// nothing resident. `compute`: up-cast per use as layerwise_cast_storage does
// (layerwise casting with offload), or c10::ScalarType::Undefined to hand it
// as stored.
std::shared_ptr<WeightStorage> offloaded_storage(int group, size_t index, c10::ScalarType compute);

class Weight {
 public:
  Weight() = default;
  Weight(std::string name, std::shared_ptr<WeightStorage> storage);

  // False for a weight that was declared but not loaded (absent optional
  // tensors, parts of a model a load leaves out).
  bool defined() const { return storage_ != nullptr; }
  // The tensor for compute; Internal error naming the weight when undefined.
  at::Tensor get() const;
  const std::string& name() const { return name_; }
  uint64_t stored_bytes() const;
  bool kept_as_computed() const { return storage_ && storage_->kept_as_computed(); }

 private:
  std::string name_;
  std::shared_ptr<WeightStorage> storage_;
};

}  // namespace tprun::parallel
