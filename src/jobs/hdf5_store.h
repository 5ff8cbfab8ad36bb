#pragma once
// The optional HDF5 store of a batch job (output.formats "hdf5" and/or
// "latents"), written through parallel HDF5 by the ranks that made the data.
//
// One file per run: <out>/store/run-<UTC time>-<pid>.h5. All ranks create it
// together (MPI-IO) under a temporary name, with one dataset per request the
// run will make and the request's parameters as attributes (metadata changes
// are collective in parallel HDF5, so everything but the pixels is written up
// front):
//   /images/<id>   uint8   [height, width, 3]       (format "hdf5": an image)
//                  uint8   [F, height, width, 3]    (a frame sequence, F = the request's frames > 1)
//   /latents/<id>  float32 [tokens, channels]       (format "latents": final packed latents)
//   attributes: prompt, negative_prompt, seed, height, width, steps, guidance, true_cfg_scale,
//               guidance_2 (where set), and frames and fps (only where F > 1: an image's dataset is
//               laid out as it always was), loras (only where the request ran with LoRA adapters: a
//               JSON array, the same as results.jsonl's "loras": path, resolved, scale, xxh3)
// The replica's TP rank 0 writes its requests' datasets independently. At the
// end all ranks drop the datasets that were not written (failed or not run),
// close the file and rank 0 renames it into place: a store file that exists
// is complete. A killed run leaves only the temporary, which the next run
// removes; its requests run again.

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <mpi.h>

#include "jobs/request_list.h"

namespace at {
class Tensor;
}

namespace tprun::dist {
class ControlPlane;
}

namespace tprun::jobs {

struct StoreRequest {
  const JobRequest* request = nullptr;
  std::vector<int64_t> latent_shape;  // Pipeline::request_latent_shape: packed [tokens, channels] or a video's [C, F, h, w]
  std::string loras;  // the "loras" attribute (jobs/lora_records.h lora_records_json); "" = no adapters, none written
};

class Hdf5Store {
 public:
  // Collective over `comm` (every rank, same arguments). `control` carries the
  // file name and the barriers (under the communication watchdog); `comm` is
  // the MPI-IO communicator HDF5 opens the file with. Both span the world, in
  // the same rank order.
  Hdf5Store(const std::string& out_dir, bool images, bool latents, const std::vector<StoreRequest>& requests,
            dist::ControlPlane& control, MPI_Comm comm);
  ~Hdf5Store();
  Hdf5Store(const Hdf5Store&) = delete;
  Hdf5Store& operator=(const Hdf5Store&) = delete;

  // Independent: the rank that made the request. `rgb` F*H*W*3 bytes (the
  // request's frames; an image H*W*3); `latents` [1, N, C].
  void write(const std::string& id, const std::vector<uint8_t>& rgb, const at::Tensor& latents);

  // Collective: drops the datasets not in `written`, closes, renames into place
  // (rank 0). Returns the final path.
  std::string finish(const std::set<std::string>& written);

  // The final path of this run's store file.
  const std::string& path() const;

  // Ids with data in the finished store files of `out_dir` (read by one rank,
  // serially): an id counts when every requested format holds it.
  static std::set<std::string> stored_ids(const std::string& out_dir, bool images, bool latents);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tprun::jobs
