#include "checkpoint/hdf5_source.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <type_traits>

#include <fmt/format.h>
#include <hdf5.h>
#include <spdlog/spdlog.h>

#include "checkpoint/component_checkpoint.h"
#include "checkpoint/hdf5_util.h"
#include "checkpoint/hdf5_writer.h"
#include "checkpoint/safetensors_source.h"
#include "runtime/error.h"
#include "runtime/strict_json.h"

namespace tprun::checkpoint {
namespace fs = std::filesystem;
static_assert(std::is_same_v<hid_t, int64_t>, "Hdf5Source keeps hid_t values as int64_t");

namespace {


// A string attribute (fixed-length or variable-length), or nullopt when absent.
std::optional<std::string> read_string_attribute(hid_t loc, const std::string& name, const std::string& where) {
  const htri_t exists = H5Aexists(loc, name.c_str());
  check_rc(exists < 0 ? -1 : 0, where, fmt::format("looking up attribute '{}'", name));
  if (exists == 0) return std::nullopt;
  H5Handle attr(check_id(H5Aopen(loc, name.c_str(), H5P_DEFAULT), where, fmt::format("opening attribute '{}'", name)),
                H5Aclose);
  H5Handle type(check_id(H5Aget_type(attr.get()), where, "H5Aget_type"), H5Tclose);
  H5Handle space(check_id(H5Aget_space(attr.get()), where, "H5Aget_space"), H5Sclose);
  if (H5Tget_class(type.get()) != H5T_STRING || H5Sget_simple_extent_npoints(space.get()) != 1)
    throw CheckpointError(fmt::format("{}: attribute '{}' is not a single string", where, name));
  const htri_t variable = H5Tis_variable_str(type.get());
  check_rc(variable < 0 ? -1 : 0, where, "H5Tis_variable_str");
  if (variable > 0) {
    H5Handle mem(check_id(H5Tcopy(H5T_C_S1), where, "H5Tcopy"), H5Tclose);
    check_rc(H5Tset_size(mem.get(), H5T_VARIABLE), where, "H5Tset_size");
    check_rc(H5Tset_cset(mem.get(), H5Tget_cset(type.get())), where, "H5Tset_cset");
    char* text = nullptr;
    check_rc(H5Aread(attr.get(), mem.get(), &text), where, fmt::format("reading attribute '{}'", name));
    std::string out = text != nullptr ? text : "";
    H5free_memory(text);
    return out;
  }
  const size_t size = H5Tget_size(type.get());
  std::string out(size, '\0');
  if (size > 0)
    check_rc(H5Aread(attr.get(), type.get(), out.data()), where, fmt::format("reading attribute '{}'", name));
  const size_t nul = out.find('\0');
  if (nul != std::string::npos) out.resize(nul);
  if (H5Tget_strpad(type.get()) == H5T_STR_SPACEPAD) out.erase(out.find_last_not_of(' ') + 1);
  return out;
}

// Checks the format attribute; then the stored config.json (nullopt if none).
std::optional<std::string> read_format_and_config(hid_t file, const std::string& path) {
  auto format = read_string_attribute(file, "tprun_format", path);
  if (!format) {
    throw CheckpointError(fmt::format("{}: an HDF5 file, but not a tprun checkpoint (no 'tprun_format' "
                                      "attribute); write one with `tprun convert SRC {}`",
                                      path, path));
  }
  if (*format != kHdf5FormatName) {
    throw CheckpointError(fmt::format("{}: tprun_format is '{}', but this tprun reads '{}'", path, *format,
                                      kHdf5FormatName));
  }
  return read_string_attribute(file, "config.json", path);
}

// Missing files and non-HDF5 files fail here, before any (collective) HDF5 call.
void check_file(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw CheckpointError(fmt::format("{}: no such file", path));
  if (!fs::is_regular_file(path, ec)) throw CheckpointError(fmt::format("{}: not a file", path));
  if (!is_hdf5_file(path))
    throw CheckpointError(fmt::format("{}: not an HDF5 file (no HDF5 signature; corrupt or another format)", path));
}

hid_t open_h5(const std::string& path, hid_t fapl) {
  return check_id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl), path, "opening the HDF5 file (corrupt or truncated?)");
}

bool is_float_dtype(Dtype d) { return d == Dtype::F16 || d == Dtype::BF16 || d == Dtype::F32 || d == Dtype::F64; }
bool is_int_dtype(Dtype d) {
  switch (d) {
    case Dtype::BOOL: case Dtype::U8: case Dtype::I8: case Dtype::I16: case Dtype::U16:
    case Dtype::I32: case Dtype::U32: case Dtype::I64: case Dtype::U64: return true;
    default: return false;
  }
}

}  // namespace

bool is_hdf5_file(const std::string& path) {
  static const unsigned char kSignature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  const uint64_t size = fs::file_size(path, ec);
  if (ec) return false;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool found = false;
  // The superblock sits at 0 or after a user block of 512, 1024, 2048, ... bytes.
  for (uint64_t offset = 0; offset + 8 <= size && !found; offset = offset == 0 ? 512 : offset * 2) {
    unsigned char buf[8];
    if (::pread(fd, buf, 8, static_cast<off_t>(offset)) != 8) break;
    found = std::memcmp(buf, kSignature, 8) == 0;
  }
  ::close(fd);
  return found;
}

Hdf5Source::Hdf5Source(const std::string& path, MPI_Comm collective)
    : path_(path), collective_(collective != MPI_COMM_NULL) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  check_file(path_);
  fapl_ = check_id(H5Pcreate(H5P_FILE_ACCESS), path_, "H5Pcreate");
  try {
#if H5_VERSION_GE(1, 10, 7)
    check_rc(H5Pset_file_locking(fapl_, true, /*ignore_when_disabled=*/true), path_, "H5Pset_file_locking");
#endif
    if (collective_) {
      int initialized = 0;
      MPI_Initialized(&initialized);
      if (!initialized)
        throw CheckpointError(fmt::format("{}: collective HDF5 reading needs MPI to be initialised", path_));
      check_rc(H5Pset_fapl_mpio(fapl_, collective, MPI_INFO_NULL), path_, "H5Pset_fapl_mpio");
      check_rc(H5Pset_all_coll_metadata_ops(fapl_, true), path_, "H5Pset_all_coll_metadata_ops");
    }
    open_file();
    load_index();
  } catch (...) {
    close();
    H5Pclose(fapl_);
    fapl_ = -1;
    throw;
  }
}

Hdf5Source::~Hdf5Source() {
  close();
  if (fapl_ >= 0) H5Pclose(fapl_);
}

void Hdf5Source::open_file() {
  if (file_ < 0) file_ = open_h5(path_, fapl_);
}

void Hdf5Source::close() {
  if (file_ >= 0) H5Fclose(file_);
  file_ = -1;
}

namespace {

// The safetensors __metadata__ kept as root attributes "metadata:<key>".
std::map<std::string, std::string> read_metadata_attributes(hid_t file, const std::string& path) {
  std::vector<std::string> attrs;
  check_rc(H5Aiterate2(
               file, H5_INDEX_NAME, H5_ITER_INC, nullptr,
               [](hid_t, const char* name, const H5A_info_t*, void* data) -> herr_t {
                 static_cast<std::vector<std::string>*>(data)->push_back(name);
                 return 0;
               },
               &attrs),
           path, "listing the root attributes");
  std::map<std::string, std::string> metadata;
  for (const auto& a : attrs) {
    if (a.rfind("metadata:", 0) != 0) continue;
    if (auto v = read_string_attribute(file, a, path)) metadata[a.substr(9)] = *v;
  }
  return metadata;
}

// The name of the root group's link `i` (in name order).
std::string root_link_name(hid_t file, hsize_t i, const std::string& path) {
  const ssize_t len = H5Lget_name_by_idx(file, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
  check_rc(len < 0 ? -1 : 0, path, "listing the datasets");
  std::string name(static_cast<size_t>(len) + 1, '\0');
  H5Lget_name_by_idx(file, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(), H5P_DEFAULT);
  name.resize(static_cast<size_t>(len));
  return name;
}

}  // namespace

void Hdf5Source::load_index() {
  if (auto text = read_format_and_config(file_, path_)) {
    config_ = parse_strict_json(*text, path_, "the config.json attribute");
    if (!config_.is_object())
      throw CheckpointError(fmt::format("{}: the config.json attribute must hold a JSON object", path_));
    has_config_ = true;
  }
  metadata_ = read_metadata_attributes(file_, path_);

  H5G_info_t group{};
  check_rc(H5Gget_info(file_, &group), path_, "reading the root group");
  for (hsize_t i = 0; i < group.nlinks; ++i) {
    std::string name = root_link_name(file_, i, path_);
    Info info = read_info(file_, name, fmt::format("{}: tensor '{}'", path_, name));
    tensors_.emplace(std::move(name), std::move(info));
  }
  spdlog::debug("{}: {} tensors{}", path_, tensors_.size(), collective_ ? " (collective MPI-IO)" : "");
}

Hdf5Source::Info Hdf5Source::read_info(int64_t file, const std::string& name, const std::string& where) {
  H5Handle ds(check_id(H5Dopen2(file, name.c_str(), H5P_DEFAULT), where, "opening the dataset"), H5Dclose);
  auto dtype_text = read_string_attribute(ds.get(), "dtype", where);
  if (!dtype_text) throw CheckpointError(fmt::format("{}: the dataset has no 'dtype' attribute", where));
  auto dtype = parse_dtype(*dtype_text);
  if (!dtype) {
    throw CheckpointError(fmt::format("{}: unknown dtype '{}' (known: {})", where, *dtype_text, all_dtype_names()));
  }
  Info info;
  info.dtype = *dtype;
  H5Handle type(check_id(H5Dget_type(ds.get()), where, "H5Dget_type"), H5Tclose);
  H5Handle space(check_id(H5Dget_space(ds.get()), where, "H5Dget_space"), H5Sclose);
  const size_t stored = H5Tget_size(type.get());
  const int ndims = H5Sget_simple_extent_ndims(space.get());
  check_rc(ndims < 0 ? -1 : 0, where, "reading the dataspace");
  std::vector<hsize_t> dims(static_cast<size_t>(ndims));
  if (ndims > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  const int bits = dtype_bits(info.dtype);
  if (bits % 8 == 0) {
    if (stored != static_cast<size_t>(bits / 8)) {
      throw CheckpointError(fmt::format("{}: the dtype attribute says {} ({} bytes per element) but the dataset "
                                        "stores {}-byte elements",
                                        where, dtype_name(info.dtype), bits / 8, stored));
    }
    const H5T_class_t cls = H5Tget_class(type.get());
    if ((is_float_dtype(info.dtype) && cls != H5T_FLOAT) || (is_int_dtype(info.dtype) && cls != H5T_INTEGER)) {
      throw CheckpointError(fmt::format("{}: the dtype attribute says {} but the dataset's HDF5 type is not {}",
                                        where, dtype_name(info.dtype),
                                        is_float_dtype(info.dtype) ? "a float" : "an integer"));
    }
    info.shape.assign(dims.begin(), dims.end());
  } else {
    // Sub-byte dtypes: the packed bytes as a 1-d byte dataset, the shape an attribute.
    auto shape_text = read_string_attribute(ds.get(), "shape", where);
    if (!shape_text)
      throw CheckpointError(fmt::format("{}: a {} dataset needs a 'shape' attribute", where, dtype_name(info.dtype)));
    const nlohmann::json shape = parse_strict_json(*shape_text, where, "the shape attribute");
    try {
      info.shape = shape.get<std::vector<int64_t>>();
    } catch (const nlohmann::json::exception&) {
      throw CheckpointError(fmt::format("{}: the shape attribute '{}' is not a list of sizes", where, *shape_text));
    }
    StoredTensor t{name, info.dtype, info.shape};
    if (stored != 1 || ndims != 1 || dims[0] != t.nbytes()) {
      throw CheckpointError(fmt::format("{}: a {} tensor of shape {} needs {} bytes; the dataset holds {} "
                                        "elements of {} bytes",
                                        where, dtype_name(info.dtype), shape_string(info.shape), t.nbytes(),
                                        ndims == 1 ? dims[0] : 0, stored));
    }
  }
  for (auto d : info.shape)
    if (d < 0) throw CheckpointError(fmt::format("{}: negative dimension", where));
  return info;
}

std::vector<std::string> Hdf5Source::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [n, info] : tensors_) names.push_back(n);
  return names;
}

const Hdf5Source::Info& Hdf5Source::info_of(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end())
    throw CheckpointError(fmt::format("{}: tensor '{}' is not in this checkpoint", path_, name));
  return it->second;
}

StoredTensor Hdf5Source::describe(const std::string& name) const {
  const Info& info = info_of(name);
  return {name, info.dtype, info.shape};
}

void Hdf5Source::read_slice(const std::string& name, const ShardRequest& r, const SlicePlan& plan, void* dst) {
  const Info& info = info_of(name);
  const std::string where = fmt::format("{}: tensor '{}'", path_, name);
  const StoredTensor whole_tensor{name, info.dtype, info.shape};
  const bool whole = r.whole();
  // Geometry first (no I/O): the hyperslabs of this rank's slice.
  const int bits = dtype_bits(info.dtype);
  const size_t nd = info.shape.size();
  std::vector<int64_t> slice_shape = info.shape;
  std::vector<std::pair<int64_t, int64_t>> spans;  // [start, count) along `dim`, per block
  size_t dim = 0;
  if (whole) {
    if (plan.bytes != whole_tensor.nbytes() || plan.shape != info.shape)
      throw CheckpointError(fmt::format("{}: the slice plan ({} bytes) does not match the stored tensor ({} {})",
                                        where, plan.bytes, dtype_name(info.dtype), shape_string(info.shape)));
  } else {
    if (bits % 8 != 0)
      throw CheckpointError(fmt::format("{}: a {}-bit dtype cannot be split {} (tp rank {} of {})", where, bits,
                                        shard_style_name(r.style), r.tp_rank, r.tp_size));
    const SplitSpans split = split_spans(name, info.shape, r);
    dim = static_cast<size_t>(split.dim);
    spans = split.spans;
    slice_shape = split.slice_shape;
    const StoredTensor slice{name, info.dtype, slice_shape};
    if (plan.shape != slice_shape || plan.bytes != slice.nbytes())
      throw CheckpointError(fmt::format("{}: the slice plan {} ({} bytes) does not match the {} slice {}", where,
                                        shape_string(plan.shape), plan.bytes, shard_style_name(r.style),
                                        shape_string(slice_shape)));
  }
  if (plan.bytes == 0) return;  // the same on every rank of a collective group

  open_file();
  H5Handle ds(check_id(H5Dopen2(file_, name.c_str(), H5P_DEFAULT), where, "opening the dataset"), H5Dclose);
  H5Handle type(check_id(H5Dget_type(ds.get()), where, "H5Dget_type"), H5Tclose);
  H5Handle fspace, mspace;
  if (!whole) {
    fspace = H5Handle(check_id(H5Dget_space(ds.get()), where, "H5Dget_space"), H5Sclose);
    std::vector<hsize_t> offset(nd, 0), count(info.shape.begin(), info.shape.end());
    H5S_seloper_t op = H5S_SELECT_SET;
    for (const auto& [s, n] : spans) {
      offset[dim] = static_cast<hsize_t>(s);
      count[dim] = static_cast<hsize_t>(n);
      check_rc(H5Sselect_hyperslab(fspace.get(), op, offset.data(), nullptr, count.data(), nullptr), where,
               "selecting the slice");
      op = H5S_SELECT_OR;
    }
    // The union is iterated in row-major file order: block after block along
    // `dim`, exactly the slice's layout in memory.
    std::vector<hsize_t> mdims(slice_shape.begin(), slice_shape.end());
    mspace = H5Handle(check_id(H5Screate_simple(static_cast<int>(nd), mdims.data(), nullptr), where,
                               "creating the memory dataspace"),
                      H5Sclose);
  }
  H5Handle dxpl;
  if (collective_) {
    dxpl = H5Handle(check_id(H5Pcreate(H5P_DATASET_XFER), where, "H5Pcreate"), H5Pclose);
    check_rc(H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE), where, "H5Pset_dxpl_mpio");
  }
  check_rc(H5Dread(ds.get(), type.get(), whole ? H5S_ALL : mspace.get(), whole ? H5S_ALL : fspace.get(),
                   collective_ ? dxpl.get() : H5P_DEFAULT, dst),
           where, fmt::format("reading {} bytes", plan.bytes));
  if (collective_) {
    H5D_mpio_actual_io_mode_t mode = H5D_MPIO_NO_COLLECTIVE;
    if (H5Pget_mpio_actual_io_mode(dxpl.get(), &mode) >= 0 && mode != H5D_MPIO_NO_COLLECTIVE) {
      ++collective_reads_;
    } else {
      uint32_t local = 0, global = 0;
      H5Pget_mpio_no_collective_cause(dxpl.get(), &local, &global);
      spdlog::debug("{}: read independently (HDF5 no-collective cause local {:#x} global {:#x})", where, local,
                    global);
    }
  }
  bytes_read_ += plan.bytes;
}

nlohmann::json hdf5_config(const std::string& path) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  check_file(path);
  H5Handle fapl(check_id(H5Pcreate(H5P_FILE_ACCESS), path, "H5Pcreate"), H5Pclose);
#if H5_VERSION_GE(1, 10, 7)
  check_rc(H5Pset_file_locking(fapl.get(), true, /*ignore_when_disabled=*/true), path, "H5Pset_file_locking");
#endif
  H5Handle file(open_h5(path, fapl.get()), H5Fclose);
  auto text = read_format_and_config(file.get(), path);
  if (!text) return nlohmann::json::object();
  return parse_strict_json(*text, path, "the config.json attribute");
}

std::unique_ptr<WeightSource> open_weight_source(const std::string& path, const std::string& variant,
                                                 MPI_Comm collective) {
  if (is_hdf5_file(path)) {
    if (!variant.empty()) spdlog::warn("{}: an HDF5 checkpoint has no variants; ignoring '{}'", path, variant);
    return std::make_unique<Hdf5Source>(path, collective);
  }
  auto ckpt = std::make_shared<const ComponentCheckpoint>(ComponentCheckpoint::open(path, variant));
  return std::make_unique<SafetensorsSource>(std::move(ckpt));
}

}  // namespace tprun::checkpoint
