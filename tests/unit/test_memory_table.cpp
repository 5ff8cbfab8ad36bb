// The [memory] reader (memory/memory_table.h) through `--memory` texts: the
// key list the help shows is the list the reader knows, and the messages name
// the flag and the key.
#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "memory/memory_table.h"
#include "runtime/error.h"

namespace tprun {
namespace {

std::string error_of(const std::vector<std::string>& texts) {
  try {
    memory::parse_memory_flags(texts);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(MemoryTable, KeyListIsTheReadersKeys) {
  const auto& keys = memory::memory_keys();
  EXPECT_EQ(keys, (std::vector<std::string>{"layerwise_casting", "offload", "device_map", "max_memory",
                                            "offload_folder", "vae_slicing", "vae_tiling", "vae_tile_sample_size",
                                            "vae_tile_overlap", "attention_chunk"}));
  // Every listed key is read (a wrong type is its own error, not an unknown key) ...
  for (const auto& key : keys) {
    const std::string e = error_of({key + "=2026-01-01"});
    EXPECT_EQ(e.rfind("--memory " + key + ": ", 0), 0u) << e;
    EXPECT_EQ(e.find("unknown key"), std::string::npos) << e;
  }
  // ... and the unknown-key message lists exactly these, sorted.
  std::vector<std::string> sorted = keys;
  std::sort(sorted.begin(), sorted.end());
  std::string known;
  for (const auto& k : sorted) known += (known.empty() ? "memory." : ", memory.") + k;
  EXPECT_EQ(error_of({"vae_tilling=true"}), "--memory vae_tilling: unknown key (known: " + known + ")");
}

TEST(MemoryTable, FlagsSetOptions) {
  const auto m = memory::parse_memory_flags({"vae_tiling=true", "attention_chunk=4096",
                                             "layerwise_casting={storage=\"float8_e5m2\", skip=[\"^a$\"]}",
                                             "offload=sequential"});
  EXPECT_TRUE(m.vae_tiling);
  EXPECT_EQ(m.attention_chunk, 4096);
  EXPECT_EQ(m.layerwise_storage, "float8_e5m2");
  ASSERT_TRUE(m.layerwise_skip.has_value());
  EXPECT_EQ(*m.layerwise_skip, (std::vector<std::string>{"^a$"}));
  EXPECT_EQ(m.offload.type, "leaf_level");
  EXPECT_EQ(memory::describe(memory::parse_memory_flags({})), "memory: none");
}

TEST(MemoryTable, FlagErrorsNameTheFlag) {
  EXPECT_EQ(error_of({"vae_tiling"}), "--memory 'vae_tiling': expected KEY=VALUE, e.g. vae_tiling=true");
  EXPECT_EQ(error_of({"vae_tiling=4"}), "--memory vae_tiling: must be true or false, found an integer");
  EXPECT_EQ(error_of({"attention_chunk=-1"}), "--memory attention_chunk: -1 is outside [0, 16777216]");
  EXPECT_EQ(error_of({"layerwise_casting={storage=\"bf16\"}"}),
            "--memory layerwise_casting.storage: 'bf16' is not one of float8_e4m3fn, float8_e5m2");
  EXPECT_EQ(error_of({"offload_folder=spill"}),
            "--memory offload_folder: is only used with memory.device_map (its \"disk\" entries); for group offload "
            "to disk set memory.offload.disk_path");
  const std::string bad_toml = error_of({"device_map={a=1"});
  EXPECT_EQ(bad_toml.rfind("--memory 'device_map={a=1': the value of device_map is not valid TOML: ", 0), 0u)
      << bad_toml;
}

}  // namespace
}  // namespace tprun
