#pragma once
// Request checks the pipelines share.

#include <cstdint>
#include <string>
#include <vector>

#include "pipelines/generation_request.h"

namespace tprun::pipelines {

// RequestError "given tensor 'x' has shape [..]; expected [..] (meaning)"
// unless the request's given tensor `name` (when given) has `shape`; -1 in
// `shape` accepts any size there.
void need_given_shape(const GenerationRequest& request, const std::string& name, const std::vector<int64_t>& shape,
                      const std::string& meaning);

}  // namespace tprun::pipelines
