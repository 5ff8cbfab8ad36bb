// Shard-on-load across real ranks: every rank of a TP group loads only its
// slices of the diffusers reference Flux checkpoint; gathering the slices over
// the communicator gives back the whole tensors.
#include <cstdlib>
#include <filesystem>

#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include "checkpoint/component_checkpoint.h"
#include "checkpoint/safetensors_source.h"
#include "checkpoint/shard_loader.h"
#include "dist/comm_watchdog.h"
#include "dist/mpi_communicator.h"
#include "models/model_registry.h"
#include "test_data.h"

namespace tprun::checkpoint {
namespace {

namespace fs = std::filesystem;

TEST(ShardOnLoad, SlicesGatherBackToTheReferenceTensors) {
  const fs::path dir = test::data_dir("flux_transformer") / "model";
  ASSERT_TRUE(fs::exists(dir)) << "committed reference data missing: " << dir;
  dist::MpiCommunicator comm(MPI_COMM_WORLD, "world", dist::CommWatchdog::global());
  const int tp = comm.size();
  if (4 % tp != 0) GTEST_SKIP() << "the reference model has 4 heads";
  auto ck = std::make_shared<const ComponentCheckpoint>(ComponentCheckpoint::open(dir.string()));
  auto table = models::model_table_for(ck->config(), (dir / "config.json").string());
  ASSERT_TRUE(table);
  SafetensorsSource src_mine(ck), src_all(ck);
  ShardLoader mine(src_mine, {}), whole(src_all, {});
  std::vector<LoadItem> items;
  for (const auto& spec : table->tensors) items.push_back(LoadItem{spec.name, table->request(spec.name, comm.rank(), tp)});
  auto parts = mine.load_many(items);
  uint64_t expected_bytes = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const auto& spec = table->tensors[i];
    at::Tensor full = whole.load(spec.name, {});
    const bool col = spec.style == ShardStyle::Colwise || spec.style == ShardStyle::PackedColwise;
    expected_bytes += static_cast<uint64_t>(parts[i].numel()) * parts[i].element_size();
    if (spec.style == ShardStyle::Replicated) {
      EXPECT_TRUE(at::equal(parts[i], full)) << spec.name;
      continue;
    }
    at::Tensor gathered = comm.all_gather(parts[i], {col ? 0 : 1});
    if (spec.style == ShardStyle::PackedRowwise) {
      // Each rank holds [its part of block 0, its part of block 1, ...].
      std::vector<at::Tensor> pieces;
      int64_t offset = 0;
      for (int64_t b : spec.blocks) {
        for (int r = 0; r < tp; ++r) {
          pieces.push_back(gathered.narrow(1, r * parts[i].size(1) + offset / tp, b / tp));
        }
        offset += b;
      }
      gathered = at::cat(pieces, 1);
    }
    EXPECT_TRUE(at::equal(gathered, full)) << spec.name;
  }
  EXPECT_EQ(mine.bytes_read(), expected_bytes) << "each rank read exactly its slices";
}

}  // namespace
}  // namespace tprun::checkpoint
