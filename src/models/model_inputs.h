#pragma once
// Checks of a forward's named inputs, shared by the model families. Each
// failure is a RequestError naming the input (raised alike on every rank that
// gets the same inputs, so a bad request fails everywhere at once).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "models/tensor_map.h"

namespace tprun::models {

// The input `name`; with dims >= 0 it must have that many dimensions.
at::Tensor input(const TensorMap& in, const std::string& name, int64_t dims);
// [B, S, features] with features == `features` (`field`: the config field that sets it).
at::Tensor sequence_input(const TensorMap& in, const std::string& name, int64_t features, const char* field);
// Position ids [S, n] or [1, S, n] (diffusers takes [0] of a 3-D one) with
// S == `tokens` and n >= `axes` -> [S, n].
at::Tensor ids_input(const TensorMap& in, const std::string& name, int64_t tokens, size_t axes);
// A per-sample scalar (timestep, guidance): [B] or one value for the batch -> 1-D.
at::Tensor scalar_per_sample(const TensorMap& in, const std::string& name, int64_t batch);
// True when the input is given (and defined).
bool has_input(const TensorMap& in, const std::string& name);
// Distilled-guidance models need input 'guidance'; the others refuse it
// (diffusers would silently ignore either mistake).
void check_guidance_input(const TensorMap& in, bool guidance_embeds);

class Model;

// The names `model`'s forward reads: those of its example_inputs (every family gives each input
// there, the optional ones too: a text mask, guidance where the config embeds it); for a component
// that decodes 'latents' or encodes an 'image' (a VAE), both of those.
std::vector<std::string> forward_input_names(const Model& model);
// Refuses a given tensor that `model`'s forward would not read (a typo, e.g. a mask under a wrong
// name, is otherwise dropped silently): RequestError naming `source` (the --inputs file), the tensor,
// the class and the names it takes, raised alike on every rank.
void check_input_names(const TensorMap& given, const Model& model, const std::string& source);

}  // namespace tprun::models
