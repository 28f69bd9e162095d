// `mpirun -np 2 distca train --backend mpi` against the local backend: identical per-step
// losses (bitwise, compared through the JSONL metrics, which print doubles round-trip exact),
// and cad == colocated under mpirun too.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace {

std::filesystem::path tmp(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("distca_train_mpi_" + name);
}

int sh(const std::string& cmd) {
  const int st = std::system((cmd + " > " + tmp("log.txt").string() + " 2>&1").c_str());
  return WEXITSTATUS(st);
}

std::vector<double> losses(const std::filesystem::path& path) {
  std::vector<double> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  return out;
}

TEST(TrainMpi, MpiBackendMatchesLocalAndCadMatchesColocated) {
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  const auto cfg = tmp("cfg.toml");
  std::ofstream(cfg) << "tokens_per_rank = 128\ndist = \"uniform:16:384\"\nmax_doc_len = 0\nsteps = 20\nwarmup = 5\n"
                        "[model_overrides]\nn_layers = 2\nhidden = 64\nn_heads = 4\nn_kv_heads = 2\n"
                        "head_dim = 16\nffn = 128\nvocab = 64\n";
  const std::string cli = DISTCA_CLI;
  const std::string mpirun = std::string(DISTCA_MPIEXEC) + " --oversubscribe --allow-run-as-root -np 2 ";
  const std::string base = " train --config " + cfg.string() + " --metrics ";
  ASSERT_EQ(sh(cli + base + tmp("local.jsonl").string()), 0);
  ASSERT_EQ(sh(mpirun + cli + base + tmp("mpi_cad.jsonl").string() + " --backend mpi --mode cad"), 0);
  ASSERT_EQ(sh(mpirun + cli + base + tmp("mpi_colo.jsonl").string() + " --backend mpi --mode colocated"), 0);
  const auto local = losses(tmp("local.jsonl"));
  ASSERT_EQ(local.size(), 20u);
  EXPECT_EQ(losses(tmp("mpi_cad.jsonl")), local);
  EXPECT_EQ(losses(tmp("mpi_colo.jsonl")), local);
}

}  // namespace
