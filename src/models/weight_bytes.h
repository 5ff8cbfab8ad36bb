#pragma once
// What one TP rank of a component reads and keeps, from the checkpoint's
// headers and the model table alone (no weight byte read): `tprun inspect`'s
// bytes per rank and the fit planner's weight bytes (pipelines/fit_planner.h).
//
//   read       each stored tensor's slice under the table's TP plan, in the
//              checkpoint's dtype (what a load reads: Model::bytes_loaded)
//   resident   what the load keeps on the compute device, by the rules of
//              ModelBuilder::load: each slice in the compute dtype (or the
//              dtype its declaration keeps), Linear / Conv / Embedding
//              weights and biases in the layerwise-casting storage dtype
//              unless skipped, offloaded and device-mapped tensors left out
//              (Model::bytes_stored)
// A table built with a load's options (ModelOptions::hidden_layers, part)
// marks what that load never reads as optional.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/dtype.h"
#include "models/model_builder.h"
#include "models/model_table.h"

namespace tprun::models {

// One tensor as a checkpoint stores it.
struct StoredRow {
  std::string name;
  checkpoint::Dtype dtype = checkpoint::Dtype::F32;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
  std::string file;  // the file's name (not its path)
};

// A component checkpoint (folder or .h5 file) as its headers describe it.
struct ComponentListing {
  nlohmann::json config = nlohmann::json::object();
  bool has_config = false;
  std::string config_path;
  std::string index;  // the shard index file ("" when none)
  std::vector<std::string> files;
  std::vector<StoredRow> rows;  // sorted by name
  uint64_t total = 0;
  std::vector<std::string> names() const;
};

// Reads only headers (and config.json). CheckpointError for a bad checkpoint.
ComponentListing list_component(const std::string& path, const std::string& variant);

// Which stored tensors count (null: all of them).
using RowFilter = std::function<bool(const StoredRow& row)>;

// Bytes each of `tp` ranks reads of `rows`: a tensor the table knows is
// sliced by its plan, one it does not know (or any without a table) is read
// whole. CheckpointError for a split that does not divide.
std::vector<uint64_t> bytes_per_rank(const std::vector<StoredRow>& rows, const ModelTable* table, int tp,
                                     const RowFilter& counted = {});

// One rank's weights of a component under a load's options.
struct RankWeights {
  uint64_t read = 0;           // from the checkpoint, in its dtypes (Model::bytes_loaded)
  uint64_t resident = 0;       // on the compute device for the whole run (Model::bytes_stored)
  uint64_t offloaded = 0;      // in offload / device-map groups off the device (host or disk)
  uint64_t host = 0;           // of `offloaded`, the bytes on the host tier
  uint64_t largest_group = 0;  // the largest group: what one use brings to the device
};

// The weights rank `rank` of `tp` holds of the table's non-optional tensors
// (and build.wanted's, when set) as a load with `build` keeps them on
// `build.device`. CheckpointError naming `source` (the checkpoint) and the
// tensor for one the table needs that `rows` lacks; ConfigError for a bad
// skip pattern or device map.
RankWeights rank_weights(const std::vector<StoredRow>& rows, const ModelTable& table, int rank, int tp,
                         const BuildOptions& build, const std::string& source);

}  // namespace tprun::models
