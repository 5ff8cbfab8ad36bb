#include "parallel/weight.h"

#include <ATen/core/Tensor.h>
#include <fmt/format.h>

#include "memory/group_offloader.h"
#include "runtime/error.h"

namespace tprun::parallel {
namespace {

class ResidentStorage final : public WeightStorage {
 public:
  explicit ResidentStorage(at::Tensor t) : tensor_(std::move(t)) {}
  at::Tensor get() const override { return tensor_; }
  uint64_t stored_bytes() const override { return static_cast<uint64_t>(tensor_.nbytes()); }
  bool kept_as_computed() const override { return true; }

 private:
  at::Tensor tensor_;
};

class LayerwiseCastStorage final : public WeightStorage {
 public:
  LayerwiseCastStorage(at::Tensor stored, c10::ScalarType compute) : stored_(std::move(stored)), compute_(compute) {}
  at::Tensor get() const override { return stored_.to(compute_); }
  uint64_t stored_bytes() const override { return static_cast<uint64_t>(stored_.nbytes()); }

 private:
  at::Tensor stored_;
  c10::ScalarType compute_;
};

class OffloadedStorage final : public WeightStorage {
 public:
  OffloadedStorage(int group, size_t index, c10::ScalarType compute) : group_(group), index_(index), compute_(compute) {}
  at::Tensor get() const override {
    at::Tensor t = memory::GroupOffloader::instance().get(group_, index_);
    return compute_ == c10::ScalarType::Undefined ? t : t.to(compute_);
  }
  uint64_t stored_bytes() const override { return 0; }

 private:
  int group_;
  size_t index_;
  c10::ScalarType compute_;
};

}  // namespace

std::shared_ptr<WeightStorage> offloaded_storage(int group, size_t index, c10::ScalarType compute) {
  return std::make_shared<OffloadedStorage>(group, index, compute);
}

std::shared_ptr<WeightStorage> layerwise_cast_storage(const at::Tensor& stored, c10::ScalarType compute) {
  return std::make_shared<LayerwiseCastStorage>(stored, compute);
}

std::shared_ptr<WeightStorage> resident_storage(const at::Tensor& tensor) {
  return std::make_shared<ResidentStorage>(tensor);
}

Weight::Weight(std::string name, std::shared_ptr<WeightStorage> storage)
    : name_(std::move(name)), storage_(std::move(storage)) {}

at::Tensor Weight::get() const {
  if (!storage_) {
    throw Error(Error::Kind::Internal,
                fmt::format("weight '{}' was declared but not loaded", name_.empty() ? "(unnamed)" : name_));
  }
  return storage_->get();
}

uint64_t Weight::stored_bytes() const { return storage_ ? storage_->stored_bytes() : 0; }

}  // namespace tprun::parallel
