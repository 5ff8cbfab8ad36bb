#include "checkpoint/dtype.h"

namespace tprun::checkpoint {
namespace {

struct Info {
  Dtype dtype;
  const char* name;
  int bits;
  bool computable;
};

constexpr Info kInfo[] = {
    {Dtype::BOOL, "BOOL", 8, false},          {Dtype::F4, "F4", 4, false},
    {Dtype::F6_E2M3, "F6_E2M3", 6, false},    {Dtype::F6_E3M2, "F6_E3M2", 6, false},
    {Dtype::U8, "U8", 8, false},              {Dtype::I8, "I8", 8, false},
    {Dtype::F8_E5M2, "F8_E5M2", 8, true},     {Dtype::F8_E4M3, "F8_E4M3", 8, true},
    {Dtype::F8_E8M0, "F8_E8M0", 8, false},    {Dtype::F8_E4M3FNUZ, "F8_E4M3FNUZ", 8, true},
    {Dtype::F8_E5M2FNUZ, "F8_E5M2FNUZ", 8, true}, {Dtype::I16, "I16", 16, false},
    {Dtype::U16, "U16", 16, false},           {Dtype::F16, "F16", 16, true},
    {Dtype::BF16, "BF16", 16, true},          {Dtype::I32, "I32", 32, false},
    {Dtype::U32, "U32", 32, false},           {Dtype::F32, "F32", 32, true},
    {Dtype::C64, "C64", 64, false},           {Dtype::F64, "F64", 64, true},
    {Dtype::I64, "I64", 64, false},           {Dtype::U64, "U64", 64, false},
};

const Info& info(Dtype d) { return kInfo[static_cast<size_t>(d)]; }

}  // namespace

std::optional<Dtype> parse_dtype(const std::string& name) {
  for (const auto& i : kInfo)
    if (name == i.name) return i.dtype;
  return std::nullopt;
}

const char* dtype_name(Dtype d) { return info(d).name; }
int dtype_bits(Dtype d) { return info(d).bits; }
bool dtype_is_computable(Dtype d) { return info(d).computable; }

std::string all_dtype_names() {
  std::string out;
  for (const auto& i : kInfo) {
    if (!out.empty()) out += ", ";
    out += i.name;
  }
  return out;
}

}  // namespace tprun::checkpoint
