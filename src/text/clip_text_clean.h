#pragma once
// The text steps of transformers' slow CLIPTokenizer without ftfy:
// BasicTokenizer(do_lower_case=True, strip_accents=False,
// do_split_on_punc=False) and CLIP's pre-tokeniser regex
//   <\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+
// (case-insensitive), over Unicode code points with ICU's character data.

#include <string>
#include <vector>

namespace tprun::text {

// Drops U+0000, U+FFFD and category C* except tab/LF/CR; tab, LF, CR and Zs
// become spaces; spaces around CJK ideographs; NFC; split on whitespace;
// lower-case each word; join with single spaces. Input and output UTF-8.
std::string clip_basic_clean(const std::string& text);

// The words CLIP's regex finds in `text` (UTF-8), in order.
std::vector<std::string> clip_pretokenize(const std::string& text);

}  // namespace tprun::text
