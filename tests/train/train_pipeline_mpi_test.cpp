// Pipeline stages under mpirun -np 4 (issue 14): PP = 4 and PP = 2 x DP = 2, colocated 1F1B,
// give bitwise the losses of one stage on the local backend with the same micro-batches (and,
// for DP = 2, the same two replicas), compared through the JSONL metrics.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

std::filesystem::path tmp(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("distca_train_pipeline_mpi_" + name);
}

int sh(const std::string& cmd) {
  const int st = std::system((cmd + " > " + tmp("log.txt").string() + " 2>&1").c_str());
  return WEXITSTATUS(st);
}

std::string log_text() {
  std::ifstream in(tmp("log.txt"));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<double> column(const std::filesystem::path& path, const char* key) {
  std::vector<double> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line)[key].get<double>());
  return out;
}

TEST(TrainPipelineMpi, StagesUnderMpirunMatchOneStageBitwise) {
  const auto cfg = tmp("cfg.toml");
  std::ofstream(cfg) << "mode = \"colocated\"\nmicro_batches = 4\ntokens_per_rank = 256\n"
                        "dist = \"uniform:16:512\"\nmax_doc_len = 0\nsteps = 8\nwarmup = 2\n"
                        "[model_overrides]\nn_layers = 4\nhidden = 64\nn_heads = 4\nn_kv_heads = 2\n"
                        "head_dim = 16\nffn = 128\nvocab = 64\n";
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
    const auto want = column(one, "loss");
    ASSERT_EQ(want.size(), 8u);
    EXPECT_EQ(column(many, "loss"), want) << name;
    EXPECT_EQ(column(many, "grad_norm"), column(one, "grad_norm")) << name;
  }
}

}  // namespace
