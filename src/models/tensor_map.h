#pragma once
// Named tensors in and out of model components (diffusers' / transformers'
// argument and output names), and traces of intermediates for parity checks.

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace at {
class Tensor;
}

namespace tprun::models {

using TensorMap = std::map<std::string, at::Tensor>;

// Intermediates in execution order, named as a reference's debug file.
using Trace = std::vector<std::pair<std::string, at::Tensor>>;

}  // namespace tprun::models
