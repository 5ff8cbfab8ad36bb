#pragma once
// Chat templates of the FLUX.2 pipelines, without a Jinja engine.
//
// A folder's template (Jinja text) is recognised by its canonical form: the
// template is lexed as transformers' Jinja environment lexes it
// (trim_blocks=True, lstrip_blocks=True, "{%-"/"-%}" whitespace control,
// trailing newline dropped), comments are dropped, the literal text between
// tags is kept exactly as it would be emitted, and inside tags only the tokens
// remain (string literals by their decoded value). Two templates with the same
// canonical form render the same text for every input; a template whose form
// is not one of the known templates below is refused. Re-indenting a template
// or changing its quote style keeps it known; changing one emitted character
// makes it unknown.
//
// Known templates (their texts are in chat_template.cpp, with their sources):
//   qwen3     Qwen3's tokenizer_config.json template, both the first release and
//             the later one that guards `message.content is string`
//   mistral3  Mistral-Small-3.1-24B-Instruct-2503's processor template (as in
//             transformers' tests/models/mistral3/test_processing_mistral3.py)
// Each has a C++ renderer for the messages the pipelines build (an optional
// system message and one user message); the parity test renders the same
// requests with transformers' own Jinja code.

#include <optional>
#include <string>

namespace tprun::text {

enum class ChatTemplateKind { kQwen3, kMistral3 };
const char* chat_template_name(ChatTemplateKind kind);

// How the pipeline calls the tokenizer folder, which decides the template used
// and whether the tokenizer adds its special tokens to the rendered text:
//  - kTokenizer: text = tokenizer.apply_chat_template(tokenize=False), then
//    tokenizer(text, ...) with add_special_tokens=True (Flux2KleinPipeline).
//    Template: chat_template.jinja, else tokenizer_config.json "chat_template".
//  - kProcessor: processor.apply_chat_template(tokenize=True, ...)
//    (Flux2Pipeline's PixtralProcessor): add_special_tokens=False when the
//    rendered text starts with bos_token, else True. Template:
//    processor_config.json "chat_template", else chat_template.json, else
//    chat_template.jinja.
enum class ChatCaller { kTokenizer, kProcessor };

// {"content": "text"} or {"content": [{"type": "text", "text": "text"}]}.
enum class ContentForm { kString, kTextParts };

// An optional system message, then one user message.
struct ChatRequest {
  std::optional<std::string> system;
  std::string user;
  ContentForm form = ContentForm::kString;
  bool add_generation_prompt = false;
  std::optional<bool> enable_thinking;  // the template variable; nullopt = undefined
  ChatCaller caller = ChatCaller::kTokenizer;
};

// diffusers' SYSTEM_MESSAGE (pipelines/flux2/system_messages.py).
extern const char* const kFlux2SystemMessage;

// Flux2KleinPipeline._get_qwen3_prompt_embeds: [{"role": "user", "content":
// prompt}], add_generation_prompt=True, enable_thinking=False, kTokenizer.
ChatRequest flux2_klein_chat(const std::string& prompt);

// Flux2Pipeline._get_mistral_3_small_prompt_embeds / format_input: "[IMG]"
// removed from the prompt, [system, user] as text parts,
// add_generation_prompt=False, kProcessor.
ChatRequest flux2_dev_chat(const std::string& prompt, const std::string& system_message = kFlux2SystemMessage);

// The known template `text` is, or nullopt. Never throws (text that does not
// lex as Jinja is simply unknown).
std::optional<ChatTemplateKind> recognize_chat_template(const std::string& text);

// The canonical form described above; std::invalid_argument when `text` does
// not lex (an unclosed tag, a raw block, a character Jinja would reject).
std::string canonical_chat_template(const std::string& text);

// The text of a known template (the one tprun's writers put in folders:
// qwen3's later release, mistral3's processor template).
const std::string& chat_template_text(ChatTemplateKind kind);

// The text the known template renders for `request`, as transformers' Jinja
// does (bos_token: the tokenizer's, nullopt when it has none). Throws
// RequestError for requests the template would fail on or would fill with
// something tprun does not produce (mistral3 without a system message uses
// today's date; qwen3 with text-part contents renders them as "").
std::string render_chat(ChatTemplateKind kind, const ChatRequest& request, const std::optional<std::string>& bos_token);

}  // namespace tprun::text
