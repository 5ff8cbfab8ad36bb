// Parsers and limits: work that must stay linear in hostile sizes, and option values that
// must be parsed with full range checks.
#include <chrono>
#include <cstdint>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "checkpoint/safetensors_header.h"
#include "jobs/job_schedule.h"
#include "runtime/error.h"
#include "runtime/strict_json.h"
#include "runtime/thread_budget.h"

namespace tprun {
namespace {

// 200,000 one-element tensors: the header is ~14 MB, well inside the format's 100 MB. A quadratic
// parse (nlohmann's callback parser rescans the top-level object after every tensor) took 25 s at
// 40k tensors and over ten minutes at this size; the linear one takes about a second (5 s on a
// loaded 2-core box). The bound is generous and only there to catch the quadratic.
TEST(Limits, SafetensorsHeader200kTensors) {
  constexpr int kTensors = 200000;
  std::string json = "{";
  json.reserve(kTensors * 80);
  for (int i = 0; i < kTensors; ++i) {
    if (i) json += ',';
    json += fmt::format(R"("blocks.{}.w":{{"dtype":"F32","shape":[1],"data_offsets":[{},{}]}})", i, 4 * i,
                        4 * i + 4);
  }
  json += '}';
  const auto t0 = std::chrono::steady_clock::now();
  const auto h = checkpoint::parse_safetensors_header("big.safetensors", json, 8 + json.size() + 4ull * kTensors);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(h.tensors.size(), static_cast<size_t>(kTensors));
  ASSERT_NE(h.find("blocks.199999.w"), nullptr);
  EXPECT_EQ(h.find("blocks.199999.w")->begin, 4ull * 199999);
  EXPECT_LT(seconds, 30.0) << "parsing a 200k-tensor header took " << seconds << " s";
}

// The duplicate check still works at that size, wherever the duplicate sits.
TEST(Limits, StrictJsonDuplicateAmongManyKeys) {
  std::string json = "{";
  for (int i = 0; i < 100000; ++i) json += fmt::format(R"("k{}":{{"a":{}}},)", i, i);
  json += R"("k5":{"a":1}})";
  try {
    parse_strict_json(json, "f.json", "x");
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("has the key 'k5' twice"), std::string::npos) << e.what();
  }
}

// --shard I/N: digits only, no wrap at 32 bits (0/4294967297 was chunk 0 of 1), 0 <= I < N.
TEST(Limits, ShardSpecRangeChecks) {
  const auto spec = jobs::parse_shard_spec("2/5");
  EXPECT_EQ(spec.index, 2);
  EXPECT_EQ(spec.count, 5);
  EXPECT_EQ(jobs::parse_shard_spec("0/10000000").count, 10000000);
  for (const char* bad : {"0/4294967297", "4294967296/4294967297", "0/10000001", "-1/4", "+1/4", " 1/4", "1/ 4",
                          "1/4 ", "1/4x", "0x1/4", "1/", "/4", "1//4", "5/5", "0/0", "3", "",
                          "1/99999999999999999999"}) {
    try {
      jobs::parse_shard_spec(bad);
      ADD_FAILURE() << "accepted --shard '" << bad << "'";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("--shard"), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(jobs::check_shard_count({0, 3}, 3, "r.jsonl"));
  try {
    jobs::check_shard_count({0, 4}, 3, "r.jsonl");
    ADD_FAILURE() << "4 chunks of 3 requests accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("r.jsonl holds only 3 request(s)"), std::string::npos) << e.what();
  }
}

// Threads under an address-space limit: lowered (with a warning) until the pools fit half of what
// is left; never below 1; untouched without a limit.
TEST(Limits, ThreadsFitTheAddressSpace) {
  constexpr uint64_t MiB = 1ull << 20;
  EXPECT_EQ(fit_threads(16, std::nullopt, 0, 8 * MiB).threads, 16);
  EXPECT_FALSE(fit_threads(16, std::nullopt, 0, 8 * MiB).warning);
  const auto roomy = fit_threads(16, 64ull << 30, 2ull << 30, 8 * MiB);
  EXPECT_EQ(roomy.threads, 16);
  EXPECT_FALSE(roomy.warning);
  // 400 MiB left: 200 MiB for threads = 25 stacks of 8 MiB; pool_threads_for(8) = 14 + 4 + 4 = 22.
  const auto tight = fit_threads(16, 2900ull * MiB, 2500ull * MiB, 8 * MiB);
  EXPECT_LT(tight.threads, 16);
  EXPECT_GE(tight.threads, 1);
  EXPECT_LE(pool_threads_for(tight.threads) * 8 * MiB, 200 * MiB);
  ASSERT_TRUE(tight.warning);
  EXPECT_NE(tight.warning->find("address-space limit"), std::string::npos) << *tight.warning;
  EXPECT_NE(tight.warning->find(fmt::format("using {} thread(s)", tight.threads)), std::string::npos);
  EXPECT_EQ(fit_threads(16, 100 * MiB, 200 * MiB, 8 * MiB).threads, 1);
}

}  // namespace
}  // namespace tprun
