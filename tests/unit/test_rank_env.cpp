#include <map>

#include <gtest/gtest.h>

#include "runtime/error.h"
#include "runtime/rank_env.h"

namespace tprun {
namespace {

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& k) -> std::optional<std::string> {
    auto it = vars.find(k);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(RankEnv, OpenMpiWinsOverSlurmAndTorchrun) {
  auto env = env_of({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "8"},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                     {"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "6"}, {"SLURM_LOCALID", "0"},
                     {"RANK", "7"}, {"WORLD_SIZE", "9"}});
  auto r = rank_env_from_variables(env);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->rank, 3);
  EXPECT_EQ(r->world, 8);
  EXPECT_EQ(r->local_rank, 1);
  EXPECT_EQ(r->local_size, 2);
  EXPECT_EQ(r->source, "OMPI_COMM_WORLD_*");
}

TEST(RankEnv, SlurmWinsOverTorchrun) {
  auto env = env_of({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "7"}, {"SLURM_LOCALID", "0"},
                     {"SLURM_NODEID", "3"}, {"SLURM_TASKS_PER_NODE", "2(x3),1"},
                     {"RANK", "1"}, {"WORLD_SIZE", "2"}});
  auto r = rank_env_from_variables(env);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->rank, 5);
  EXPECT_EQ(r->world, 7);
  EXPECT_EQ(r->local_rank, 0);
  EXPECT_EQ(r->local_size, 1);
  EXPECT_EQ(r->source, "SLURM_*");
}

TEST(RankEnv, SlurmBatchShellWithoutSrunIsNotARank) {
  // The sbatch script's own shell has SLURM_PROCID=0 but no SLURM_LOCALID task info.
  auto env = env_of({{"SLURM_PROCID", "0"}, {"RANK", "1"}, {"WORLD_SIZE", "2"}});
  auto r = rank_env_from_variables(env);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->source, "RANK/WORLD_SIZE");
  EXPECT_EQ(r->rank, 1);
}

TEST(RankEnv, Torchrun) {
  auto env = env_of({{"RANK", "2"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"},
                     {"LOCAL_WORLD_SIZE", "2"}});
  auto r = rank_env_from_variables(env);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->rank, 2);
  EXPECT_EQ(r->local_size, 2);
}

TEST(RankEnv, NothingSetFallsBackToMpi) {
  auto env = env_of({});
  EXPECT_FALSE(rank_env_from_variables(env));
  MpiIdentity mpi{1, 2, 1, 2};
  RankEnv r = resolve_rank_env(env, mpi);
  EXPECT_EQ(r.source, "MPI");
  EXPECT_EQ(r.rank, 1);
  EXPECT_EQ(r.world, 2);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.local_size, 2);
}

TEST(RankEnv, MissingLocalSizeComesFromMpi) {
  auto env = env_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}});
  RankEnv r = resolve_rank_env(env, MpiIdentity{0, 2, 0, 2});
  EXPECT_EQ(r.local_size, 2);
}

TEST(RankEnv, MalformedVariableIsNamed) {
  auto env = env_of({{"OMPI_COMM_WORLD_RANK", "x1"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  try {
    rank_env_from_variables(env);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("OMPI_COMM_WORLD_RANK='x1'"), std::string::npos) << e.what();
  }
}

TEST(RankEnv, RankOutsideWorldIsAnError) {
  auto env = env_of({{"RANK", "4"}, {"WORLD_SIZE", "4"}});
  EXPECT_THROW(rank_env_from_variables(env), ConfigError);
}

TEST(RankEnv, DisagreementWithMpiNamesBoth) {
  auto env = env_of({{"RANK", "0"}, {"WORLD_SIZE", "4"}});
  try {
    resolve_rank_env(env, MpiIdentity{0, 1, 0, 1});
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("rank 0 of 4"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 0 of 1"), std::string::npos) << m;
    EXPECT_NE(m.find("mpirun"), std::string::npos) << m;
  }
}

TEST(RankEnv, SlurmTaskListExpansion) {
  EXPECT_EQ(slurm_tasks_on_node("4", 0), 4);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 0), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 2), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 3), 1);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 4), -1);
  EXPECT_EQ(slurm_tasks_on_node("8,4(x2)", 2), 4);
  EXPECT_EQ(slurm_tasks_on_node("2(y3)", 0), -1);
  EXPECT_EQ(slurm_tasks_on_node("", 0), -1);
  EXPECT_EQ(slurm_tasks_on_node("a", 0), -1);
}

}  // namespace
}  // namespace tprun
