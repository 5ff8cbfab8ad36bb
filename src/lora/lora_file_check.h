#pragma once
// Whether a path can be an adapter file, checked wherever one is named (a
// manifest, a request, `--lora`, the planner) before it is opened: one
// .safetensors file, readable, never a folder, a fifo or a device (nothing
// that could block a read or is not an input). Torch-free.

#include <string>

namespace tprun::lora {

// Why `path` cannot be an adapter file ("" when it can): "does not exist",
// "is a folder, ...", "is not a regular file (a pipe)", "does not end in
// .safetensors ...", "cannot be read: Permission denied", ... The name checked
// for the suffix is the path as given (the user's choice of file), then the
// file it leads to must be regular.
std::string lora_file_problem(const std::string& path);

// ConfigError "<what> <path>: <problem>" (on every rank alike) where
// lora_file_problem finds one.
void check_lora_file(const std::string& path, const std::string& what);

}  // namespace tprun::lora
