// release_free_memory() gives freed heap memory back to the system: a large
// region freed in the middle of glibc's heap (which free() itself never
// returns: it only trims the top) leaves the process's RSS when it is called.
#include <gtest/gtest.h>
#include <malloc.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "runtime/host_memory.h"
#include "runtime/memory_release.h"

namespace tprun {
namespace {

// Blocks below glibc's smallest mmap threshold (128 KiB, which the dynamic
// threshold only ever raises), so every one is a heap chunk whatever other
// tests did to the allocator before.
constexpr size_t kBlock = 32 << 10;
constexpr size_t kBlocks = 1024;  // 32 MiB in all

TEST(MemoryRelease, ReturnsAFreedHeapRegion) {
  const size_t mmapped_before = mallinfo2().hblkhd;
  std::vector<char*> blocks;
  for (size_t i = 0; i <= kBlocks; ++i) {
    auto* p = static_cast<char*>(std::malloc(kBlock));
    ASSERT_NE(p, nullptr);
    std::memset(p, 0x5a, kBlock);  // resident, not merely reserved
    blocks.push_back(p);
  }
  ASSERT_EQ(mallinfo2().hblkhd, mmapped_before) << "the blocks were mmapped: this test needs heap chunks "
                                                   "(is MALLOC_MMAP_THRESHOLD_ set below 32 KiB?)";
  // Keep the highest block: every freed one then lies below a live chunk, so
  // free() cannot trim it away as the top of the heap and only
  // release_free_memory() can return it.
  auto top = std::max_element(blocks.begin(), blocks.end());
  char* pin = *top;
  blocks.erase(top);
  for (char* p : blocks) std::free(p);

  const uint64_t before = self_status_bytes("VmRSS");
  const uint64_t returned = release_free_memory();
  const uint64_t after = self_status_bytes("VmRSS");
  std::free(pin);

  ASSERT_GT(before, 0u) << "VmRSS unreadable";
  EXPECT_LE(after, before);
  // Every whole free page goes back: at least half of the 32 MiB (the pages
  // glibc keeps for chunk headers and the first call's other frees aside).
  const uint64_t freed = kBlock * kBlocks;
  EXPECT_GE(before - after, freed / 2) << "VmRSS " << before << " -> " << after;
  EXPECT_GE(returned, freed / 2);
}

TEST(MemoryRelease, NothingFreedReturnsLittle) {
  release_free_memory();
  // A second call right after finds nothing more to return.
  EXPECT_LT(release_free_memory(), uint64_t{4} << 20);
}

}  // namespace
}  // namespace tprun
