// Disk-offload group files (memory/group_offloader.h): a file is written with
// an XXH3 hash of its bytes; add_group reuses only a file whose bytes match it
// (a same-size edit is rewritten); a file edited while a run uses it is an
// IoError naming it at the next read, never silently used; the per-group
// lock file sits beside it.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "memory/group_offloader.h"
#include "runtime/error.h"

namespace tprun::memory {
namespace {

namespace fs = std::filesystem;

GroupSpec disk_spec(const std::string& file, const std::string& label) {
  GroupSpec s;
  s.label = label;
  s.tier = Tier::Disk;
  s.device = "cpu";
  s.names = {"a.weight", "b.weight", "empty"};
  s.file = file;
  s.fingerprint = "unit-test-fingerprint";
  return s;
}

void fill(GroupOffloader& o, int g) {
  o.put(g, 0, at::arange(64, at::kFloat));
  o.put(g, 1, at::ones({4, 4}, at::kBFloat16));
  o.put(g, 2, at::empty({0}, at::kFloat));
}

void flip_last_byte_keep_mtime(const std::string& file) {
  struct stat st {};
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  const int fd = ::open(file.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  unsigned char c = 0;
  ASSERT_EQ(::pread(fd, &c, 1, st.st_size - 1), 1);
  c ^= 0xFF;
  ASSERT_EQ(::pwrite(fd, &c, 1, st.st_size - 1), 1);
  ::close(fd);
  const struct timespec times[2] = {st.st_atim, st.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, file.c_str(), times, 0), 0);
}

TEST(OffloadIntegrity, SameSizeEditIsRewrittenAndCaughtMidRun) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("tprun-offload-integrity-{}", ::getpid());
  fs::create_directories(dir);
  const std::string file = (dir / "g.safetensors").string();
  auto& o = GroupOffloader::instance();
  const auto before = o.stats();

  const int g1 = o.add_group(disk_spec(file, "first"));
  EXPECT_FALSE(o.reusable(g1));
  fill(o, g1);
  EXPECT_TRUE(fs::exists(file + ".lock"));
  EXPECT_TRUE(at::equal(o.get(g1, 0), at::arange(64, at::kFloat)));

  // Intact: reused.
  const int g2 = o.add_group(disk_spec(file, "second"));
  EXPECT_TRUE(o.reusable(g2));

  // A same-size edit with the mtime put back: not reused, rewritten from the slices.
  flip_last_byte_keep_mtime(file);
  const int g3 = o.add_group(disk_spec(file, "third"));
  EXPECT_FALSE(o.reusable(g3));
  fill(o, g3);
  auto after = o.stats();
  EXPECT_EQ(after.files_written - before.files_written, 2);
  EXPECT_EQ(after.files_rewritten - before.files_rewritten, 1);
  EXPECT_TRUE(at::equal(o.get(g3, 1), at::ones({4, 4}, at::kBFloat16)));

  // Edited while in use: the next read is an IoError naming the file.
  const int other = o.add_group(disk_spec((dir / "other.safetensors").string(), "other"));
  fill(o, other);
  o.get(other, 0);  // g3 goes back
  flip_last_byte_keep_mtime(file);
  try {
    o.get(g3, 0);
    ADD_FAILURE() << "an edited group file was read without an error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("XXH3"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tprun::memory
