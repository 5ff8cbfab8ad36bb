#include "checkpoint/hdf5_util.h"

#include <fmt/format.h>

#include "runtime/error.h"

namespace tprun::checkpoint {

std::string h5_error_text() {
  struct Walk {
    std::string first, last;
  } w;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned, const H5E_error2_t* e, void* data) -> herr_t {
        auto* w = static_cast<Walk*>(data);
        if (e->desc != nullptr && *e->desc != '\0') {
          if (w->first.empty()) w->first = e->desc;
          w->last = e->desc;
        }
        return 0;
      },
      &w);
  H5Eclear2(H5E_DEFAULT);
  if (w.first.empty()) return "HDF5 error";
  return w.first == w.last ? w.first : fmt::format("{} ({})", w.first, w.last);
}

hid_t check_id(hid_t id, const std::string& where, const std::string& what) {
  if (id < 0) throw CheckpointError(fmt::format("{}: {} failed: {}", where, what, h5_error_text()));
  return id;
}

void check_rc(herr_t rc, const std::string& where, const std::string& what) {
  if (rc < 0) throw CheckpointError(fmt::format("{}: {} failed: {}", where, what, h5_error_text()));
}

}  // namespace tprun::checkpoint
