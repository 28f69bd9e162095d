// `mpirun -np 2 distca train --backend mpi` against the local backend: identical per-step
// losses (bitwise, compared through the JSONL metrics, which print doubles round-trip exact),
// and cad == colocated under mpirun too.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mpi_run_util.h"

namespace {

std::filesystem::path tmp(const std::string& name) { return distca::train::testing::scratch("distca_train_mpi_", name); }

int sh(const std::string& cmd) { return distca::train::testing::run_logged(cmd, tmp("log.txt")); }

std::vector<double> losses(const std::filesystem::path& path) { return distca::train::testing::metric_losses(path); }

// Allows mpirun as root and writes the small model's config (`steps`, `warmup`) to tmp(name).
std::filesystem::path small_config(const std::string& name, int steps, int warmup) {
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  const auto cfg = tmp(name);
  std::ofstream(cfg) << "tokens_per_rank = 128\ndist = \"uniform:16:384\"\nmax_doc_len = 0\nsteps = " << steps
                     << "\nwarmup = " << warmup << "\n"
                     << "[model_overrides]\nn_layers = 2\nhidden = 64\nn_heads = 4\nn_kv_heads = 2\n"
                        "head_dim = 16\nffn = 128\nvocab = 64\n";
  return cfg;
}

const std::string kMpirunNp2 = std::string(DISTCA_MPIEXEC) + " --oversubscribe --allow-run-as-root -np 2 ";

TEST(TrainMpi, MpiBackendMatchesLocalAndCadMatchesColocated) {
  const auto cfg = small_config("cfg.toml", 20, 5);
  const std::string cli = DISTCA_CLI;
  const std::string& mpirun = kMpirunNp2;
  const std::string base = " train --config " + cfg.string() + " --metrics ";
  ASSERT_EQ(sh(cli + base + tmp("local.jsonl").string()), 0);
  ASSERT_EQ(sh(mpirun + cli + base + tmp("mpi_cad.jsonl").string() + " --backend mpi --mode cad"), 0);
  ASSERT_EQ(sh(mpirun + cli + base + tmp("mpi_colo.jsonl").string() + " --backend mpi --mode colocated"), 0);
  const auto local = losses(tmp("local.jsonl"));
  ASSERT_EQ(local.size(), 20u);
  EXPECT_EQ(losses(tmp("mpi_cad.jsonl")), local);
  EXPECT_EQ(losses(tmp("mpi_colo.jsonl")), local);
}

// Tensor parallelism under mpirun: --tp 2 on two processes (one TP group) gives the bits of
// the same run on the local backend (the TP collectives are the communicator's rank-order
// sums on either backend).
TEST(TrainMpi, TensorParallelUnderMpirunMatchesLocal) {
  const auto cfg = small_config("tp_cfg.toml", 5, 2);
  const std::string cli = DISTCA_CLI;
  const std::string& mpirun = kMpirunNp2;
  const std::string base = " train --config " + cfg.string() + " --tp 2 --mode colocated --metrics ";
  ASSERT_EQ(sh(cli + base + tmp("tp_local.jsonl").string()), 0);
  ASSERT_EQ(sh(mpirun + cli + base + tmp("tp_mpi.jsonl").string() + " --backend mpi"), 0);
  const auto local = losses(tmp("tp_local.jsonl"));
  ASSERT_EQ(local.size(), 5u);
  EXPECT_EQ(losses(tmp("tp_mpi.jsonl")), local);
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

// mpirun -np 2 without --backend mpi would run two independent jobs: refused before any
// work, one line from rank 0, exit non-zero.
TEST(TrainMpi, LocalBackendUnderMpirunIsRefused) {
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  const auto metrics = tmp("refused.jsonl");
  std::filesystem::remove(metrics);
  const std::string mpirun = std::string(DISTCA_MPIEXEC) + " --oversubscribe --allow-run-as-root -np 2 ";
  EXPECT_NE(sh(mpirun + DISTCA_CLI + " train --steps 3 --metrics " + metrics.string()), 0);
  std::ifstream log(tmp("log.txt"));
  const std::string text((std::istreambuf_iterator<char>(log)), {});
  const std::string line = "distca: error: --backend local under mpirun would run 2 independent jobs";
  EXPECT_NE(text.find(line), std::string::npos) << text;
  EXPECT_EQ(text.find(line), text.rfind(line)) << text;
  EXPECT_FALSE(std::filesystem::exists(metrics));
}

// The processes whose parent is `parent`.
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent) out.push_back(static_cast<pid_t>(std::stoi(name)));
  }
  return out;
}

std::string environ_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A rank stopped mid-run (SIGSTOP: alive, silent) ends the job after --mpi-timeout, named by
// its peer, instead of leaving rank 0 waiting forever. Bounded by the CTest TIMEOUT.
TEST(TrainMpi, StoppedRankEndsTheJobAfterTheTimeout) {
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  const auto metrics = tmp("stall.jsonl"), err = tmp("stall.err");
  std::filesystem::remove(metrics);
  const pid_t mpirun = fork();
  if (mpirun == 0) {
    if (std::freopen(err.c_str(), "w", stderr) == nullptr || std::freopen("/dev/null", "w", stdout) == nullptr) _exit(127);
    execl(DISTCA_MPIEXEC, DISTCA_MPIEXEC, "--oversubscribe", "--allow-run-as-root", "-np", "2", DISTCA_CLI, "train",
          "--backend", "mpi", "--steps", "100000", "--mpi-timeout", "5", "--metrics", metrics.c_str(), nullptr);
    _exit(127);
  }
  // Wait (by events) until the run is in its steps, then stop rank 1.
  pid_t stopped = -1;
  for (int i = 0; i < 1000000 && stopped < 0; ++i) {
    std::ifstream m(metrics);
    std::string line;
    int lines = 0;
    while (std::getline(m, line)) ++lines;
    if (lines >= 2) {
      for (pid_t c : children_of(mpirun)) {
        if (environ_of(c).find(std::string("OMPI_COMM_WORLD_RANK=1") + '\0') != std::string::npos) stopped = c;
      }
    }
    if (stopped < 0) usleep(1000);
  }
  ASSERT_GT(stopped, 0) << "rank 1 not found";
  ASSERT_EQ(kill(stopped, SIGSTOP), 0);
  int status = 0;
  ASSERT_EQ(waitpid(mpirun, &status, 0), mpirun);
  kill(stopped, SIGKILL);  // in case mpirun left it behind
  EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  std::ifstream in(err);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(text.find("distca: rank 0 failed: no progress for 5 s (--mpi-timeout): "), std::string::npos) << text;
  EXPECT_NE(text.find("rank(s) 1 "), std::string::npos) << text;
}

}  // namespace
