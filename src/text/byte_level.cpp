#include "text/byte_level.h"

#include "text/tokenizer_common.h"

namespace tprun::text {

const std::vector<std::string>& byte_level_symbols() {
  static const std::vector<std::string> table = [] {
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    std::vector<std::string> symbols(256);
    int n = 0;
    for (int b = 0; b < 256; ++b)
      append_utf8(symbols[static_cast<size_t>(b)],
                  printable(b) ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++));
    return symbols;
  }();
  return table;
}

}  // namespace tprun::text
