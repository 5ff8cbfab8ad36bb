// Shard-on-load to a CUDA device (pinned staging buffers, a copy stream)
// gives bit for bit what the same load to the CPU gives: colwise and rowwise
// slices at this rank's place in the world, dtype conversions on the device,
// layerwise float8 storage. Skipped (reported as skipped) where no GPU is
// visible; run by the gpu_* ctest entries.
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include "checkpoint/component_checkpoint.h"
#include "checkpoint/safetensors_source.h"
#include "checkpoint/safetensors_writer.h"
#include "checkpoint/shard_loader.h"
#include "runtime/device.h"
#include "test_data.h"

namespace tprun::checkpoint {
namespace {

// The tensor's bytes, so that fp8 and NaNs compare exactly too.
at::Tensor bytes_of(const at::Tensor& t) { return t.contiguous().flatten().view(at::kByte); }

void expect_same(const at::Tensor& on_cuda, const at::Tensor& on_cpu, const std::string& what) {
  ASSERT_TRUE(on_cuda.is_cuda()) << what;
  ASSERT_TRUE(on_cpu.is_cpu()) << what;
  EXPECT_EQ(on_cuda.scalar_type(), on_cpu.scalar_type()) << what;
  EXPECT_EQ(on_cuda.sizes(), on_cpu.sizes()) << what;
  EXPECT_TRUE(at::equal(bytes_of(on_cuda.cpu()), bytes_of(on_cpu))) << what;
}

TEST(GpuShardLoad, CudaLoadsEqualCpuLoads) {
  const int gpus = cuda_device_count();
  if (gpus == 0) GTEST_SKIP() << "no GPU visible";
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const std::string cuda = "cuda:" + std::to_string(rank % gpus);

  // Each rank writes its own small checkpoint; sizes divide by the world.
  test::TempDir dir;
  const int64_t rows = 8 * world, cols = 6 * world;
  std::vector<at::Tensor> keep;  // the payloads' memory
  std::vector<TensorPayload> payload;
  auto add = [&](const std::string& name, Dtype dtype, at::Tensor t) {
    keep.push_back(t.contiguous());
    TensorPayload p;
    p.name = name;
    p.dtype = dtype;
    p.shape = keep.back().sizes().vec();
    p.data = keep.back().data_ptr();
    payload.push_back(p);
  };
  add("w32", Dtype::F32, at::randn({rows, cols}));
  add("w16", Dtype::BF16, at::randn({rows, cols}).to(at::kBFloat16));
  add("f8", Dtype::F8_E4M3, at::randn({rows, cols}).to(at::kFloat8_e4m3fn));
  add("bias", Dtype::F32, at::randn({rows}));
  // Slices of many sizes, one larger than all before it, so the staging
  // buffers are reused and regrown.
  for (int i = 0; i < 9; ++i) add("layer." + std::to_string(i), i % 2 ? Dtype::BF16 : Dtype::F32,
                                  at::randn({rows * (i == 6 ? 40 : 1 + i % 4), cols}).to(i % 2 ? at::kBFloat16 : at::kFloat));
  const std::string file = dir / "model.safetensors";
  write_safetensors(file, payload);
  auto ck = std::make_shared<const ComponentCheckpoint>(ComponentCheckpoint::open(file));

  const ShardRequest col{ShardStyle::Colwise, rank, world, {}, false};
  const ShardRequest row{ShardStyle::Rowwise, rank, world, {}, false};
  const ShardRequest whole{};

  for (const std::string dtype : {"", "fp32", "bf16"}) {
    SCOPED_TRACE("dtype '" + dtype + "'");
    SafetensorsSource src_gpu(ck), src_cpu(ck);
    ShardLoader gpu(src_gpu, {LoadMode::ShardOnLoad, cuda, dtype});
    ShardLoader cpu(src_cpu, {LoadMode::ShardOnLoad, "cpu", dtype});

    std::vector<LoadItem> items = {{"w32", col}, {"w16", row}, {"f8", col}, {"bias", whole}, {"w32", row}};
    for (int i = 0; i < 9; ++i) items.push_back({"layer." + std::to_string(i), i % 3 ? col : row});
    const auto on_gpu = gpu.load_many(items);
    const auto on_cpu = cpu.load_many(items);
    ASSERT_EQ(on_gpu.size(), items.size());
    for (size_t i = 0; i < items.size(); ++i) expect_same(on_gpu[i], on_cpu[i], "load_many " + items[i].name);

    // One at a time, as the model builder loads: load, load_as, load_cast.
    expect_same(gpu.load("w16", col), cpu.load("w16", col), "load w16 col");
    expect_same(gpu.load("w32", row), cpu.load("w32", row), "load w32 row");
    expect_same(gpu.load_as("w16", row, "fp32"), cpu.load_as("w16", row, "fp32"), "load_as w16 fp32");
    expect_same(gpu.load_as("w32", col, "bf16"), cpu.load_as("w32", col, "bf16"), "load_as w32 bf16");
    expect_same(gpu.load_cast("w32", row, at::kFloat8_e4m3fn), cpu.load_cast("w32", row, at::kFloat8_e4m3fn),
                "load_cast w32 e4m3");
    expect_same(gpu.load_cast("w16", col, at::kFloat8_e5m2), cpu.load_cast("w16", col, at::kFloat8_e5m2),
                "load_cast w16 e5m2");
    expect_same(gpu.load_cast("bias", whole, at::kFloat8_e4m3fn), cpu.load_cast("bias", whole, at::kFloat8_e4m3fn),
                "load_cast bias e4m3");
    EXPECT_EQ(gpu.bytes_read(), cpu.bytes_read()) << "the CUDA load reads only the slices too";
  }
}

}  // namespace
}  // namespace tprun::checkpoint
