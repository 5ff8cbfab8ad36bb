#include "parallel/weight.h"

#include <ATen/core/Tensor.h>
#include <fmt/format.h>

#include "runtime/error.h"

namespace tprun::parallel {
namespace {

class ResidentStorage final : public WeightStorage {
 public:
  explicit ResidentStorage(at::Tensor t) : tensor_(std::move(t)) {}
  at::Tensor get() const override { return tensor_; }
  uint64_t stored_bytes() const override { return static_cast<uint64_t>(tensor_.nbytes()); }

 private:
  at::Tensor tensor_;
};

}  // namespace

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
