#pragma once
// Where weights come from, format-neutral: safetensors shards
// (SafetensorsSource) or an HDF5 file (Hdf5Source). A source describes its
// tensors and reads one rank's slice of a tensor into host memory laid out as
// the slice (SlicePlan); the ShardLoader turns that into a device tensor.

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/dtype.h"
#include "checkpoint/slice_plan.h"

namespace tprun::checkpoint {

struct StoredTensor {
  std::string name;
  Dtype dtype = Dtype::F32;
  std::vector<int64_t> shape;
  uint64_t nbytes() const;
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual const std::string& path() const = 0;
  virtual std::vector<std::string> tensor_names() const = 0;  // sorted
  virtual bool contains(const std::string& name) const = 0;
  // CheckpointError naming the tensor when absent.
  virtual StoredTensor describe(const std::string& name) const = 0;
  // Reads `plan` (made from `request` for this tensor) into dst[0, plan.bytes).
  virtual void read_slice(const std::string& name, const ShardRequest& request, const SlicePlan& plan,
                          void* dst) = 0;
  // Loading order hint: tensors of one file together, files one at a time.
  virtual size_t file_of(const std::string& name) const = 0;
  // Bytes this source has read from storage so far.
  virtual uint64_t bytes_read() const = 0;
  // Releases open files (called after a load).
  virtual void close() {}
};

}  // namespace tprun::checkpoint
