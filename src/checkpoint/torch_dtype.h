#pragma once
// Safetensors dtypes <-> libtorch scalar types, and compute-dtype names.

#include <optional>
#include <string>

#include <c10/core/ScalarType.h>

#include "checkpoint/dtype.h"

namespace tprun::checkpoint {

// nullopt for dtypes libtorch cannot hold (F4, F6_*).
std::optional<c10::ScalarType> to_torch(Dtype dtype);
// CheckpointError for scalar types safetensors cannot store.
Dtype from_torch(c10::ScalarType type);
// "fp32" | "bf16" | "fp16" (also "float32", "bfloat16", "float16"); ConfigError naming `option`.
c10::ScalarType parse_compute_dtype(const std::string& name, const std::string& option);

}  // namespace tprun::checkpoint
