#pragma once
// WanPipeline's prompt_clean (diffusers 0.40 pipelines/wan/pipeline_wan.py),
// applied to every prompt and negative prompt before the tokenizer:
//   basic_clean:      ftfy.fix_text(text) only when ftfy is installed, then
//                     html.unescape(html.unescape(text)), then str.strip()
//   whitespace_clean: re.sub(r"\s+", " ", text) with the `regex` module
//                     (pipeline_wan.py imports regex as re), then str.strip()
// tprun never runs ftfy (it is not among diffusers' requirements, and
// tools/requirements.txt does not install it): prompts are cleaned as
// diffusers cleans them where ftfy is absent. Where a diffusers install has
// ftfy, its prompts with mojibake or other text ftfy repairs differ from
// tprun's.
//
// Two kinds of whitespace, as there: the regex module's \s is Unicode's
// White_Space property (U+0009..U+000D, U+0020, U+0085, U+00A0, U+1680,
// U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000), while str.strip()
// also strips U+001C..U+001F (str.isspace()): those four survive inside a
// prompt and go at its ends. Neither touches U+200B or U+FEFF.

#include <string>

namespace tprun::text {

// Python 3's html.unescape on UTF-8 text: named references from HTML5's table
// (html5_entities.h; the longest known prefix of an unterminated name, as the
// standard defines), decimal / hex numeric references with Python's
// replacements for invalid ones (0x80..0x9F as windows-1252, surrogates and
// values past U+10FFFF as U+FFFD, controls and noncharacters removed).
// RequestError for invalid UTF-8.
std::string html_unescape(const std::string& text);

// diffusers' prompt_clean without ftfy (see above). RequestError for invalid UTF-8.
std::string wan_prompt_clean(const std::string& prompt);

}  // namespace tprun::text
