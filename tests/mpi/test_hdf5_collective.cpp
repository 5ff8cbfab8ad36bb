// Collective HDF5 reading (MPI-IO): every rank reads its own TP slice of each
// tensor in one collective H5Dread and gets exactly the bytes SafetensorsSource
// gives; also on sub-communicators (TP groups smaller than the world).
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include <ATen/core/Tensor.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include "checkpoint/component_checkpoint.h"
#include "checkpoint/hdf5_source.h"
#include "checkpoint/hdf5_writer.h"
#include "checkpoint/safetensors_source.h"
#include "checkpoint/safetensors_writer.h"
#include "checkpoint/shard_loader.h"
#include "checkpoint/slice_plan.h"
#include "runtime/error.h"

namespace tprun::checkpoint {
namespace {

namespace fs = std::filesystem;

struct Spec {
  std::string name;
  Dtype dtype;
  std::vector<int64_t> shape;
};

// Split dims divisible by 4 (and packed blocks of 9 units by 4).
const std::vector<Spec> kSpecs = {
    {"attn.qkv.weight", Dtype::BF16, {72, 72}}, {"attn.qkv.bias", Dtype::BF16, {72}},
    {"attn.out.weight", Dtype::F16, {16, 24}},  {"mlp.weight", Dtype::F32, {32, 16}},
    {"conv.weight", Dtype::F32, {8, 12, 3}},    {"ids", Dtype::I64, {8, 4}},
    {"scale", Dtype::F32, {}},                  {"empty", Dtype::F32, {0, 8}},
    {"odd", Dtype::F32, {5, 3}},
};

int rank_of(MPI_Comm c) {
  int r = 0;
  MPI_Comm_rank(c, &r);
  return r;
}
int size_of(MPI_Comm c) {
  int n = 1;
  MPI_Comm_size(c, &n);
  return n;
}

// Rank 0 writes the component and converts it; every rank gets the folder.
// Empty string on every rank when rank 0 failed.
std::string make_shared_checkpoint() {
  std::string dir;
  if (rank_of(MPI_COMM_WORLD) == 0) {
    try {
      char tmpl[] = "/tmp/tprun-hdf5-mpi-XXXXXX";
      if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
      dir = tmpl;
      const std::string comp = dir + "/transformer";
      fs::create_directories(comp);
      write_file_atomically(comp + "/config.json", "{\"_class_name\": \"T\"}\n", false);
      std::mt19937 gen(42);
      std::vector<std::vector<uint8_t>> store;
      std::vector<TensorPayload> payload;
      for (const auto& s : kSpecs) {
        store.emplace_back(StoredTensor{s.name, s.dtype, s.shape}.nbytes());
        for (auto& b : store.back()) b = static_cast<uint8_t>(gen());
        TensorPayload p;
        p.name = s.name;
        p.dtype = s.dtype;
        p.shape = s.shape;
        p.data = store.back().data();
        payload.push_back(std::move(p));
      }
      write_safetensors(comp + "/diffusion_pytorch_model.safetensors", std::move(payload));
      convert_to_hdf5(ComponentCheckpoint::open(comp), dir + "/transformer.h5", {});
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank 0 could not write the checkpoint: " << e.what();
      dir.clear();
    }
  }
  int len = static_cast<int>(dir.size());
  MPI_Bcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD);
  dir.resize(static_cast<size_t>(len));
  if (len > 0) MPI_Bcast(dir.data(), len, MPI_CHAR, 0, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  return dir;
}

void remove_shared(const std::string& dir) {
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank_of(MPI_COMM_WORLD) == 0 && !dir.empty()) fs::remove_all(dir);
}

struct StyleCase {
  ShardStyle style;
  std::vector<int64_t> blocks;
};

const std::vector<StyleCase> kStyles = {
    {ShardStyle::Colwise, {}},
    {ShardStyle::Rowwise, {}},
    {ShardStyle::PackedColwise, {1, 1, 1, 3, 3}},
    {ShardStyle::PackedRowwise, {1, 1}},
    {ShardStyle::Replicated, {}},
};

// Every tensor in every style at tp = size of `group`, read collectively over
// `group`, against SafetensorsSource (independent reads).
void compare_group(const std::string& dir, MPI_Comm group) {
  const int tp = size_of(group), rank = rank_of(group);
  auto ckpt = std::make_shared<const ComponentCheckpoint>(ComponentCheckpoint::open(dir + "/transformer"));
  SafetensorsSource st(ckpt);
  Hdf5Source h5(dir + "/transformer.h5", group);
  EXPECT_TRUE(h5.collective());
  EXPECT_EQ(h5.tensor_names(), st.tensor_names());
  EXPECT_EQ(h5.config(), ckpt->config());
  uint64_t reads = 0, compared = 0;
  for (const auto& name : st.tensor_names()) {  // same order on every rank
    const StoredTensor info = st.describe(name);
    for (const auto& sc : kStyles) {
      ShardRequest r;
      r.style = sc.style;
      r.blocks = sc.blocks;
      r.tp_size = tp;
      r.tp_rank = rank;
      SlicePlan plan;
      try {
        plan = plan_slice(name, info.shape, dtype_bits(info.dtype), r);
      } catch (const CheckpointError&) {
        continue;  // the same on every rank: shapes do not depend on the rank
      }
      SCOPED_TRACE(fmt::format("{} {} tp {} rank {}", name, shard_style_name(sc.style), tp, rank));
      std::vector<uint8_t> want(plan.bytes + 1, 0xCD), got(plan.bytes + 1, 0xCD);
      st.read_slice(name, r, plan, want.data());
      h5.read_slice(name, r, plan, got.data());  // collective
      EXPECT_TRUE(want == got) << "slice bytes differ";
      if (plan.bytes > 0) ++reads;
      ++compared;
    }
  }
  EXPECT_GT(compared, 20u);
  EXPECT_EQ(h5.bytes_read(), st.bytes_read());
  // Collective transfers really happened (no type conversion, no fallback).
  EXPECT_EQ(h5.collective_reads(), reads);

  // The loader over a collective source (load_many closes it collectively).
  std::vector<LoadItem> items;
  auto req = [&](ShardStyle s, std::vector<int64_t> blocks = {}) {
    ShardRequest r;
    r.style = s;
    r.tp_size = tp;
    r.tp_rank = rank;
    r.blocks = std::move(blocks);
    return r;
  };
  items.push_back({"attn.qkv.weight", req(ShardStyle::PackedColwise, {1, 1, 1, 3, 3})});
  items.push_back({"attn.out.weight", req(ShardStyle::Rowwise)});
  items.push_back({"mlp.weight", req(ShardStyle::Colwise)});
  items.push_back({"conv.weight", req(ShardStyle::Rowwise)});
  items.push_back({"scale", req(ShardStyle::Replicated)});
  LoadOptions o;
  o.dtype = "fp32";
  ShardLoader a(st, o), b(h5, o);
  const auto ta = a.load_many(items), tb = b.load_many(items);
  for (size_t i = 0; i < items.size(); ++i) {
    at::Tensor x = ta[i].contiguous(), y = tb[i].contiguous();
    EXPECT_EQ(x.sizes(), y.sizes()) << items[i].name;
    EXPECT_EQ(std::memcmp(x.data_ptr(), y.data_ptr(), static_cast<size_t>(x.nbytes())), 0) << items[i].name;
  }
}

TEST(Hdf5Collective, EveryRankReadsItsSliceCollectively) {
  const std::string dir = make_shared_checkpoint();
  if (!dir.empty()) compare_group(dir, MPI_COMM_WORLD);
  remove_shared(dir);
}

TEST(Hdf5Collective, TpGroupsSmallerThanTheWorld) {
  const int world = size_of(MPI_COMM_WORLD);
  if (world < 4) GTEST_SKIP() << "needs 4 ranks (two TP groups of 2)";
  const std::string dir = make_shared_checkpoint();
  MPI_Comm group;
  MPI_Comm_split(MPI_COMM_WORLD, rank_of(MPI_COMM_WORLD) / 2, rank_of(MPI_COMM_WORLD), &group);
  if (!dir.empty()) compare_group(dir, group);
  MPI_Comm_free(&group);
  remove_shared(dir);
}

TEST(Hdf5Collective, BadFilesFailOnEveryRankWithoutHanging) {
  const std::string dir = make_shared_checkpoint();
  if (dir.empty()) return;
  for (const std::string& path : {dir + "/missing.h5", dir + "/transformer/config.json"}) {
    try {
      Hdf5Source s(path, MPI_COMM_WORLD);
      ADD_FAILURE() << "opened " << path;
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
  // hdf5_config is independent I/O: any rank alone.
  EXPECT_EQ(hdf5_config(dir + "/transformer.h5"), nlohmann::json::parse("{\"_class_name\": \"T\"}"));
  remove_shared(dir);
}

}  // namespace
}  // namespace tprun::checkpoint
