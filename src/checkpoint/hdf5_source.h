#pragma once
// WeightSource over a tprun HDF5 checkpoint (format in hdf5_writer.h). Reads a
// rank's slice with hyperslab selections: one hyperslab per block of the
// split dimension, the memory dataspace shaped like the slice; the bytes in
// dst are exactly what SafetensorsSource gives for the same request.
//
// Two modes:
//   independent  (collective == MPI_COMM_NULL) plain POSIX I/O; never calls
//                MPI; any call at any time.
//   collective   (a communicator) the file is opened through MPI-IO
//                (H5Pset_fapl_mpio), metadata is read collectively and every
//                read_slice is one collective H5Dread (H5FD_MPIO_COLLECTIVE).
//                Then EVERY rank of that communicator must construct the
//                source, call read_slice for the same tensors in the same
//                order (each with its own request: same style and tp size,
//                its own tp rank), and call close() / destroy the source
//                together. A rank that skips a call hangs the others. MPI must
//                be initialised. tensor_names/contains/describe do no I/O and
//                may be called freely.
//
// Not thread-safe (the HDF5 library is not): one thread at a time.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <mpi.h>
#include <nlohmann/json.hpp>

#include "checkpoint/weight_source.h"

namespace tprun::checkpoint {

class Hdf5Source final : public WeightSource {
 public:
  // Opens and checks the file (tprun_format attribute, every dataset's dtype
  // attribute against its storage type size). CheckpointError naming the file
  // (and tensor) when missing, corrupt, not HDF5 or not a tprun checkpoint.
  explicit Hdf5Source(const std::string& path, MPI_Comm collective = MPI_COMM_NULL);
  ~Hdf5Source() override;
  Hdf5Source(const Hdf5Source&) = delete;
  Hdf5Source& operator=(const Hdf5Source&) = delete;

  const std::string& path() const override { return path_; }
  std::vector<std::string> tensor_names() const override;
  bool contains(const std::string& name) const override { return tensors_.count(name) != 0; }
  StoredTensor describe(const std::string& name) const override;
  void read_slice(const std::string& name, const ShardRequest& request, const SlicePlan& plan,
                  void* dst) override;
  size_t file_of(const std::string&) const override { return 0; }
  uint64_t bytes_read() const override { return bytes_read_; }
  // Closes the file (collective in collective mode); the next read reopens it.
  void close() override;

  bool collective() const { return collective_; }
  // Collective mode: reads HDF5 actually performed collectively (it may fall
  // back to independent I/O; such reads are logged at debug level).
  uint64_t collective_reads() const { return collective_reads_; }
  // The stored config.json (an empty object when there was none).
  const nlohmann::json& config() const { return config_; }
  bool has_config() const { return has_config_; }
  // The safetensors __metadata__ entries ("metadata:<key>" attributes).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  struct Info {
    Dtype dtype = Dtype::F32;
    std::vector<int64_t> shape;
  };
  void open_file();
  void load_index();
  // One dataset's dtype (its attribute, checked against the stored type) and
  // shape; `where` names the tensor in messages.
  static Info read_info(int64_t file, const std::string& name, const std::string& where);
  const Info& info_of(const std::string& name) const;

  std::string path_;
  bool collective_ = false;
  int64_t fapl_ = -1;  // hid_t (int64_t in HDF5 >= 1.10)
  int64_t file_ = -1;
  std::map<std::string, Info> tensors_;
  nlohmann::json config_ = nlohmann::json::object();
  bool has_config_ = false;
  std::map<std::string, std::string> metadata_;
  uint64_t bytes_read_ = 0;
  uint64_t collective_reads_ = 0;
};

// The config.json stored in a tprun HDF5 checkpoint (an empty object when it
// has none). Independent I/O; CheckpointError like Hdf5Source.
nlohmann::json hdf5_config(const std::string& path);

// True when `path` is a file with the HDF5 signature (at offset 0, 512, 1024, ...).
bool is_hdf5_file(const std::string& path);

// One loader API for both formats: an Hdf5Source for an HDF5 file (collective
// through `collective` when given), else a SafetensorsSource over
// ComponentCheckpoint::open(path, variant).
std::unique_ptr<WeightSource> open_weight_source(const std::string& path, const std::string& variant = "",
                                                 MPI_Comm collective = MPI_COMM_NULL);

}  // namespace tprun::checkpoint
