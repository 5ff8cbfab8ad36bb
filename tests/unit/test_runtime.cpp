#include <gtest/gtest.h>

#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/logging.h"
#include "runtime/size_string.h"

namespace tprun {
namespace {

TEST(Errors, KindsAndExitCodes) {
  ConfigError c("bad tp");
  CheckpointError k("bad file");
  CommError m("peer gone");
  RequestError r("bad prompt", true);
  const Error* all[] = {&c, &k, &m, &r};
  EXPECT_STREQ(c.kind_name(), "config error");
  EXPECT_STREQ(k.kind_name(), "checkpoint error");
  EXPECT_STREQ(m.kind_name(), "communication error");
  EXPECT_STREQ(r.kind_name(), "request error");
  EXPECT_EQ(c.exit_code(), exit_code::kConfig);
  EXPECT_EQ(k.exit_code(), exit_code::kCheckpoint);
  EXPECT_EQ(m.exit_code(), exit_code::kComm);
  EXPECT_EQ(r.exit_code(), exit_code::kRequest);
  EXPECT_FALSE(c.all_ranks());
  EXPECT_TRUE(r.all_ranks());
  for (const Error* e : all) EXPECT_NE(dynamic_cast<const std::runtime_error*>(e), nullptr);
}

TEST(SizeString, DiffusersForms) {
  EXPECT_EQ(parse_size("5GB", "--max-shard-size"), 5000000000ull);
  EXPECT_EQ(parse_size("500MB", "x"), 500000000ull);
  EXPECT_EQ(parse_size("10GiB", "x"), 10ull << 30);
  EXPECT_EQ(parse_size("4KiB", "x"), 4096ull);
  EXPECT_EQ(parse_size("64mib", "x"), 64ull << 20);
  EXPECT_EQ(parse_size("1.5GB", "x"), 1500000000ull);
  EXPECT_EQ(parse_size("123", "x"), 123ull);
  EXPECT_EQ(parse_size("7B", "x"), 7ull);
  for (const char* bad : {"", "GB", "5XB", "-1GB", "5 G B x", "1e3"}) {
    try {
      parse_size(bad, "--max-shard-size");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("--max-shard-size"), std::string::npos);
    }
  }
  EXPECT_EQ(format_size(4096), "4 KiB");
  EXPECT_EQ(format_size(64ull << 20), "64 MiB");
  EXPECT_EQ(format_size(1500), "1.5 KiB");
  EXPECT_EQ(format_size(100), "100 B");
}

TEST(Device, AutomaticChoice) {
  EXPECT_EQ(choose_device("", 0, 0, false).device, "cpu");
  EXPECT_EQ(choose_device("", 1, 0, true).device, "cpu");
  EXPECT_EQ(choose_device("", 1, 0, true).reason, "no GPU visible");
  DeviceChoice g = choose_device("", 3, 8, true);
  EXPECT_EQ(g.device, "cuda:3");
  EXPECT_EQ(g.cuda_index, 3);
  EXPECT_THROW(choose_device("", 8, 8, true), ConfigError);
}

TEST(Device, Overrides) {
  EXPECT_EQ(choose_device("cpu", 2, 8, true).device, "cpu");
  EXPECT_EQ(choose_device("cuda", 2, 8, true).device, "cuda:2");
  EXPECT_EQ(choose_device("cuda:5", 2, 8, true).device, "cuda:5");
  try {
    choose_device("tpu", 0, 0, true);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--device 'tpu'"), std::string::npos);
  }
  EXPECT_THROW(choose_device("cuda:9", 0, 8, true), ConfigError);
  EXPECT_THROW(choose_device("cuda", 0, 0, false), ConfigError);
  EXPECT_THROW(choose_device("cuda:x", 0, 8, true), ConfigError);
}

TEST(Device, ThreadsSplitSharedCpus) {
  EXPECT_EQ(cpu_threads_for_rank(2, 1), 2);
  EXPECT_EQ(cpu_threads_for_rank(2, 2), 1);
  EXPECT_EQ(cpu_threads_for_rank(2, 4), 1);  // oversubscribed: never below 1
  EXPECT_EQ(cpu_threads_for_rank(64, 8), 8);
  EXPECT_EQ(cpu_threads_for_rank(1, 1), 1);
  EXPECT_GE(cpus_in_affinity_mask(), 1);
  EXPECT_FALSE(affinity_mask_string().empty());
}

TEST(Logging, LevelNamesAreChecked) {
  EXPECT_NO_THROW(check_log_level("debug", "--log-level"));
  EXPECT_NO_THROW(check_log_level("warning", "--log-level"));
  try {
    check_log_level("loud", "--log-level");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--log-level 'loud'"), std::string::npos);
  }
}

}  // namespace
}  // namespace tprun
