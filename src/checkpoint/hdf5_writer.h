#pragma once
// Converts a safetensors component (ComponentCheckpoint) into tprun's HDF5
// checkpoint format, "tprun-hdf5-v1":
//
//   /<tensor name>      one dataset per tensor, named exactly as the tensor
//                       (names contain dots, never '/'); its raw bytes are the
//                       safetensors bytes. F32/F64/integers: the little-endian
//                       HDF5 types; BOOL: uint8; F16 and BF16: custom HDF5
//                       float types (h5py reads them as float16 / float32);
//                       F8 formats: uint8; C64: a compound {r, i} of two F32
//                       (h5py's complex64); sub-byte dtypes (F4, F6): a 1-D
//                       uint8 dataset of the packed bytes with the shape in a
//                       "shape" attribute (JSON text); any other: opaque bytes
//                       of the element width. Every dataset has a string attribute
//                       "dtype" holding the safetensors dtype name, which is
//                       what readers go by.
//   chunks              chunked along the split dimensions so that a TP slice
//                       is whole chunks (hdf5_chunk_shape); scalars, empty
//                       tensors and sub-byte dtypes are contiguous.
//   root attributes     "tprun_format" = "tprun-hdf5-v1", "config.json" (the
//                       component's config.json text, when it has one) and
//                       "metadata:<key>" for each safetensors __metadata__ entry.
//
// Files are written with HDF5 1.10 object formats (H5F_LIBVER_V18..LATEST:
// attributes of any size, fixed-array chunk indexes); reading them needs HDF5
// 1.10 or newer (h5py with any current wheel).
//
// Single process; no MPI. Reads one tensor at a time from the safetensors files
// (pread) and writes it; never holds more than one tensor in memory. Atomic: a
// temporary file next to the destination, fsync, rename.

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/component_checkpoint.h"

namespace tprun::checkpoint {

inline constexpr const char* kHdf5FormatName = "tprun-hdf5-v1";

struct Hdf5WriteOptions {
  // Chunks per split dimension: slices for any tp dividing this are whole
  // chunks. Reduced per tensor to a divisor of its split dimensions.
  int tp_chunks = 8;
  bool overwrite = false;  // replace an existing destination
};

// Throws CheckpointError naming the file and tensor on any failure (the
// destination is then left untouched), ConfigError for tp_chunks < 1.
void convert_to_hdf5(const ComponentCheckpoint& src, const std::string& dst_path, const Hdf5WriteOptions& opts);

// The chunk shape convert_to_hdf5 gives a tensor of `shape`; empty means
// contiguous storage. With n = gcd(tp_chunks, shape[0], shape[1]):
// [shape0/n, shape1/n, rest...] for >= 2-D, [shape0/gcd(tp_chunks, shape0)]
// for 1-D; scalars and 0-element tensors are contiguous, and so is a tensor
// whose chunk would reach HDF5's 4 GiB chunk limit.
std::vector<int64_t> hdf5_chunk_shape(const std::vector<int64_t>& shape, int elem_bytes, int tp_chunks);

}  // namespace tprun::checkpoint
