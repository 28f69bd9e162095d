// `distca train --mode wlb|percp --backend mpi` under mpirun -np 2 and -np 4 (issue 26): the
// same losses as the local backend (bitwise: the same arithmetic in the same reduction
// orders), and within float rounding of colocated (train_chunking_test states the bound).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "mpi_run_util.h"

namespace {

std::filesystem::path tmp(const std::string& name) { return distca::train::testing::scratch("distca_train_chunking_mpi_", name); }

int sh(const std::string& cmd) { return distca::train::testing::run_logged(cmd, tmp("log.txt")); }

std::vector<double> losses(const std::filesystem::path& path) { return distca::train::testing::metric_losses(path); }

TEST(TrainChunkingMpi, WlbAndPerCpMatchTheLocalBackendAndColocated) {
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  setenv("OMP_NUM_THREADS", "1", 1);
  const auto cfg = tmp("cfg.toml");
  std::ofstream(cfg) << "tokens_per_rank = 128\ndist = \"uniform:16:256\"\nmax_doc_len = 0\nsteps = 10\nwarmup = 3\n"
                        "[model_overrides]\nn_layers = 2\nhidden = 64\nn_heads = 4\nn_kv_heads = 2\n"
                        "head_dim = 16\nffn = 128\nvocab = 64\n";
  const std::string cli = DISTCA_CLI;
  for (int np : {2, 4}) {
    const std::string mpirun =
        std::string(DISTCA_MPIEXEC) + " --oversubscribe --allow-run-as-root -np " + std::to_string(np) + " ";
    const std::string base = " train --config " + cfg.string() + " --ranks " + std::to_string(np) + " --metrics ";
    // (mode, the layout flags colocated shares with it)
    std::vector<std::pair<std::string, std::string>> modes = {{"--mode wlb --cp 2 --cp-threshold 48", ""},
                                                              {"--mode percp --cp 2", ""}};
    // 4 ranks: wlb under pipelines, its documents re-packed across the micro-batches too.
    if (np == 4) modes.push_back({"--mode wlb --cp 2 --cp-threshold 48", " --pp 2 --micro-batches 2"});
    for (const auto& [mode, layout] : modes) {
      const auto colo = tmp("colo.jsonl"), local = tmp("local.jsonl"), mpi = tmp("mpi.jsonl");
      ASSERT_EQ(sh(cli + base + colo.string() + " --mode colocated" + layout), 0) << layout;
      ASSERT_EQ(sh(cli + base + local.string() + " " + mode + layout), 0) << mode << layout;
      ASSERT_EQ(sh(mpirun + cli + base + mpi.string() + " --backend mpi " + mode + layout), 0) << mode << layout << " -np " << np;
      const auto want = losses(local), got = losses(mpi), base_losses = losses(colo);
      ASSERT_EQ(want.size(), 10u);
      EXPECT_EQ(got, want) << mode << layout << " -np " << np;
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_LE(std::abs(got[i] - base_losses[i]), 1e-5 * std::abs(base_losses[i])) << mode << layout << " step " << i;
      }
    }
  }
}

}  // namespace
