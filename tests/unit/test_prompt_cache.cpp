// The prompt-embeddings cache: hits return what was stored, the byte budget
// evicts the least recently used entries, and a zero budget keeps nothing.
#include <ATen/core/Tensor.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include "pipelines/prompt_cache.h"

namespace tprun::pipelines {
namespace {

models::TensorMap embeds(int64_t floats) { return {{"prompt_embeds", at::randn({floats})}}; }

TEST(PromptCache, HitsMissesAndLeastRecentlyUsedEviction) {
  PromptCache cache(3 * 1024 * 4);  // three entries of 1024 floats
  const auto a = embeds(1024), b = embeds(1024), c = embeds(1024), d = embeds(1024);
  EXPECT_FALSE(cache.get("a"));
  cache.put("a", a);
  cache.put("b", b);
  cache.put("c", c);
  auto hit = cache.get("a");  // "a" becomes the most recent
  ASSERT_TRUE(hit);
  EXPECT_TRUE(at::equal(hit->at("prompt_embeds"), a.at("prompt_embeds")));
  cache.put("d", d);  // evicts "b", the least recently used
  EXPECT_FALSE(cache.get("b"));
  EXPECT_TRUE(cache.get("c"));
  EXPECT_TRUE(cache.get("a"));
  const auto s = cache.stats();
  EXPECT_EQ(s.hits, 3);
  EXPECT_EQ(s.misses, 2);
  EXPECT_EQ(s.evictions, 1);
  EXPECT_EQ(s.bytes, 3u * 1024 * 4);
  cache.put("huge", embeds(4 * 1024));  // larger than the budget: not kept, nothing evicted
  EXPECT_FALSE(cache.get("huge"));
  EXPECT_EQ(cache.stats().evictions, 1);
}

TEST(PromptCache, ZeroBudgetKeepsNothing) {
  PromptCache off(0);
  off.put("a", embeds(4));
  EXPECT_FALSE(off.get("a"));
  EXPECT_EQ(off.stats().bytes, 0u);
}

}  // namespace
}  // namespace tprun::pipelines
