// Pipeline stages under mpirun -np 4 (issue 14): PP = 4 and PP = 2 x DP = 2, colocated 1F1B,
// give bitwise the losses of one stage on the local backend with the same micro-batches (and,
// for DP = 2, the same two replicas), compared through the JSONL metrics. TP 2 x PP 2 (issue
// 29): the local backend's bits, and TP 1 x PP 2's losses at float rounding.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/shell_run.h"

namespace {

using distca::testing::jsonl_column;
using distca::testing::read_text;

std::filesystem::path tmp(const std::string& name) { return distca::testing::temp_path("distca_train_pipeline_mpi_", name); }
int sh(const std::string& cmd) { return distca::testing::run_logged(cmd, tmp("log.txt")); }
std::string log_text() { return read_text(tmp("log.txt")); }

// A 4-layer model, colocated, 4 micro-batches per step, 8 steps.
std::filesystem::path config_file() {
  const auto cfg = tmp("cfg.toml");
  std::ofstream(cfg) << "mode = \"colocated\"\nmicro_batches = 4\ntokens_per_rank = 256\n"
                        "dist = \"uniform:16:512\"\nmax_doc_len = 0\nsteps = 8\nwarmup = 2\n"
                        "[model_overrides]\nn_layers = 4\nhidden = 64\nn_heads = 4\nn_kv_heads = 2\n"
                        "head_dim = 16\nffn = 128\nvocab = 64\n";
  return cfg;
}

TEST(TrainPipelineMpi, StagesUnderMpirunMatchOneStageBitwise) {
  const auto cfg = config_file();
  const std::string cli = DISTCA_CLI;
  const std::string mpirun = std::string(DISTCA_MPIEXEC) + " --oversubscribe --allow-run-as-root -np 4 ";
  const std::string base = " train --config " + cfg.string() + " --metrics ";
  struct Case {
    int dp, pp;
  };
  for (const Case& c : {Case{1, 4}, Case{2, 2}}) {
    const std::string name = "dp" + std::to_string(c.dp) + "pp" + std::to_string(c.pp);
    const auto one = tmp(name + "_one.jsonl"), many = tmp(name + "_mpi.jsonl");
    ASSERT_EQ(sh(cli + base + one.string() + " --ranks " + std::to_string(c.dp) + " --pp 1"), 0) << log_text();
    ASSERT_EQ(sh(mpirun + cli + base + many.string() + " --backend mpi --pp " + std::to_string(c.pp)), 0) << log_text();
    const auto want = jsonl_column(one, "loss");
    ASSERT_EQ(want.size(), 8u);
    EXPECT_EQ(jsonl_column(many, "loss"), want) << name;
    EXPECT_EQ(jsonl_column(many, "grad_norm"), jsonl_column(one, "grad_norm")) << name;
  }
}

// CAD's pipeline (each direction of every tick one pooled plan over all 4 ranks) under mpirun
// gives bitwise the local backend's run of the same configuration.
TEST(TrainPipelineMpi, CadPipelineUnderMpirunMatchesTheLocalBackendBitwise) {
  const auto cfg = config_file();
  const std::string cli = DISTCA_CLI;
  const std::string mpirun = std::string(DISTCA_MPIEXEC) + " --oversubscribe --allow-run-as-root -np 4 ";
  const std::string base = " train --config " + cfg.string() + " --mode cad --pp 2 --metrics ";
  const auto local = tmp("cad_local.jsonl"), mpi = tmp("cad_mpi.jsonl");
  ASSERT_EQ(sh(cli + base + local.string() + " --ranks 4"), 0) << log_text();
  ASSERT_EQ(sh(mpirun + cli + base + mpi.string() + " --backend mpi"), 0) << log_text();
  const auto want = jsonl_column(local, "loss");
  ASSERT_EQ(want.size(), 8u);
  EXPECT_EQ(jsonl_column(mpi, "loss"), want);
  EXPECT_EQ(jsonl_column(mpi, "grad_norm"), jsonl_column(local, "grad_norm"));
}

// TP 2 x PP 2 on four processes, colocated and cad: bitwise the same run on the local backend
// (every TP and pipeline collective is a rank-order sum or a copy on either backend), and
// within float rounding of TP 1 x PP 2 (a row-parallel product sums its partial GEMMs).
TEST(TrainPipelineMpi, TpTwoByPpTwoUnderMpirunMatchesLocalAndTpOne) {
  const auto cfg = config_file();
  const std::string cli = DISTCA_CLI;
  const std::string mpirun = std::string(DISTCA_MPIEXEC) + " --oversubscribe --allow-run-as-root -np 4 ";
  for (const std::string mode : {"colocated", "cad"}) {
    const std::string base = " train --config " + cfg.string() + " --mode " + mode + " --pp 2 --metrics ";
    const auto one = tmp(mode + "_tp1.jsonl"), local = tmp(mode + "_tp2_local.jsonl"), mpi = tmp(mode + "_tp2_mpi.jsonl");
    ASSERT_EQ(sh(cli + base + one.string() + " --ranks 2"), 0) << log_text();
    ASSERT_EQ(sh(cli + base + local.string() + " --ranks 4 --tp 2"), 0) << log_text();
    ASSERT_EQ(sh(mpirun + cli + base + mpi.string() + " --backend mpi --tp 2"), 0) << log_text();
    const auto want = jsonl_column(local, "loss");
    ASSERT_EQ(want.size(), 8u);
    EXPECT_EQ(jsonl_column(mpi, "loss"), want) << mode;
    EXPECT_EQ(jsonl_column(mpi, "grad_norm"), jsonl_column(local, "grad_norm")) << mode;
    const auto tp1 = jsonl_column(one, "loss");
    ASSERT_EQ(tp1.size(), 8u);
    for (size_t i = 0; i < tp1.size(); ++i) EXPECT_NEAR(want[i], tp1[i], 1e-6 * tp1[i]) << mode << " step " << i;
  }
}

}  // namespace
