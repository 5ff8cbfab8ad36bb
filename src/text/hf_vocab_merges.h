#pragma once
// The "slow" tokenizer folder layout of a byte-level BPE: vocab.json (token ->
// id), merges.txt (one merge per line), tokenizer_config.json and optionally
// added_tokens.json, special_tokens_map.json and chat_template.jinja, with no
// tokenizer.json. The hub ships Qwen/Qwen-Image's tokenizer/ (the Qwen2.5-VL
// tokenizer) this way.
//
// transformers 5 builds Qwen2Tokenizer[Fast] from these files itself
// (models/qwen2/tokenization_qwen2.py over TokenizersBackend): the BPE of
// vocab.json and merges.txt (no dropout, no unk token, no byte fallback, no
// prefix or suffix), the NFC normalizer, the pre-tokenizer Split(Qwen2's
// regex, Isolated) then ByteLevel(add_prefix_space = tokenizer_config.json's,
// default false, use_regex=false), and, since no post-processor comes from a
// file, a TemplateProcessing from add_bos_token / add_eos_token (default
// false: nothing added). tprun turns the files into the tokenizer.json that
// describes exactly that pipeline, so the rest of HfTokenizer (added tokens,
// padding, chat templates) is the same code for both layouts.
//
// Which layout: tokenizer.json when the folder has one (transformers then
// reads vocab and merges from tokenizer.json and ignores vocab.json /
// merges.txt), else vocab.json + merges.txt. Only Qwen2Tokenizer is built
// from the slow layout; TokenizersBackend would build a different tokenizer
// from the same files (no normalizer, no pre-tokenizer) and other classes are
// not implemented: both are refused.
//
// merges.txt as the tokenizers library reads it: lines end at "\n" (a "\r"
// before it is dropped); every line that starts with "#version" is skipped,
// wherever it is; every other line is exactly two symbols separated by one
// space (an empty line is an error); both symbols and their concatenation
// must be vocabulary tokens; a merge's rank is its position among the kept
// lines, and a repeated merge takes its later rank.
//
// Added tokens: tokenizer_config.json "added_tokens_decoder" when present
// (added_tokens.json and special_tokens_map.json are then not read, as in
// transformers); otherwise special_tokens_map.json names the special tokens
// and added_tokens.json ({content: id}) is the legacy added-token list, each
// entry special when it is a named special token (or one of
// extra_special_tokens), normalized when it is not.
//
// Hostile files: each file's size is checked (64 MiB) before it is read;
// JSON with a duplicate key, a vocabulary above 2^22 entries, a token above
// 4096 bytes, duplicate ids or ids that are not 0..N-1, a merge that is not
// two vocabulary symbols, an added token whose id is not the one transformers
// would give it, and add_bos_token / add_eos_token = true (not implemented)
// are each one CheckpointError naming the file and the entry.

#include <filesystem>
#include <string>

#include "text/hf_tokenizer_impl.h"

namespace tprun::text {

// Whether `root` holds vocab.json and merges.txt (regular files).
bool has_vocab_merges_files(const std::filesystem::path& root);

// Reads the slow layout of `root` into the files tokenizer.json loading
// reads: tokenizer_json is the tokenizer.json transformers' Qwen2Tokenizer
// builds from these files; tokenizer_file names vocab.json for messages.
HfFolderFiles read_vocab_merges_folder(const std::filesystem::path& root);

// Refuses a class other than Qwen2Tokenizer (`cls` without "Fast", as
// hf_tokenizer_load.cpp resolves it) for a slow-layout folder.
void check_vocab_merges_class(const HfFolderFiles& files, const std::string& cls);

}  // namespace tprun::text
