#pragma once
// GPT-2's bytes_to_unicode(), which CLIP, Qwen and Mistral's tokenizers share:
// each byte value stands for one printable character in the BPE vocabulary.
// The printable bytes ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) stand for
// themselves, the others for U+0100 + n in byte order (so ' ' is "Ġ").

#include <string>
#include <vector>

namespace tprun::text {

// The symbol (UTF-8) of each byte value, indexed by byte; 256 entries.
const std::vector<std::string>& byte_level_symbols();

}  // namespace tprun::text
