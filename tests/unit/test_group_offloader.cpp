// memory::GroupOffloader on the CPU: host groups and disk groups taking turns
// on the device (one group in use, plus the one read ahead with prefetch), the
// disk group's file (written once its last tensor arrives, with the
// fingerprint and the XXH3-64 of its bytes in names order), reuse of an
// intact file only, errors for a file replaced or corrupted while in use (a
// read-ahead included), the per-group writer lock, and the misuse errors.
// The offloader is one per process: every case registers its own groups and
// compares statistics before and after.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "checkpoint/safetensors_header.h"
#include "checkpoint/safetensors_writer.h"
#include "checkpoint/torch_dtype.h"
#include "memory/group_offloader.h"
#include "runtime/error.h"

namespace tprun::memory {
namespace {

namespace fs = std::filesystem;

// A folder of its own for each case, removed at the end.
class GroupOffloaderTest : public testing::Test {
 protected:
  void SetUp() override {
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / fmt::format("tprun-offloader-{}-{}", ::getpid(), info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

GroupOffloader& offloader() { return GroupOffloader::instance(); }

// The group's tensors, distinct per `seed`: fp32 matrix, bf16 vector, int64.
std::vector<at::Tensor> tensors_of(int seed) {
  return {at::arange(24, at::kFloat).view({4, 6}) + seed, at::full({5}, 0.5 + seed, at::kBFloat16),
          at::arange(3, at::kLong) * (seed + 1)};
}
const std::vector<std::string> kNames = {"blocks.0.linear.weight", "blocks.0.norm.weight", "blocks.0.index"};

GroupSpec host_spec(const std::string& label, bool prefetch = false) {
  GroupSpec s;
  s.label = label;
  s.tier = Tier::Host;
  s.device = "cpu";
  s.prefetch = prefetch;
  s.names = kNames;
  return s;
}

GroupSpec disk_spec(const std::string& file, const std::string& label, bool prefetch = false,
                    const std::string& fingerprint = "fp-1") {
  GroupSpec s = host_spec(label, prefetch);
  s.tier = Tier::Disk;
  s.file = file;
  s.fingerprint = fingerprint;
  return s;
}

void fill(int group, int seed) {
  const auto ts = tensors_of(seed);
  for (size_t i = 0; i < ts.size(); ++i) offloader().put(group, i, ts[i]);
}

uint64_t bytes_of(int seed) {
  uint64_t n = 0;
  for (const auto& t : tensors_of(seed)) n += static_cast<uint64_t>(t.nbytes());
  return n;
}

void expect_holds(int group, int seed) {
  const auto want = tensors_of(seed);
  for (size_t i = 0; i < want.size(); ++i) {
    const at::Tensor got = offloader().get(group, i);
    EXPECT_EQ(got.scalar_type(), want[i].scalar_type()) << kNames[i];
    EXPECT_TRUE(at::equal(got, want[i])) << kNames[i] << " of group " << group;
  }
}

// The error `fn` raises (of type E), or a test failure.
template <typename E, typename Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

void flip_byte(const std::string& path, uint64_t offset) {
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path;
  unsigned char c = 0;
  ASSERT_EQ(::pread(fd, &c, 1, static_cast<off_t>(offset)), 1);
  c ^= 0x5A;
  ASSERT_EQ(::pwrite(fd, &c, 1, static_cast<off_t>(offset)), 1);
  ::close(fd);
}

TEST_F(GroupOffloaderTest, HostGroupsTakeTurnsOnTheDevice) {
  auto& o = offloader();
  const auto before = o.stats();
  const int a = o.add_group(host_spec("host a"));
  const int b = o.add_group(host_spec("host b"));
  EXPECT_FALSE(o.reusable(a));
  // A non-contiguous tensor is kept as a contiguous host copy.
  const auto ts = tensors_of(1);
  o.put(a, 0, ts[0].t().contiguous().t());
  o.put(a, 1, ts[1]);
  o.put(a, 2, ts[2]);
  fill(b, 2);
  o.check_complete({a, b});
  EXPECT_EQ(o.group_bytes(a), bytes_of(1));

  expect_holds(a, 1);  // one load for all of a's tensors
  auto s = o.stats();
  EXPECT_EQ(s.groups - before.groups, 2);
  EXPECT_EQ(s.loads - before.loads, 1);
  EXPECT_EQ(s.bytes_moved - before.bytes_moved, bytes_of(1));
  const at::Tensor held = o.get(a, 0);
  expect_holds(b, 2);  // a goes back, b comes in
  expect_holds(a, 1);  // and a again
  s = o.stats();
  EXPECT_EQ(s.loads - before.loads, 3);
  EXPECT_EQ(s.bytes_moved - before.bytes_moved, 2 * bytes_of(1) + bytes_of(2));
  EXPECT_EQ(s.prefetch_hits - before.prefetch_hits, 0);
  EXPECT_EQ(s.files_written - before.files_written, 0);
  EXPECT_TRUE(at::equal(held, tensors_of(1)[0])) << "a tensor handed out stays valid after its group went back";
}

TEST_F(GroupOffloaderTest, DiskGroupFileHoldsFingerprintAndXxh3) {
  auto& o = offloader();
  const std::string path = file("g.safetensors");
  const auto before = o.stats();
  const int g = o.add_group(disk_spec(path, "disk g"));
  EXPECT_FALSE(o.reusable(g));
  const auto ts = tensors_of(3);
  o.put(g, 0, ts[0]);
  o.put(g, 1, ts[1]);
  EXPECT_FALSE(fs::exists(path)) << "written before the group's last tensor arrived";
  o.put(g, 2, ts[2]);
  ASSERT_TRUE(fs::exists(path));
  EXPECT_TRUE(fs::exists(path + ".lock"));
  EXPECT_EQ(o.stats().files_written - before.files_written, 1);

  const auto header = checkpoint::read_safetensors_header(path);
  EXPECT_EQ(header.metadata.at("tprun_offload"), "fp-1");
  EXPECT_EQ(header.metadata.at("group"), "disk g");
  std::string bytes;
  for (size_t i = 0; i < ts.size(); ++i) {
    const auto* e = header.find(kNames[i]);
    ASSERT_NE(e, nullptr) << kNames[i];
    EXPECT_EQ(e->shape, ts[i].sizes().vec());
    EXPECT_EQ(e->dtype, checkpoint::from_torch(ts[i].scalar_type()));
    bytes.append(static_cast<const char*>(ts[i].data_ptr()), static_cast<size_t>(ts[i].nbytes()));
  }
  EXPECT_EQ(header.metadata.at("tprun_xxh3"),
            fmt::format("{:016x}", static_cast<uint64_t>(XXH3_64bits(bytes.data(), bytes.size()))));

  const uint64_t moved = o.stats().bytes_moved;
  expect_holds(g, 3);
  EXPECT_EQ(o.stats().bytes_moved - moved, bytes_of(3));
}

TEST_F(GroupOffloaderTest, OnlyAnIntactFileOfTheSameGroupIsReused) {
  auto& o = offloader();
  const std::string path = file("g.safetensors");
  fill(o.add_group(disk_spec(path, "first")), 4);
  const auto before = o.stats();

  const int same = o.add_group(disk_spec(path, "same"));
  EXPECT_TRUE(o.reusable(same));
  EXPECT_EQ(o.group_bytes(same), bytes_of(4));
  o.check_complete({same});  // complete without a tensor put
  EXPECT_NE(error_of<Error>([&] { o.put(same, 0, tensors_of(4)[0]); }).find("given twice or out of place"),
            std::string::npos);
  expect_holds(same, 4);

  GroupSpec fewer = disk_spec(path, "fewer");
  fewer.names.pop_back();
  EXPECT_FALSE(o.reusable(o.add_group(fewer)));
  EXPECT_FALSE(o.reusable(o.add_group(disk_spec(path, "other settings", false, "fp-2"))));
  EXPECT_EQ(o.stats().files_reused - before.files_reused, 1);

  // A stale file is rewritten from the group's tensors.
  const int other = o.add_group(disk_spec(path, "rewrite", false, "fp-2"));
  fill(other, 5);
  const auto after = o.stats();
  EXPECT_EQ(after.files_written - before.files_written, 1);
  EXPECT_EQ(after.files_rewritten - before.files_rewritten, 1);
  EXPECT_EQ(checkpoint::read_safetensors_header(path).metadata.at("tprun_offload"), "fp-2");
  expect_holds(other, 5);

  // A byte of the data changed (same size): not reused.
  flip_byte(path, fs::file_size(path) - 3);
  EXPECT_FALSE(o.reusable(o.add_group(disk_spec(path, "edited", false, "fp-2"))));
}

TEST_F(GroupOffloaderTest, CorruptedFileInUseIsAnErrorNamingIt) {
  auto& o = offloader();
  const std::string path = file("g.safetensors"), spare = file("spare.safetensors");
  const int g = o.add_group(disk_spec(path, "victim"));
  const int s = o.add_group(disk_spec(spare, "spare"));
  fill(g, 6);
  fill(s, 7);
  expect_holds(g, 6);

  // A data byte flipped: IoError naming the file and the hash.
  expect_holds(s, 7);
  const auto header = checkpoint::read_safetensors_header(path);
  flip_byte(path, header.data_start);
  std::string why = error_of<IoError>([&] { o.get(g, 0); });
  EXPECT_NE(why.find(path), std::string::npos) << why;
  EXPECT_NE(why.find("XXH3"), std::string::npos) << why;
  flip_byte(path, header.data_start);  // restored: readable again
  expect_holds(g, 6);

  // Replaced by a file of other weights: a CheckpointError saying so.
  expect_holds(s, 7);
  const at::Tensor other = at::zeros({2}, at::kFloat);
  checkpoint::TensorPayload p;
  p.name = kNames[0];
  p.dtype = checkpoint::Dtype::F32;
  p.shape = {2};
  p.data = other.data_ptr();
  checkpoint::write_safetensors(path, {p}, {{"tprun_offload", "fp-other"}}, /*overwrite=*/true);
  why = error_of<CheckpointError>([&] { o.get(g, 0); });
  EXPECT_NE(why.find(path), std::string::npos) << why;
  EXPECT_NE(why.find("replaced by other weights"), std::string::npos) << why;

  // Truncated: an error naming the file, and not reusable.
  fs::resize_file(path, 4);
  why = error_of<Error>([&] { o.get(g, 0); });
  EXPECT_NE(why.find(path), std::string::npos) << why;
  EXPECT_FALSE(o.reusable(o.add_group(disk_spec(path, "after truncation"))));
}

TEST_F(GroupOffloaderTest, PrefetchReadsTheGroupThatFollowedLastTime) {
  auto& o = offloader();
  const int a = o.add_group(disk_spec(file("a.safetensors"), "a", true));
  const int b = o.add_group(disk_spec(file("b.safetensors"), "b", true));
  fill(a, 8);
  fill(b, 9);
  const auto before = o.stats();
  expect_holds(a, 8);
  expect_holds(b, 9);  // b follows a
  expect_holds(a, 8);  // ... so b is read ahead now
  expect_holds(b, 9);
  const auto s = o.stats();
  EXPECT_EQ(s.loads - before.loads, 4);
  EXPECT_EQ(s.prefetch_hits - before.prefetch_hits, 1);

  // Without prefetch the same order reads every group when it is used.
  const int c = o.add_group(disk_spec(file("c.safetensors"), "c"));
  const int d = o.add_group(disk_spec(file("d.safetensors"), "d"));
  fill(c, 1);
  fill(d, 2);
  const auto plain = o.stats();
  for (int i = 0; i < 2; ++i) {
    expect_holds(c, 1);
    expect_holds(d, 2);
  }
  EXPECT_EQ(o.stats().prefetch_hits - plain.prefetch_hits, 0);
}

TEST_F(GroupOffloaderTest, CorruptedFileReadAheadIsAnErrorWhenUsed) {
  auto& o = offloader();
  const std::string bpath = file("b.safetensors");
  const int a = o.add_group(disk_spec(file("a.safetensors"), "a", true));
  const int b = o.add_group(disk_spec(bpath, "b", true));
  fill(a, 3);
  fill(b, 4);
  expect_holds(a, 3);
  expect_holds(b, 4);
  flip_byte(bpath, fs::file_size(bpath) - 1);
  expect_holds(a, 3);  // reads b ahead, from the changed file
  const std::string why = error_of<IoError>([&] { o.get(b, 0); });
  EXPECT_NE(why.find(bpath), std::string::npos) << why;
}

TEST_F(GroupOffloaderTest, WriterWaitsForTheGroupFileLock) {
  auto& o = offloader();
  const std::string path = file("g.safetensors");
  const int g = o.add_group(disk_spec(path, "locked"));
  const auto ts = tensors_of(2);
  o.put(g, 0, ts[0]);
  o.put(g, 1, ts[1]);
  // Another run holds the group's lock: the last put waits for it.
  const int lock = ::open((path + ".lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(lock, 0);
  ASSERT_EQ(::flock(lock, LOCK_EX), 0);
  auto last = std::async(std::launch::async, [&] { o.put(g, 2, ts[2]); });
  EXPECT_EQ(last.wait_for(std::chrono::milliseconds(400)), std::future_status::timeout)
      << "the group file was written while another run held its lock";
  EXPECT_FALSE(fs::exists(path));
  ::close(lock);  // released
  ASSERT_EQ(last.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  last.get();
  EXPECT_TRUE(fs::exists(path));
  expect_holds(g, 2);
}

TEST_F(GroupOffloaderTest, FileWrittenMeanwhileBySharingRunIsNotRewritten) {
  auto& o = offloader();
  const std::string path = file("g.safetensors");
  // Both registered before either wrote: neither finds a file to reuse.
  const int first = o.add_group(disk_spec(path, "first run"));
  const int second = o.add_group(disk_spec(path, "second run"));
  EXPECT_FALSE(o.reusable(second));
  const auto before = o.stats();
  fill(first, 5);
  struct stat written {};
  ASSERT_EQ(::stat(path.c_str(), &written), 0);
  fill(second, 5);
  struct stat now {};
  ASSERT_EQ(::stat(path.c_str(), &now), 0);
  EXPECT_EQ(now.st_ino, written.st_ino) << "the finished file was replaced";
  const auto s = o.stats();
  EXPECT_EQ(s.files_written - before.files_written, 1);
  EXPECT_EQ(s.files_shared - before.files_shared, 1);
  expect_holds(second, 5);
}

TEST_F(GroupOffloaderTest, MisuseIsAnInternalError) {
  auto& o = offloader();
  const int g = o.add_group(host_spec("misused"));
  const auto ts = tensors_of(0);
  o.put(g, 0, ts[0]);
  auto internal = [](auto fn) {
    try {
      fn();
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), Error::Kind::Internal) << e.what();
      return std::string(e.what());
    }
    ADD_FAILURE() << "no error";
    return std::string();
  };
  EXPECT_NE(internal([&] { o.put(g, 0, ts[0]); }).find("tensor 0 given twice"), std::string::npos);
  EXPECT_NE(internal([&] { o.put(g, 3, ts[0]); }).find("given twice or out of place"), std::string::npos);
  EXPECT_EQ(internal([&] { o.check_complete({g}); }), "offload group misused: 1 of 3 tensors were loaded");
  EXPECT_NE(internal([&] { o.get(1 << 30, 0); }).find("does not exist"), std::string::npos);
  o.put(g, 1, ts[1]);
  o.put(g, 2, ts[2]);
  EXPECT_NE(internal([&] { o.get(g, 3); }).find("has no tensor 3"), std::string::npos);
}

TEST_F(GroupOffloaderTest, UnwritableGroupFileIsAnIoError) {
  auto& o = offloader();
  // The group's path is a folder (with a file in it): the rename over it fails.
  const std::string path = file("taken.safetensors");
  fs::create_directories(path);
  std::ofstream(path + "/inside") << "x";
  const int g = o.add_group(disk_spec(path, "blocked"));
  EXPECT_FALSE(o.reusable(g));
  const auto ts = tensors_of(1);
  o.put(g, 0, ts[0]);
  o.put(g, 1, ts[1]);
  const std::string why = error_of<IoError>([&] { o.put(g, 2, ts[2]); });
  EXPECT_EQ(why.rfind("disk offload of blocked: ", 0), 0u) << why;
}

}  // namespace
}  // namespace tprun::memory
