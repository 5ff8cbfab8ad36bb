// Wan's UMT5-style tokenizer folder (see umt5_tokenizer_files.h).
#include "presets/umt5_tokenizer_files.h"

#include <fmt/format.h>

#include "presets/tokenizer_files.h"
#include "runtime/error.h"

namespace tprun::presets {
namespace {

// UMT5 is multilingual: a few lines beside the caller's corpus give the tiny
// vocabulary multi-byte pieces (accents, CJK, Cyrillic, Arabic, Devanagari),
// so its tokenizer exercises the normalizer and the unigram on them too.
const std::vector<std::string>& multilingual_lines() {
  static const std::vector<std::string> lines = {
      "caf\u00e9 cr\u00e8me br\u00fbl\u00e9e, na\u00efve fa\u00e7ade, Gr\u00fc\u00dfe aus K\u00f6ln",
      "\u6771\u4eac\u306e\u591c\u666f\u3001\u30cd\u30aa\u30f3\u304c\u8f1d\u304f\u8857\u4e26\u307f",
      "\u4e00\u53ea\u5728\u6708\u5149\u4e0b\u5954\u8dd1\u7684\u72d0\u72f8\uff0c\u6c34\u58a8\u753b\u98ce\u683c",
      "\u043a\u0440\u0430\u0441\u043d\u0430\u044f \u043b\u0438\u0441\u0430 \u0432 \u0441\u043d\u0435\u0433\u0443",
      "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
      "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
      "\ud55c\uad6d\uc5b4 \ubb38\uc7a5, \u00e9t\u00e9 \u00e0 Paris, \u00bfqu\u00e9 tal? \u00a1s\u00ed!",
  };
  return lines;
}

}  // namespace

int64_t write_umt5_tokenizer(const std::string& dir, const std::vector<std::string>& corpus, int vocab_size,
                             int extra_ids) {
  if (vocab_size < 300)
    throw ConfigError(fmt::format("UMT5 tokenizer: vocabulary size {} leaves no room beside the 256 byte pieces",
                                  vocab_size));
  if (extra_ids < 0 || extra_ids > 10000)
    throw ConfigError(fmt::format("UMT5 tokenizer: extra_ids {} is outside [0, 10000]", extra_ids));
  std::vector<std::string> texts = corpus;
  texts.insert(texts.end(), multilingual_lines().begin(), multilingual_lines().end());
  const T5Vocabulary vocab = train_t5_sentencepiece(texts, vocab_size, /*byte_fallback=*/true);
  return write_t5_tokenizer(dir, vocab, extra_ids, /*model_max_length=*/512, /*byte_fallback=*/true);
}

}  // namespace tprun::presets
