#include "checkpoint/torch_dtype.h"

#include <fmt/format.h>

#include "runtime/error.h"

namespace tprun::checkpoint {

std::optional<c10::ScalarType> to_torch(Dtype d) {
  switch (d) {
    case Dtype::BOOL: return c10::kBool;
    case Dtype::U8: return c10::kByte;
    case Dtype::I8: return c10::kChar;
    case Dtype::F8_E5M2: return c10::ScalarType::Float8_e5m2;
    case Dtype::F8_E4M3: return c10::ScalarType::Float8_e4m3fn;
    case Dtype::F8_E8M0: return c10::ScalarType::Float8_e8m0fnu;
    case Dtype::F8_E4M3FNUZ: return c10::ScalarType::Float8_e4m3fnuz;
    case Dtype::F8_E5M2FNUZ: return c10::ScalarType::Float8_e5m2fnuz;
    case Dtype::I16: return c10::kShort;
    case Dtype::U16: return c10::ScalarType::UInt16;
    case Dtype::F16: return c10::kHalf;
    case Dtype::BF16: return c10::kBFloat16;
    case Dtype::I32: return c10::kInt;
    case Dtype::U32: return c10::ScalarType::UInt32;
    case Dtype::F32: return c10::kFloat;
    case Dtype::C64: return c10::kComplexFloat;
    case Dtype::F64: return c10::kDouble;
    case Dtype::I64: return c10::kLong;
    case Dtype::U64: return c10::ScalarType::UInt64;
    case Dtype::F4:
    case Dtype::F6_E2M3:
    case Dtype::F6_E3M2: break;
  }
  return std::nullopt;
}

Dtype from_torch(c10::ScalarType t) {
  for (int i = 0; i <= static_cast<int>(Dtype::U64); ++i) {
    const auto d = static_cast<Dtype>(i);
    auto tt = to_torch(d);
    if (tt && *tt == t) return d;
  }
  throw CheckpointError(fmt::format("dtype {} cannot be stored in safetensors", c10::toString(t)));
}

c10::ScalarType parse_compute_dtype(const std::string& name, const std::string& option) {
  if (name == "fp32" || name == "float32") return c10::kFloat;
  if (name == "bf16" || name == "bfloat16") return c10::kBFloat16;
  if (name == "fp16" || name == "float16") return c10::kHalf;
  throw ConfigError(fmt::format("{} '{}' is not a compute dtype; use fp32, bf16 or fp16", option, name));
}

}  // namespace tprun::checkpoint
