#include "jobs/hdf5_store.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "checkpoint/hdf5_util.h"
#include "dist/control_plane.h"
#include "jobs/output_folder.h"
#include "runtime/error.h"

namespace tprun::jobs {
namespace fs = std::filesystem;
using checkpoint::check_id;
using checkpoint::check_rc;
using checkpoint::H5Handle;

namespace {

void string_attribute(hid_t obj, const char* name, const std::string& value, const std::string& where) {
  H5Handle type(check_id(H5Tcopy(H5T_C_S1), where, "H5Tcopy"), H5Tclose);
  check_rc(H5Tset_size(type.get(), value.empty() ? 1 : value.size()), where, "H5Tset_size");
  check_rc(H5Tset_cset(type.get(), H5T_CSET_UTF8), where, "H5Tset_cset");
  H5Handle space(check_id(H5Screate(H5S_SCALAR), where, "H5Screate"), H5Sclose);
  H5Handle attr(check_id(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), where, name),
                H5Aclose);
  const std::string v = value.empty() ? std::string(1, '\0') : value;
  check_rc(H5Awrite(attr.get(), type.get(), v.data()), where, name);
}

template <typename T>
void number_attribute(hid_t obj, const char* name, T value, hid_t type, const std::string& where) {
  H5Handle space(check_id(H5Screate(H5S_SCALAR), where, "H5Screate"), H5Sclose);
  H5Handle attr(check_id(H5Acreate2(obj, name, type, space.get(), H5P_DEFAULT, H5P_DEFAULT), where, name),
                H5Aclose);
  check_rc(H5Awrite(attr.get(), type, &value), where, name);
}

// A failed HDF5 call on the store is the file system's doing (disk full, quota, file size limit,
// read-only): an IoError naming the file and the errno text, found by asking the file system again
// (HDF5 through MPI-IO loses errno). `offset`/`size`: the bytes the call wrote, where known; else
// 64 KiB past the end of the file (metadata).
[[noreturn]] void store_io_error(const std::string& what, const std::string& path, const std::string& h5_text,
                                 uint64_t offset = UINT64_MAX, uint64_t size = 64 * 1024) {
  if (offset == UINT64_MAX) {
    struct stat st {};
    offset = ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  }
  const int err = checkpoint::h5_write_errno(path, offset, size);
  if (err != 0) throw_io_error(what, path, err);
  throw IoError(fmt::format("{}: {}: {}", what, path, h5_text));
}

[[noreturn]] void write_failed(const std::string& id, const std::string& dataset, hid_t d, const std::string& path) {
  const std::string h5_text = checkpoint::h5_error_text();
  const haddr_t offset = H5Dget_offset(d);
  const hsize_t size = H5Dget_storage_size(d);
  H5Eclear2(H5E_DEFAULT);
  store_io_error(fmt::format("cannot write request {} ({}) into the HDF5 store", id, dataset), path, h5_text,
                 offset == HADDR_UNDEF ? UINT64_MAX : static_cast<uint64_t>(offset), static_cast<uint64_t>(size));
}

// [height, width, 3] for an image (F = 1), [F, height, width, 3] for frames.
std::vector<hsize_t> image_dims(const pipelines::GenerationRequest& g) {
  std::vector<hsize_t> dims = {static_cast<hsize_t>(g.height.value()), static_cast<hsize_t>(g.width.value()), 3};
  if (g.frame_count() > 1) dims.insert(dims.begin(), static_cast<hsize_t>(g.frame_count()));
  return dims;
}

std::string run_name() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
  return fmt::format("run-{}-{}.h5", buf, ::getpid());
}

}  // namespace

struct Hdf5Store::Impl {
  std::string final_path, tmp_path;
  bool images = false, latents = false;
  dist::ControlPlane* control = nullptr;
  int rank = 0;
  H5Handle file;
  std::vector<std::string> ids;
};

Hdf5Store::Hdf5Store(const std::string& out_dir, bool images, bool latents, const std::vector<StoreRequest>& requests,
                     dist::ControlPlane& control, MPI_Comm comm)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.images = images;
  m.latents = latents;
  m.control = &control;
  m.rank = control.rank();
  const fs::path dir = fs::path(out_dir) / "store";
  std::string name = m.rank == 0 ? run_name() : std::string();
  control.broadcast(name);
  m.final_path = (dir / name).string();
  m.tmp_path = (dir / ("." + name + ".tmp")).string();
  // store/ made by mkdir, never a symlink (the store would land outside the
  // output folder); neither name taken (H5F_ACC_EXCL below refuses one that
  // appears since, a symlink included). One verdict for every rank.
  control.agree([&] {
    make_output_folder(out_dir, "store");
    for (const std::string& p : {m.tmp_path, m.final_path}) {
      struct stat st {};
      if (::lstat(p.c_str(), &st) == 0) {
        throw ConfigError(fmt::format("{} exists (the name of this run's HDF5 store file); tprun never replaces a "
                                      "file it did not write: move it away",
                                      p));
      }
    }
  });
  const std::string& where = m.tmp_path;
  checkpoint::h5_silence_errors();
  try {
    H5Handle fapl(check_id(H5Pcreate(H5P_FILE_ACCESS), where, "H5Pcreate"), H5Pclose);
    check_rc(H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL), where, "H5Pset_fapl_mpio");
    check_rc(H5Pset_all_coll_metadata_ops(fapl.get(), true), where, "H5Pset_all_coll_metadata_ops");
    check_rc(H5Pset_coll_metadata_write(fapl.get(), true), where, "H5Pset_coll_metadata_write");
    m.file = H5Handle(check_id(H5Fcreate(where.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl.get()), where, "H5Fcreate"),
                      H5Fclose);
    for (const char* group : {"images", "latents"}) {
      if ((group[0] == 'i' && !images) || (group[0] == 'l' && !latents)) continue;
      H5Handle g(check_id(H5Gcreate2(m.file.get(), group, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), where, group),
                 H5Gclose);
    }
    // Contiguous, allocated at creation: independent writes touch no metadata.
    H5Handle dcpl(check_id(H5Pcreate(H5P_DATASET_CREATE), where, "H5Pcreate"), H5Pclose);
    check_rc(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY), where, "H5Pset_alloc_time");
    check_rc(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), where, "H5Pset_fill_time");
    for (const auto& sr : requests) {
      const JobRequest& r = *sr.request;
      m.ids.push_back(r.id);
      auto make = [&](const std::string& dset, hid_t type, const std::vector<hsize_t>& dims) {
        H5Handle space(check_id(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), where, dset),
                       H5Sclose);
        H5Handle d(check_id(H5Dcreate2(m.file.get(), dset.c_str(), type, space.get(), H5P_DEFAULT, dcpl.get(),
                                       H5P_DEFAULT),
                            where, dset),
                   H5Dclose);
        const auto& g = r.gen;
        string_attribute(d.get(), "prompt", g.prompt, where);
        string_attribute(d.get(), "negative_prompt", g.negative_prompt.value_or(""), where);
        number_attribute<uint64_t>(d.get(), "seed", g.seed, H5T_NATIVE_UINT64, where);
        // The request with the pipeline's defaults applied: every field is set
        // but the options the pipeline does not use (pipelines::RequestOptions:
        // guidance in QwenImagePipeline and FLUX.1-schnell, true_cfg_scale in FLUX.2).
        number_attribute<int64_t>(d.get(), "height", g.height.value(), H5T_NATIVE_INT64, where);
        number_attribute<int64_t>(d.get(), "width", g.width.value(), H5T_NATIVE_INT64, where);
        number_attribute<int64_t>(d.get(), "steps", g.steps.value(), H5T_NATIVE_INT64, where);
        if (g.guidance) number_attribute<double>(d.get(), "guidance", *g.guidance, H5T_NATIVE_DOUBLE, where);
        if (g.true_cfg_scale) {  // a pipeline without it (FLUX.2) leaves it out too
          number_attribute<double>(d.get(), "true_cfg_scale", *g.true_cfg_scale, H5T_NATIVE_DOUBLE, where);
        }
        // Only a frame sequence has it: an image's attributes are what they always were.
        if (g.guidance_2) number_attribute<double>(d.get(), "guidance_2", *g.guidance_2, H5T_NATIVE_DOUBLE, where);
        if (g.frame_count() > 1) {
          number_attribute<int64_t>(d.get(), "frames", g.frame_count(), H5T_NATIVE_INT64, where);
          if (g.fps) number_attribute<int64_t>(d.get(), "fps", *g.fps, H5T_NATIVE_INT64, where);
        }
        // Only a request with adapters has it.
        if (!sr.loras.empty()) string_attribute(d.get(), "loras", sr.loras, where);
      };
      if (images) make("images/" + r.id, H5T_NATIVE_UINT8, image_dims(r.gen));
      if (latents) {
        std::vector<hsize_t> dims;
        for (int64_t d : sr.latent_shape) dims.push_back(static_cast<hsize_t>(d));
        make("latents/" + r.id, H5T_NATIVE_FLOAT, dims);
      }
    }
    check_rc(H5Fflush(m.file.get(), H5F_SCOPE_GLOBAL), where, "H5Fflush");
  } catch (const CheckpointError& e) {
    store_io_error("cannot create the HDF5 store", where, e.what());
  }
}

Hdf5Store::~Hdf5Store() = default;

const std::string& Hdf5Store::path() const { return impl_->final_path; }

void Hdf5Store::write(const std::string& id, const std::vector<uint8_t>& rgb, const at::Tensor& latents) {
  Impl& m = *impl_;
  const std::string& where = m.tmp_path;
  H5Handle dxpl(check_id(H5Pcreate(H5P_DATASET_XFER), where, "H5Pcreate"), H5Pclose);
  check_rc(H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_INDEPENDENT), where, "H5Pset_dxpl_mpio");
  if (m.images) {
    const std::string name = "images/" + id;
    H5Handle d(check_id(H5Dopen2(m.file.get(), name.c_str(), H5P_DEFAULT), where, name), H5Dclose);
    H5Handle space(check_id(H5Dget_space(d.get()), where, name), H5Sclose);
    if (static_cast<size_t>(H5Sget_simple_extent_npoints(space.get())) != rgb.size()) {
      throw Error(Error::Kind::Internal, fmt::format("{}: {} holds {} values, the result has {}", where, name,
                                                     H5Sget_simple_extent_npoints(space.get()), rgb.size()));
    }
    if (H5Dwrite(d.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, dxpl.get(), rgb.data()) < 0) {
      write_failed(id, name, d.get(), where);
    }
  }
  if (m.latents) {
    const std::string name = "latents/" + id;
    at::Tensor l = latents.detach().to(at::kCPU, at::kFloat).contiguous();
    H5Handle d(check_id(H5Dopen2(m.file.get(), name.c_str(), H5P_DEFAULT), where, name), H5Dclose);
    H5Handle space(check_id(H5Dget_space(d.get()), where, name), H5Sclose);
    if (H5Sget_simple_extent_npoints(space.get()) != l.numel()) {
      throw Error(Error::Kind::Internal, fmt::format("{}: {} holds {} values, the latents have {}", where, name,
                                                     H5Sget_simple_extent_npoints(space.get()), l.numel()));
    }
    if (H5Dwrite(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, dxpl.get(), l.data_ptr<float>()) < 0) {
      write_failed(id, name, d.get(), where);
    }
  }
}

std::string Hdf5Store::finish(const std::set<std::string>& written) {
  Impl& m = *impl_;
  const std::string& where = m.tmp_path;
  try {
    for (const auto& id : m.ids) {
      if (written.count(id)) continue;
      if (m.images) check_rc(H5Ldelete(m.file.get(), ("images/" + id).c_str(), H5P_DEFAULT), where, "H5Ldelete");
      if (m.latents) check_rc(H5Ldelete(m.file.get(), ("latents/" + id).c_str(), H5P_DEFAULT), where, "H5Ldelete");
    }
    if (!m.file.close()) {
      throw CheckpointError(fmt::format("{}: closing failed: {}", where, checkpoint::h5_error_text()));
    }
  } catch (const CheckpointError& e) {
    store_io_error("cannot finish the HDF5 store", where, e.what());
  }
  m.control->barrier();
  // Rank 0 renames it into place, never over a file (one verdict for every rank).
  m.control->agree([&] { place_new_file(m.tmp_path, m.final_path); });
  return m.final_path;
}

std::set<std::string> Hdf5Store::stored_ids(const std::string& out_dir, bool images, bool latents) {
  std::set<std::string> in_images, in_latents;
  checkpoint::h5_silence_errors();
  const fs::path dir = fs::path(out_dir) / "store";
  if (!fs::is_directory(dir)) return {};
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (!e.is_regular_file() || n.empty() || n[0] == '.' || e.path().extension() != ".h5") continue;
    const std::string where = e.path().string();
    H5Handle f(H5Fopen(where.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    if (f.get() < 0) {
      spdlog::warn("{}: not readable as HDF5 ({}); its requests count as not stored", where, checkpoint::h5_error_text());
      continue;
    }
    auto collect = [&](const char* group, std::set<std::string>& out) {
      if (H5Lexists(f.get(), group, H5P_DEFAULT) <= 0) return;
      H5Handle g(check_id(H5Gopen2(f.get(), group, H5P_DEFAULT), where, group), H5Gclose);
      H5G_info_t info{};
      check_rc(H5Gget_info(g.get(), &info), where, group);
      for (hsize_t i = 0; i < info.nlinks; ++i) {
        const ssize_t len = H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
        if (len < 0) continue;
        std::string name(static_cast<size_t>(len) + 1, '\0');
        H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(), H5P_DEFAULT);
        name.resize(static_cast<size_t>(len));
        out.insert(name);
      }
    };
    collect("images", in_images);
    collect("latents", in_latents);
  }
  std::set<std::string> out;
  const std::set<std::string>& base = images ? in_images : in_latents;
  for (const auto& id : base) {
    if ((!images || in_images.count(id)) && (!latents || in_latents.count(id))) out.insert(id);
  }
  return out;
}

}  // namespace tprun::jobs
