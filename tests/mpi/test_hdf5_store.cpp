// The batch job's HDF5 store under mpirun: all ranks create it, each rank
// writes the requests it "made" independently, unwritten datasets are dropped,
// the file appears under its final name only when finished, and what is read
// back (serially) is exactly what was written, with the request's attributes.
#include <filesystem>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>

#include "dist/comm_watchdog.h"
#include "dist/control_plane.h"
#include "jobs/hdf5_store.h"

namespace tprun::jobs {
namespace {

namespace fs = std::filesystem;

TEST(Hdf5Store, RanksWriteTheirOwnRequests) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  std::string dir = rank == 0 ? (fs::temp_directory_path() / fmt::format("tprun-store-{}", ::getpid())).string() : "";
  uint64_t n = dir.size();
  MPI_Bcast(&n, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  dir.resize(n);
  MPI_Bcast(dir.data(), static_cast<int>(n), MPI_CHAR, 0, MPI_COMM_WORLD);
  if (rank == 0) fs::create_directories(dir);  // the job's output folder exists before its store/ is made
  MPI_Barrier(MPI_COMM_WORLD);

  std::vector<JobRequest> reqs(6);
  std::vector<StoreRequest> srs;
  for (int i = 0; i < 6; ++i) {
    reqs[i].id = fmt::format("r{}", i);
    reqs[i].gen.prompt = fmt::format("prompt {} \u00e9", i);
    reqs[i].gen.height = 8 + 8 * (i % 2);
    reqs[i].gen.width = 16;
    reqs[i].gen.steps = 4;
    reqs[i].gen.guidance = 3.5;
    reqs[i].gen.true_cfg_scale = 1.0;
    reqs[i].gen.seed = 100 + i;
    srs.push_back({&reqs[i], {4, 8}});
  }
  std::set<std::string> written;
  std::string final_path;
  {
    dist::ControlPlane control(dist::CommWatchdog::global());
    Hdf5Store store(dir, true, true, srs, control, MPI_COMM_WORLD);
    for (int i = 0; i < 5; ++i) {  // r5 "failed": never written
      written.insert(reqs[i].id);
      if (i % world != rank) continue;
      std::vector<uint8_t> rgb(static_cast<size_t>(*reqs[i].gen.height * 16 * 3));
      for (size_t k = 0; k < rgb.size(); ++k) rgb[k] = static_cast<uint8_t>((k * 7 + i) % 251);
      at::Tensor lat = at::arange(32, at::kFloat).view({1, 4, 8}) + i;
      store.write(reqs[i].id, rgb, lat);
    }
    final_path = store.path();
    EXPECT_FALSE(fs::exists(final_path)) << "visible before it is finished";
    EXPECT_EQ(store.finish(written), final_path);
  }
  if (rank == 0) {
    ASSERT_TRUE(fs::exists(final_path));
    EXPECT_EQ(Hdf5Store::stored_ids(dir, true, true), written);
    hid_t f = H5Fopen(final_path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    for (int i = 0; i < 5; ++i) {
      hid_t d = H5Dopen2(f, ("images/" + reqs[i].id).c_str(), H5P_DEFAULT);
      ASSERT_GE(d, 0);
      std::vector<uint8_t> got(static_cast<size_t>(*reqs[i].gen.height * 16 * 3));
      ASSERT_GE(H5Dread(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, got.data()), 0);
      for (size_t k = 0; k < got.size(); ++k) ASSERT_EQ(got[k], static_cast<uint8_t>((k * 7 + i) % 251)) << i;
      uint64_t seed = 0;
      hid_t a = H5Aopen(d, "seed", H5P_DEFAULT);
      H5Aread(a, H5T_NATIVE_UINT64, &seed);
      H5Aclose(a);
      EXPECT_EQ(seed, 100u + i);
      H5Dclose(d);
      hid_t l = H5Dopen2(f, ("latents/" + reqs[i].id).c_str(), H5P_DEFAULT);
      std::vector<float> lat(32);
      ASSERT_GE(H5Dread(l, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, lat.data()), 0);
      EXPECT_EQ(lat[5], 5.0f + i);
      H5Dclose(l);
    }
    EXPECT_LE(H5Lexists(f, "images/r5", H5P_DEFAULT), 0) << "an unwritten dataset was kept";
    H5Fclose(f);
    fs::remove_all(dir);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// Issue 32: a frame sequence (frames > 1) is stored as [F, H, W, 3] with a
// `frames` attribute; an image next to it keeps [H, W, 3] and no such attribute.
TEST(Hdf5Store, FrameSequencesAndImagesSideBySide) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  std::string dir =
      rank == 0 ? (fs::temp_directory_path() / fmt::format("tprun-store-frames-{}", ::getpid())).string() : "";
  uint64_t n = dir.size();
  MPI_Bcast(&n, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  dir.resize(n);
  MPI_Bcast(dir.data(), static_cast<int>(n), MPI_CHAR, 0, MPI_COMM_WORLD);
  if (rank == 0) fs::create_directories(dir);
  MPI_Barrier(MPI_COMM_WORLD);

  const hsize_t h = 4, w = 6;
  std::vector<JobRequest> reqs(3);
  std::vector<StoreRequest> srs;
  const int64_t frames[] = {1, 5, 0};  // 0: frames unset (an image)
  for (int i = 0; i < 3; ++i) {
    reqs[i].id = fmt::format("v{}", i);
    reqs[i].gen.prompt = "a fox";
    reqs[i].gen.height = h;
    reqs[i].gen.width = w;
    reqs[i].gen.steps = 2;
    if (frames[i] > 0) reqs[i].gen.frames = frames[i];
    srs.push_back({&reqs[i], {4, 8}});
  }
  // A request with LoRA adapters carries them as the "loras" attribute (results.jsonl's array); the others none.
  const std::string loras = R"([{"path":"a.safetensors","resolved":"/x/a.safetensors","scale":0.7,"xxh3":"0123"}])";
  srs[1].loras = loras;
  auto bytes_of = [&](int i) {
    std::vector<uint8_t> rgb(static_cast<size_t>(reqs[i].gen.frame_count() * h * w * 3));
    for (size_t k = 0; k < rgb.size(); ++k) rgb[k] = static_cast<uint8_t>((k * 13 + i) % 253);
    return rgb;
  };
  const std::set<std::string> written = {"v0", "v1", "v2"};
  std::string final_path;
  {
    dist::ControlPlane control(dist::CommWatchdog::global());
    Hdf5Store store(dir, true, false, srs, control, MPI_COMM_WORLD);
    for (int i = 0; i < 3; ++i) {
      if (i % world == rank) store.write(reqs[i].id, bytes_of(i), at::zeros({1, 4, 8}));
    }
    final_path = store.path();
    store.finish(written);
  }
  if (rank == 0) {
    EXPECT_EQ(Hdf5Store::stored_ids(dir, true, false), written);
    hid_t f = H5Fopen(final_path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    for (int i = 0; i < 3; ++i) {
      hid_t d = H5Dopen2(f, ("images/" + reqs[i].id).c_str(), H5P_DEFAULT);
      ASSERT_GE(d, 0);
      hid_t space = H5Dget_space(d);
      std::vector<hsize_t> dims(static_cast<size_t>(H5Sget_simple_extent_ndims(space)));
      H5Sget_simple_extent_dims(space, dims.data(), nullptr);
      H5Sclose(space);
      const bool video = reqs[i].gen.frame_count() > 1;
      const std::vector<hsize_t> want =
          video ? std::vector<hsize_t>{5, h, w, 3} : std::vector<hsize_t>{h, w, 3};
      EXPECT_EQ(dims, want) << i;
      EXPECT_EQ(H5Aexists(d, "frames"), video ? 1 : 0) << i;
      EXPECT_EQ(H5Aexists(d, "loras"), i == 1 ? 1 : 0) << i;
      if (i == 1) {
        hid_t a = H5Aopen(d, "loras", H5P_DEFAULT);
        hid_t type = H5Aget_type(a);
        std::string text(H5Tget_size(type), '\0');
        H5Aread(a, type, text.data());
        H5Tclose(type);
        H5Aclose(a);
        EXPECT_EQ(text, loras);
      }
      if (video) {
        int64_t got = 0;
        hid_t a = H5Aopen(d, "frames", H5P_DEFAULT);
        H5Aread(a, H5T_NATIVE_INT64, &got);
        H5Aclose(a);
        EXPECT_EQ(got, 5);
      }
      std::vector<uint8_t> got(bytes_of(i).size());
      ASSERT_GE(H5Dread(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, got.data()), 0);
      EXPECT_EQ(got, bytes_of(i)) << i;
      H5Dclose(d);
    }
    H5Fclose(f);
    fs::remove_all(dir);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace tprun::jobs
