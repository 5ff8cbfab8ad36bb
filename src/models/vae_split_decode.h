#pragma once
// A VAE decode spread over the tensor-parallel group. Every rank holds the
// whole (replicated) decoder and the same latents; instead of TP rank 0
// decoding while its peers wait, the ranks share the work and gather it:
//   * a tiled item (Vae::tiled_decode: tiling on and the latents larger than
//     a tile; a video's tiles span all its frames): its tiles, in grid order,
//     go to the ranks in turn (tile t to rank t mod tp), each rank decodes
//     its own, every tile is broadcast from the rank that decoded it, and
//     every rank blends the grid;
//   * otherwise the batch items (images or videos), in turn (item b to rank
//     b mod tp), each decoded alone, broadcast from its rank.
// The items are those of Vae::decode with slicing: each one alone. So the
// result equals vae.decode(z) on one rank bit for bit when the VAE slices
// (MemoryOptions::vae_slicing) or the batch is one item; a decode without
// slicing runs the whole batch through each convolution at once, which may
// round differently (within the convolution's rounding, not bit for bit).
// With tiling and no slicing a batch of several items is tiled item by item.

#include "models/tensor_map.h"
#include "parallel/tp_context.h"

namespace at {
class Tensor;
}

namespace tprun::models {

class Vae;

// vae.decode(z) (vae_split_decode.h says how the work is spread). z:
// identical on every rank of `tp`, in any layout vae.decode takes. The
// result, in the VAE's compute dtype on its device, on EVERY rank of the
// group (the collectives are broadcasts over tp.comm: the MPI backend's on
// the CPU, a staged copy when the VAE runs on an accelerator; NCCL's on the
// VAE's device). tp.size 1 (or no communicator): vae.decode(z, trace).
// `trace` is filled only then. Errors as vae.decode, on every rank alike
// (each rank checks z itself before any collective).
at::Tensor decode_across_group(const Vae& vae, const at::Tensor& z, const parallel::TpContext& tp,
                               Trace* trace = nullptr);

}  // namespace tprun::models
