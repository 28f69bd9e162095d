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

std::string bytes_of(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Resume a 2-process run in new processes from its step-10 checkpoint (a checkpoint records
// the run's step count, so the first run is the whole 20-step one): the remaining losses and
// the final checkpoint equal an uninterrupted local run's, bit for bit.
TEST(TrainMpi, ResumeUnderMpirunIsBitwiseIdentical) {
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  const auto dir = tmp("resume");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const auto cfg = dir / "cfg.toml";
  std::ofstream(cfg) << "tokens_per_rank = 128\ndist = \"uniform:16:384\"\nmax_doc_len = 0\nsteps = 20\nwarmup = 5\n"
                        "[model_overrides]\nn_layers = 2\nhidden = 64\nn_heads = 4\nn_kv_heads = 2\n"
                        "head_dim = 16\nffn = 128\nvocab = 64\n";
  const std::string cli = DISTCA_CLI;
  const std::string mpirun = std::string(DISTCA_MPIEXEC) + " --oversubscribe --allow-run-as-root -np 2 ";
  const std::string base = " train --config " + cfg.string() + " --checkpoint-every 10 ";
  ASSERT_EQ(sh(cli + base + "--checkpoint-dir " + (dir / "local").string() + " --metrics " + (dir / "local.jsonl").string()), 0);
  ASSERT_EQ(sh(mpirun + cli + base + "--backend mpi --checkpoint-dir " + (dir / "first").string()), 0);
  ASSERT_EQ(sh(mpirun + cli + base + "--backend mpi --checkpoint-dir " + (dir / "second").string() + " --metrics " +
               (dir / "resumed.jsonl").string() + " --resume " + (dir / "first" / "step-00000010.ckpt").string()),
            0);
  const auto local = losses(dir / "local.jsonl"), resumed = losses(dir / "resumed.jsonl");
  ASSERT_EQ(local.size(), 20u);
  ASSERT_EQ(resumed.size(), 10u);
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(resumed[i], local[i + 10]) << "step " << i + 10;
  const std::string a = bytes_of(dir / "local" / "step-00000020.ckpt");
  EXPECT_FALSE(a.empty());
  EXPECT_TRUE(a == bytes_of(dir / "second" / "step-00000020.ckpt"));
  std::filesystem::remove_all(dir);
}

}  // namespace
