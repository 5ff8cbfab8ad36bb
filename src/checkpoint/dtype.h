#pragma once
// Every dtype string of the safetensors format (safetensors 0.8): name, width
// in bits, and whether tprun can compute with it. Torch-free (the fuzz target
// builds this file with clang alone).

#include <cstdint>
#include <optional>
#include <string>

namespace tprun::checkpoint {

enum class Dtype : uint8_t {
  BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ,
  I16, U16, F16, BF16, I32, U32, F32, C64, F64, I64, U64,
};

std::optional<Dtype> parse_dtype(const std::string& name);
const char* dtype_name(Dtype dtype);
int dtype_bits(Dtype dtype);
// Floating-point types tprun converts to a compute dtype (fp32/bf16/fp16):
// F64, F32, F16, BF16 and the fp8 formats.
bool dtype_is_computable(Dtype dtype);
// "BOOL, F4, ..." for error messages.
std::string all_dtype_names();

}  // namespace tprun::checkpoint
