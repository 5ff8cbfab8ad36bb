#include "checkpoint/hdf5_writer.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <sstream>

#include <fmt/format.h>
#include <hdf5.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "checkpoint/hdf5_util.h"
#include "checkpoint/safetensors_source.h"
#include "runtime/error.h"

namespace tprun::checkpoint {
namespace fs = std::filesystem;
namespace {


// Half precision (IEEE binary16) or bfloat16 as an HDF5 float type.
hid_t make_float16_type(bool bf16) {
  hid_t t = H5Tcopy(H5T_IEEE_F32LE);
  if (t < 0) return t;
  herr_t rc = bf16 ? H5Tset_fields(t, 15, 7, 8, 0, 7) : H5Tset_fields(t, 15, 10, 5, 0, 10);
  if (rc >= 0) rc = H5Tset_size(t, 2);
  if (rc >= 0) rc = H5Tset_ebias(t, bf16 ? 127 : 15);
  if (rc < 0) {
    H5Tclose(t);
    return -1;
  }
  return t;
}

// The HDF5 file type of a safetensors dtype (see the header).
H5Handle file_type_of(Dtype d, const std::string& where) {
  hid_t t = -1;
  switch (d) {
    case Dtype::F32: t = H5Tcopy(H5T_IEEE_F32LE); break;
    case Dtype::F64: t = H5Tcopy(H5T_IEEE_F64LE); break;
    case Dtype::F16: t = make_float16_type(false); break;
    case Dtype::BF16: t = make_float16_type(true); break;
    case Dtype::I8: t = H5Tcopy(H5T_STD_I8LE); break;
    case Dtype::I16: t = H5Tcopy(H5T_STD_I16LE); break;
    case Dtype::I32: t = H5Tcopy(H5T_STD_I32LE); break;
    case Dtype::I64: t = H5Tcopy(H5T_STD_I64LE); break;
    case Dtype::U8:
    case Dtype::BOOL: t = H5Tcopy(H5T_STD_U8LE); break;
    case Dtype::C64:  // as h5py stores complex64
      t = H5Tcreate(H5T_COMPOUND, 8);
      if (t >= 0 && (H5Tinsert(t, "r", 0, H5T_IEEE_F32LE) < 0 || H5Tinsert(t, "i", 4, H5T_IEEE_F32LE) < 0)) {
        H5Tclose(t);
        t = -1;
      }
      break;
    case Dtype::U16: t = H5Tcopy(H5T_STD_U16LE); break;
    case Dtype::U32: t = H5Tcopy(H5T_STD_U32LE); break;
    case Dtype::U64: t = H5Tcopy(H5T_STD_U64LE); break;
    default: {
      // F8 formats, and the bytes of sub-byte formats: uint8 (what h5py and
      // numpy can read; the dtype attribute says how to view them).
      const int bits = dtype_bits(d);
      if (bits <= 8) {
        t = H5Tcopy(H5T_STD_U8LE);
        break;
      }
      t = H5Tcreate(H5T_OPAQUE, static_cast<size_t>(bits / 8));
      if (t >= 0 && H5Tset_tag(t, fmt::format("tprun:{}", dtype_name(d)).c_str()) < 0) {
        H5Tclose(t);
        t = -1;
      }
    }
  }
  return {check_id(t, where, fmt::format("making the HDF5 type for {}", dtype_name(d))), H5Tclose};
}

void write_string_attribute(hid_t loc, const std::string& name, const std::string& value, const std::string& where) {
  H5Handle type(check_id(H5Tcopy(H5T_C_S1), where, "H5Tcopy"), H5Tclose);
  std::string padded = value.empty() ? std::string(1, '\0') : value;
  check_rc(H5Tset_size(type.get(), padded.size()), where, fmt::format("sizing attribute '{}'", name));
  check_rc(H5Tset_strpad(type.get(), H5T_STR_NULLPAD), where, "H5Tset_strpad");
  check_rc(H5Tset_cset(type.get(), H5T_CSET_UTF8), where, "H5Tset_cset");
  H5Handle space(check_id(H5Screate(H5S_SCALAR), where, "H5Screate"), H5Sclose);
  H5Handle attr(check_id(H5Acreate2(loc, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), where,
                         fmt::format("creating attribute '{}' ({} bytes)", name, value.size())),
                H5Aclose);
  check_rc(H5Awrite(attr.get(), type.get(), padded.data()), where, fmt::format("writing attribute '{}'", name));
}

// config.json as it is on disk (key order and formatting kept).
std::string config_text(const ComponentCheckpoint& src) {
  const fs::path p = fs::path(src.path()) / "config.json";
  std::ifstream in(p, std::ios::binary);
  if (!in) return src.config().dump(2);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The temporary file, removed unless committed.
struct TempFile {
  std::string path;
  bool committed = false;
  ~TempFile() {
    if (!committed && !path.empty()) ::unlink(path.c_str());
  }
};

class FdGuard {
 public:
  explicit FdGuard(int fd) : fd_(fd) {}
  ~FdGuard() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdGuard(const FdGuard&) = delete;
  FdGuard& operator=(const FdGuard&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

void check_tensor_name(const std::string& name, const std::string& file) {
  if (name.empty() || name == "." || name.find('/') != std::string::npos) {
    throw CheckpointError(fmt::format("{}: tensor '{}' cannot be an HDF5 dataset name (empty, '.' or containing "
                                      "'/')",
                                      file, name));
  }
}

// Writes one tensor's dataset; `buffer` is reused between tensors.
uint64_t write_tensor(hid_t file, const std::string& dst, const SafetensorsHeader& h, int src_fd,
                      const TensorEntry& e, const Hdf5WriteOptions& opts, std::unique_ptr<char[]>& buffer,
                      uint64_t& capacity) {
  const std::string where = fmt::format("{}: tensor '{}'", dst, e.name);
  const int bits = dtype_bits(e.dtype);
  const bool sub_byte = bits % 8 != 0;
  const uint64_t nbytes = e.nbytes();
  H5Handle type = file_type_of(e.dtype, where);

  std::vector<hsize_t> dims;
  if (sub_byte) dims.push_back(nbytes);
  else
    for (auto d : e.shape) dims.push_back(static_cast<hsize_t>(d));
  H5Handle space(check_id(dims.empty() ? H5Screate(H5S_SCALAR)
                                       : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                          where, "creating the dataspace"),
                 H5Sclose);
  H5Handle dcpl(check_id(H5Pcreate(H5P_DATASET_CREATE), where, "H5Pcreate"), H5Pclose);
  check_rc(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), where, "H5Pset_fill_time");
  if (!sub_byte) {
    const std::vector<int64_t> chunk = hdf5_chunk_shape(e.shape, bits / 8, opts.tp_chunks);
    if (!chunk.empty()) {
      std::vector<hsize_t> c(chunk.begin(), chunk.end());
      check_rc(H5Pset_chunk(dcpl.get(), static_cast<int>(c.size()), c.data()), where,
               fmt::format("setting chunks {}", shape_string(chunk)));
    }
  }
  H5Handle ds(check_id(H5Dcreate2(file, e.name.c_str(), type.get(), space.get(), H5P_DEFAULT, dcpl.get(),
                                  H5P_DEFAULT),
                       where, "creating the dataset"),
              H5Dclose);
  write_string_attribute(ds.get(), "dtype", dtype_name(e.dtype), where);
  if (sub_byte) write_string_attribute(ds.get(), "shape", nlohmann::json(e.shape).dump(), where);
  if (nbytes > 0) {
    if (nbytes > capacity) {
      buffer.reset();  // the previous tensor's buffer goes first
      buffer.reset(new char[nbytes]);
      capacity = nbytes;
    }
    pread_fully(src_fd, buffer.get(), nbytes, h.data_start + e.begin, h.file);
    check_rc(H5Dwrite(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buffer.get()), where,
             fmt::format("writing {} bytes", nbytes));
  }
  check_rc(ds.close() ? 0 : -1, where, "closing the dataset");
  spdlog::debug("{}: wrote '{}' {} {}", dst, e.name, dtype_name(e.dtype), shape_string(e.shape));
  return nbytes;
}

}  // namespace

std::vector<int64_t> hdf5_chunk_shape(const std::vector<int64_t>& shape, int elem_bytes, int tp_chunks) {
  if (shape.empty() || tp_chunks < 1) return {};
  for (auto d : shape)
    if (d <= 0) return {};
  std::vector<int64_t> chunk = shape;
  int64_t n = std::gcd(static_cast<int64_t>(tp_chunks), shape[0]);
  if (shape.size() >= 2) n = std::gcd(n, shape[1]);
  chunk[0] /= n;
  if (shape.size() >= 2) chunk[1] /= n;
  // HDF5 chunks must stay below 4 GiB.
  uint64_t bytes = static_cast<uint64_t>(std::max(elem_bytes, 1));
  for (auto c : chunk) {
    bytes *= static_cast<uint64_t>(c);
    if (bytes >= (uint64_t{1} << 32)) return {};
  }
  return chunk;
}

void convert_to_hdf5(const ComponentCheckpoint& src, const std::string& dst, const Hdf5WriteOptions& opts) {
  if (opts.tp_chunks < 1)
    throw ConfigError(fmt::format("--tp-chunks must be at least 1 (got {})", opts.tp_chunks));
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  std::error_code ec;
  if (!opts.overwrite && fs::exists(dst, ec))
    throw CheckpointError(fmt::format("{}: already exists (pass --force to overwrite)", dst));
  for (const auto& h : src.files())
    for (const auto& e : h.tensors) check_tensor_name(e.name, h.file);

  TempFile tmp;
  // H5F_ACC_EXCL (O_CREAT | O_EXCL): a file or a symlink planted at this
  // predictable name is never truncated nor followed; tmp owns it once made.
  const std::string tmp_path = fmt::format("{}.tmp-{}", dst, ::getpid());
  {
    H5Handle fapl(check_id(H5Pcreate(H5P_FILE_ACCESS), dst, "H5Pcreate"), H5Pclose);
    // 1.8+ object headers: attributes of any size (a large config.json).
    check_rc(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_LATEST), dst, "H5Pset_libver_bounds");
#if H5_VERSION_GE(1, 10, 7)
    check_rc(H5Pset_file_locking(fapl.get(), true, /*ignore_when_disabled=*/true), dst, "H5Pset_file_locking");
#endif
    H5Handle file(check_id(H5Fcreate(tmp_path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl.get()), dst,
                           fmt::format("creating {} (it must not exist yet)", tmp_path)),
                  H5Fclose);
    tmp.path = tmp_path;
    write_string_attribute(file.get(), "tprun_format", kHdf5FormatName, dst);
    if (src.has_config()) write_string_attribute(file.get(), "config.json", config_text(src), dst);
    std::map<std::string, std::string> metadata;
    for (const auto& h : src.files()) {
      for (const auto& [k, v] : h.metadata) {
        auto [it, fresh] = metadata.emplace(k, v);
        if (!fresh && it->second != v)
          spdlog::debug("{}: __metadata__ '{}' differs between shards; keeping '{}'", h.file, k, it->second);
      }
    }
    for (const auto& [k, v] : metadata) write_string_attribute(file.get(), "metadata:" + k, v, dst);

    std::unique_ptr<char[]> buffer;
    uint64_t capacity = 0, bytes = 0;
    size_t count = 0;
    for (const auto& h : src.files()) {
      FdGuard fd(::open(h.file.c_str(), O_RDONLY | O_CLOEXEC));
      if (fd.get() < 0) throw CheckpointError(fmt::format("{}: cannot open: {}", h.file, std::strerror(errno)));
      for (const auto& e : h.tensors) {
        bytes += write_tensor(file.get(), dst, h, fd.get(), e, opts, buffer, capacity);
        ++count;
      }
    }
    buffer.reset();
    check_rc(H5Fflush(file.get(), H5F_SCOPE_GLOBAL), dst, "flushing");
    if (!file.close()) throw CheckpointError(fmt::format("{}: closing {} failed: {}", dst, tmp.path, h5_error_text()));
    spdlog::debug("{}: {} tensors, {} bytes of data", dst, count, bytes);
  }
  {
    FdGuard fd(::open(tmp.path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0 || ::fsync(fd.get()) != 0)
      throw CheckpointError(fmt::format("{}: fsync failed: {}", tmp.path, std::strerror(errno)));
  }
  // Without --force, never over a file that appeared meanwhile (RENAME_NOREPLACE; link(2) where it is missing).
  int rc = opts.overwrite ? ::rename(tmp.path.c_str(), dst.c_str())
                          : ::renameat2(AT_FDCWD, tmp.path.c_str(), AT_FDCWD, dst.c_str(), RENAME_NOREPLACE);
  if (rc != 0 && !opts.overwrite && (errno == EINVAL || errno == ENOSYS)) {
    rc = ::link(tmp.path.c_str(), dst.c_str());
    if (rc == 0) ::unlink(tmp.path.c_str());
  }
  if (rc != 0 && errno == EEXIST) throw CheckpointError(fmt::format("{}: already exists (pass --force to overwrite)", dst));
  if (rc != 0)
    throw CheckpointError(fmt::format("{}: rename from {} failed: {}", dst, tmp.path, std::strerror(errno)));
  tmp.committed = true;
}

}  // namespace tprun::checkpoint
