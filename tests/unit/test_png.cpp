// PNG output: pixels and text chunks (tEXt for Latin-1, iTXt for other UTF-8)
// survive a write/read round trip; failed writes leave no file and no
// temporary behind.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "pipelines/png_image.h"
#include "runtime/error.h"

namespace tprun::pipelines {
namespace {

namespace fs = std::filesystem;

class PngTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tprun_png_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add);
    fs::remove_all(dir_);
  }
  size_t entries(const fs::path& d) const {
    return static_cast<size_t>(std::distance(fs::directory_iterator(d), fs::directory_iterator()));
  }
  fs::path dir_;
};

std::vector<uint8_t> gradient(int w, int h) {
  std::vector<uint8_t> rgb(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      uint8_t* p = &rgb[(static_cast<size_t>(y) * w + x) * 3];
      p[0] = static_cast<uint8_t>(x * 255 / (w - 1));
      p[1] = static_cast<uint8_t>(y * 255 / (h - 1));
      p[2] = static_cast<uint8_t>((x * 7 + y * 13) % 256);
    }
  return rgb;
}

TEST_F(PngTest, RoundTripKeepsPixelsAndText) {
  const int w = 37, h = 23;  // odd sizes: no row padding assumptions
  const auto rgb = gradient(w, h);
  const PngText text = {
      {"prompt", "a red fox in the snow, 35mm photo"},
      {"latin1", "caf\xc3\xa9 cr\xc3\xa8me br\xc3\xbb" "l\xc3\xa9" "e"},  // é è û: tEXt
      {"utf8 prompt", "\xe7\x8c\xab\xe3\x81\xa8\xe7\x8a\xac \xf0\x9f\x90\x88 \xe2\x80\x94 ok"},  // 猫と犬 🐈 —: iTXt
      {"multi", "line one\nline two"},
      {"seed", "42"},
  };
  const std::string path = (dir_ / "image.png").string();
  write_png(path, rgb.data(), w, h, text);
  EXPECT_EQ(entries(dir_), 1u);  // no temporary left behind

  const PngImage img = read_png(path);
  EXPECT_EQ(img.width, w);
  EXPECT_EQ(img.height, h);
  EXPECT_EQ(img.rgb, rgb);
  ASSERT_EQ(img.text.size(), text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    EXPECT_EQ(img.text[i].first, text[i].first);
    EXPECT_EQ(img.text[i].second, text[i].second);
  }

  // The Latin-1 value is stored as Latin-1 bytes in a tEXt chunk, the other as iTXt.
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(bytes.find(std::string("tEXtlatin1\0caf\xe9", 15)), std::string::npos);
  EXPECT_NE(bytes.find("iTXtutf8 prompt"), std::string::npos);
}

TEST_F(PngTest, OverwritesAtomically) {
  const auto a = gradient(8, 8);
  std::vector<uint8_t> b(8 * 8 * 3, 200);
  const std::string path = (dir_ / "x.png").string();
  write_png(path, a.data(), 8, 8, {});
  write_png(path, b.data(), 8, 8, {{"k", "v"}});
  const PngImage img = read_png(path);
  EXPECT_EQ(img.rgb, b);
  ASSERT_EQ(img.text.size(), 1u);
  EXPECT_EQ(entries(dir_), 1u);
}

TEST_F(PngTest, UnwritablePathThrowsAndLeavesNothing) {
  const auto rgb = gradient(4, 4);
  // A missing folder.
  const std::string missing = (dir_ / "no" / "such" / "x.png").string();
  try {
    write_png(missing, rgb.data(), 4, 4, {});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  // The destination is a folder: the rename fails after the data was written.
  fs::create_directories(dir_ / "taken.png" / "inner");
  const std::string taken = (dir_ / "taken.png").string();
  EXPECT_THROW(write_png(taken, rgb.data(), 4, 4, {}), Error);
  EXPECT_EQ(entries(dir_), 1u);  // only taken.png/, no temporary
  // A read-only folder (root ignores permissions: skip that part then).
  const fs::path ro = dir_ / "ro";
  fs::create_directories(ro);
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
  if (::access(ro.c_str(), W_OK) != 0) {
    EXPECT_THROW(write_png((ro / "x.png").string(), rgb.data(), 4, 4, {}), Error);
    EXPECT_EQ(entries(ro), 0u);
  }
  fs::permissions(ro, fs::perms::owner_all);
}

TEST_F(PngTest, BadArgumentsAreRequestErrors) {
  const auto rgb = gradient(4, 4);
  const std::string path = (dir_ / "x.png").string();
  EXPECT_THROW(write_png(path, rgb.data(), 0, 4, {}), RequestError);
  EXPECT_THROW(write_png(path, nullptr, 4, 4, {}), RequestError);
  EXPECT_THROW(write_png(path, rgb.data(), 4, 4, {{"", "v"}}), RequestError);
  EXPECT_THROW(write_png(path, rgb.data(), 4, 4, {{std::string(80, 'k'), "v"}}), RequestError);
  EXPECT_THROW(write_png(path, rgb.data(), 4, 4, {{"k", "bad \xff utf8"}}), RequestError);
  EXPECT_EQ(entries(dir_), 0u);
}

TEST_F(PngTest, ReadRejectsNonPng) {
  const fs::path p = dir_ / "fake.png";
  std::ofstream(p) << "not a png at all";
  EXPECT_THROW(read_png(p.string()), CheckpointError);
  EXPECT_THROW(read_png((dir_ / "missing.png").string()), CheckpointError);
  // A truncated PNG.
  const auto rgb = gradient(16, 16);
  const fs::path good = dir_ / "good.png";
  write_png(good.string(), rgb.data(), 16, 16, {});
  std::ifstream in(good, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(dir_ / "cut.png", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  EXPECT_THROW(read_png((dir_ / "cut.png").string()), CheckpointError);
}

}  // namespace
}  // namespace tprun::pipelines
