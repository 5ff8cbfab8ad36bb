// The init-model architectures as the families register them
// (presets/preset_registry.h): the --arch order, unknown names, the resolve
// step's errors, and one registered writer end to end.
#include <algorithm>
#include <filesystem>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "presets/preset_registry.h"
#include "runtime/error.h"
#include "test_data.h"

namespace tprun {
namespace {

namespace fs = std::filesystem;

TEST(PresetRegistry, ArchitecturesInFamilyOrder) {
  std::vector<std::string> archs, families;
  for (const auto& a : presets::preset_archs()) {
    archs.push_back(a.arch);
    families.push_back(a.family);
    EXPECT_FALSE(a.help.empty()) << a.arch;
    EXPECT_FALSE(a.preset_names.empty()) << a.arch;
    if (a.family.rfind("FLUX", 0) == 0) {
      EXPECT_EQ(a.preset_names, (std::vector<std::string>{"tiny", "small"})) << a.arch;
    }
  }
  // Families by name (FLUX.1 before FLUX.2); within FLUX.2 the order of its
  // registrations. Another family may add its own anywhere in that order.
  EXPECT_TRUE(std::is_sorted(families.begin(), families.end()));
  std::vector<std::string> flux;
  std::copy_if(archs.begin(), archs.end(), std::back_inserter(flux),
               [](const std::string& a) { return a.rfind("flux", 0) == 0; });
  EXPECT_EQ(flux, (std::vector<std::string>{"flux", "flux2-klein", "flux2-dev"}));
  ASSERT_NE(presets::find_preset_arch("flux2-dev"), nullptr);
  EXPECT_EQ(presets::find_preset_arch("flux2-dev")->help, "Flux2Pipeline, Mistral3 text encoder");
  EXPECT_EQ(presets::find_preset_arch("flux2"), nullptr);
  EXPECT_EQ(presets::find_preset_arch(""), nullptr);
}

TEST(PresetRegistry, ResolveNamesThePipelineAndRefusesUnknownPresets) {
  try {
    presets::find_preset_arch("flux2-dev")->resolve("flux2-dev", "huge");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "unknown preset 'huge'; choose one of: tiny, small");
  }
  EXPECT_EQ(presets::find_preset_arch("flux")->resolve("flux", "tiny").what, "FLUX.1 pipeline 'tiny'");
  EXPECT_EQ(presets::find_preset_arch("flux2-klein")->resolve("flux2-klein", "small").what,
            "FLUX.2 [klein] pipeline 'small'");
  EXPECT_EQ(presets::find_preset_arch("flux2-dev")->resolve("flux2-dev", "tiny").what, "FLUX.2 [dev] pipeline 'tiny'");
  for (const auto& a : presets::preset_archs()) {
    try {
      a.resolve(a.arch, "huge");
      ADD_FAILURE() << a.arch << ": no error";
    } catch (const ConfigError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("unknown preset 'huge'; choose one of: ", 0), 0u) << e.what();
      for (const auto& name : a.preset_names) EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << name;
    }
  }
}

TEST(PresetRegistry, RegisteredWriterReportsItsTokenizers) {
  test::TempDir tmp;
  const auto p = presets::find_preset_arch("flux2-klein")->resolve("flux2-klein", "tiny");
  const fs::path dir = tmp.path() / "klein";
  const presets::WrittenPreset w = p.write(dir.string(), 0, false);
  EXPECT_TRUE(fs::is_regular_file(dir / "model_index.json"));
  EXPECT_GT(w.summary.tensors, 0);
  EXPECT_GT(w.summary.text_vocab_size, 0);
  EXPECT_EQ(w.details, "text vocabulary " + std::to_string(w.summary.text_vocab_size));
  EXPECT_THROW(p.write(dir.string(), 0, false), ConfigError);  // not empty, no force
}

}  // namespace
}  // namespace tprun
