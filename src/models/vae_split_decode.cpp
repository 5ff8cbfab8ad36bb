// A VAE decode whose items or tiles are spread over the TP group and
// broadcast back (vae_split_decode.h).
#include "models/vae_split_decode.h"

#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/Device.h>
#include <fmt/format.h>

#include "checkpoint/torch_dtype.h"
#include "dist/communicator.h"
#include "models/vae.h"
#include "models/vae_tiling.h"
#include "runtime/error.h"

namespace tprun::models {

namespace {

constexpr int64_t kMaxDims = 8;

// Moves decoded pieces between ranks: each piece is broadcast from the rank
// that decoded it (its shape first, then its values), on the communicator's
// device, and handed back on the VAE's.
class PieceShare {
 public:
  PieceShare(const Vae& vae, const parallel::TpContext& tp)
      : tp_(tp),
        vae_device_(vae.device()),
        comm_device_(std::string(tp.comm->backend()) == "mpi" ? at::Device(at::kCPU) : at::Device(vae.device())),
        dtype_(checkpoint::parse_compute_dtype(vae.compute_dtype(), "vae dtype")) {}

  // `piece` (defined on `owner` only) on every rank.
  at::Tensor share(const at::Tensor& piece, int owner) const {
    const bool mine = tp_.rank == owner;
    at::Tensor host_shape = at::zeros({kMaxDims + 1}, at::TensorOptions().dtype(at::kLong));
    if (mine) {
      if (piece.dim() > kMaxDims) throw Error(Error::Kind::Internal, "decode_across_group: a piece of over 8 dims");
      int64_t* s = host_shape.data_ptr<int64_t>();
      s[0] = piece.dim();
      for (int64_t d = 0; d < piece.dim(); ++d) s[d + 1] = piece.size(d);
    }
    at::Tensor shape = host_shape.to(comm_device_);
    dist::BroadcastOptions root;
    root.root = owner;
    tp_.comm->broadcast(shape, root);
    host_shape = shape.cpu();
    const int64_t* s = host_shape.data_ptr<int64_t>();
    const std::vector<int64_t> sizes(s + 1, s + 1 + s[0]);
    at::Tensor buf = mine ? piece.to(comm_device_, dtype_).contiguous()
                          : at::empty(sizes, at::TensorOptions().dtype(dtype_).device(comm_device_));
    tp_.comm->broadcast(buf, root);
    return buf.to(at::Device(vae_device_));
  }

 private:
  const parallel::TpContext& tp_;
  std::string vae_device_;
  at::Device comm_device_;
  c10::ScalarType dtype_;
};

}  // namespace

at::Tensor decode_across_group(const Vae& vae, const at::Tensor& z, const parallel::TpContext& tp, Trace* trace) {
  if (tp.size <= 1 || tp.comm == nullptr) return vae.decode(z, trace);
  // A layout decode refuses: its error, on every rank alike, before any collective.
  const VaeInfo& info = vae.info();
  const bool frames_ok = info.frame_axis ? (z.defined() && (z.dim() == 4 || (z.dim() == 5 && (info.temporal_scale > 1 ||
                                                                                             z.size(2) == 1))))
                                         : (z.defined() && z.dim() == 4);
  if (!vae.has_decoder() || !frames_ok || z.numel() == 0 || z.size(1) != info.latent_channels) return vae.decode(z);
  const PieceShare share(vae, tp);
  const int64_t items = z.size(0);
  std::vector<at::Tensor> decoded(static_cast<size_t>(items));
  int64_t next_item = 0;  // items decoded whole go to the ranks in turn
  for (int64_t b = 0; b < items; ++b) {
    const at::Tensor item = z.slice(0, b, b + 1);
    std::optional<Vae::TiledDecode> plan = vae.tiled_decode(item);
    if (!plan) {
      const int owner = static_cast<int>(next_item++ % tp.size);
      decoded[static_cast<size_t>(b)] = share.share(tp.rank == owner ? vae.decode(item) : at::Tensor(), owner);
      continue;
    }
    std::vector<std::vector<at::Tensor>> tiles = grid_tiles(plan->input, plan->grid);
    int64_t t = 0;
    for (auto& row : tiles) {
      for (auto& tile : row) {
        const int owner = static_cast<int>(t++ % tp.size);
        tile = share.share(tp.rank == owner ? plan->tile(tile.contiguous()).contiguous() : at::Tensor(), owner);
      }
    }
    decoded[static_cast<size_t>(b)] = plan->finish(blend_grid(tiles, plan->grid));
  }
  return items == 1 ? decoded.front() : at::cat(decoded, 0);
}

}  // namespace tprun::models
