#include "pipelines/request_checks.h"

#include <ATen/core/Tensor.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/error.h"

namespace tprun::pipelines {

void need_given_shape(const GenerationRequest& r, const std::string& name, const std::vector<int64_t>& shape,
                      const std::string& meaning) {
  if (!r.has_given(name)) return;
  const auto got = r.given->at(name).sizes().vec();
  bool ok = got.size() == shape.size();
  for (size_t i = 0; ok && i < shape.size(); ++i) ok = shape[i] < 0 || got[i] == shape[i];
  if (!ok) {
    std::vector<std::string> want;
    for (int64_t s : shape) want.push_back(s < 0 ? std::string("*") : std::to_string(s));
    throw RequestError(fmt::format("given tensor '{}' has shape [{}]; expected [{}] ({})", name, fmt::join(got, ", "),
                                   fmt::join(want, ", "), meaning),
                       true);
  }
}

}  // namespace tprun::pipelines
