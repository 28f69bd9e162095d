// `distca train` hardening (issue 12): settings refused before step 0 with exit 2, impossible
// checkpoints, the memory estimate (refusal, and an upper bound of the measured peak), and
// temporary files across signals and SIGKILL.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "distca/core/io.h"
#include "distca/train/checkpoint.h"
#include "support/cli_fixture.h"

namespace distca::train {
namespace {

namespace fs = std::filesystem;
using distca::testing::CliRun;

// A small model so a run takes about a second.
constexpr const char* kSmall =
    "tokens_per_rank = 128\ndist = \"uniform:16:256\"\nsteps = 4\nwarmup = 2\n"
    "[model_overrides]\nn_layers = 2\nhidden = 64\nn_heads = 4\nn_kv_heads = 2\n"
    "head_dim = 16\nffn = 128\nvocab = 300\n";

class TrainHardening : public distca::testing::CliFixture {
 protected:
  TrainHardening() : CliFixture("train_hardening", "train") {}
  void SetUp() override {
    CliFixture::SetUp();
    cfg_ = (dir_ / "small.toml").string();
    std::ofstream(cfg_) << kSmall;
  }
  // Refused with exit 2 and one line containing `needle`; nothing ran (no step, no
  // checkpoint directory, no metrics).
  void expect_refused_before_work(const std::string& args, const std::string& needle) {
    const fs::path ck = dir_ / "ck", metrics = dir_ / "m.jsonl";
    const CliRun r = run("--config " + cfg_ + " " + args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
    EXPECT_EQ(r.out, "") << args;
    EXPECT_FALSE(fs::exists(ck)) << args;
    EXPECT_FALSE(fs::exists(metrics)) << args;
  }
  std::string cfg_;
};

TEST_F(TrainHardening, SettingsFoundLateAreRefusedBeforeStep0) {
  const fs::path empty_dir = dir_ / "empty", empties = dir_ / "empties", file = dir_ / "plain.txt";
  fs::create_directories(empty_dir);
  fs::create_directories(empties / "sub");
  std::ofstream(empties / "a.txt").close();
  std::ofstream(empties / "sub" / "b.txt").close();
  std::ofstream(file) << "text";
  const std::string ck = " --checkpoint-dir " + (dir_ / "ck").string();
  const std::string metrics = " --metrics " + (dir_ / "m.jsonl").string();
  struct Case {
    std::string args, needle;
  };
  for (const Case& c : std::vector<Case>{
           {"--tolerance 5" + ck, "--tolerance must be in [0, 1]"},
           {"--data text:" + (dir_ / "missing").string() + ck, "no such directory"},
           {"--data text:" + file.string() + ck, "not a directory"},
           {"--data text:" + empty_dir.string() + ck, "no non-empty regular file"},
           {"--data text:" + empties.string() + ck, "no non-empty regular file"},
           // Unwritable outputs: below a regular file (root may write anywhere else).
           {"--metrics " + (file / "m.jsonl").string() + ck, "--metrics"},
           {"--checkpoint-dir " + (file / "ck").string() + metrics, "--checkpoint-dir"},
       }) {
    expect_refused_before_work(c.args, c.needle);
  }
}

// Topology and --tolerance auto: bad combinations refused before any work (exit 2).
TEST_F(TrainHardening, TopologyAndAutoToleranceCombinationsAreRefused) {
  const std::string ck = " --checkpoint-dir " + (dir_ / "ck").string();
  const std::string hw = " --hardware " + std::string(DISTCA_SOURCE_DIR) + "/configs/hardware/local-2rank.json";
  struct Case {
    std::string args, needle;
  };
  for (const Case& c : std::vector<Case>{
           {"--tolerance auto" + ck, "--tolerance auto needs --hardware"},
           {"--tolerance abc" + ck, "--tolerance must be auto or a number"},
           {"--tolerance auto --mode colocated" + hw + ck, "--tolerance auto needs --mode cad"},
           {"--tolerance auto --scheduler percp:2" + hw + ck, "--tolerance auto needs --scheduler cad"},
           {"--tolerance 0.1" + hw + ck, "--hardware is used only with --tolerance auto"},
           {"--tolerance auto --hardware " + (dir_ / "missing.json").string() + ck, "missing.json"},
           // --mode wlb reads the profile for its chunking: a bad one is refused before work.
           {"--mode wlb --hardware " + (dir_ / "missing.json").string() + ck, "missing.json"},
           {"--mode wlb --hardware " + (dir_ / "small.toml").string() + ck, "--hardware: "},
           {"--mode percp --cp 2" + hw + ck, "--hardware is used only with --tolerance auto, --kv-once auto or --mode wlb"},
           {"--kv-once sometimes" + ck, "--kv-once must be on, off or auto (got 'sometimes')"},
           {"--kv-once auto" + ck, "--kv-once auto needs --hardware"},
           {"--kv-once off --mode colocated" + ck, "--kv-once applies to --mode cad only"},
           {"--ranks-per-host 3" + ck, "--ranks-per-host 3 must be >= 1 and divide"},
           {"--host-map 0,1,1" + ck, "--host-map: 3 hosts given for 2 ranks"},
           {"--host-map mpi" + ck, "--host-map mpi needs --backend mpi"},
           {"--inter-host-price 4" + ck, "--inter-host-price needs --ranks-per-host or --host-map"},
           {"--ranks-per-host 1 --mode colocated" + ck, "cad mode only"},
       }) {
    expect_refused_before_work(c.args, c.needle);
  }
}

// One host is no topology: the same losses bit for bit. Two hosts and --tolerance auto run.
TEST_F(TrainHardening, TopologyOneHostSameBitsAndAutoToleranceRuns) {
  const CliRun plain = run("--config " + cfg_);
  ASSERT_EQ(plain.code, 0) << plain.err;
  const CliRun one_host = run("--config " + cfg_ + " --host-map 1,1");
  ASSERT_EQ(one_host.code, 0) << one_host.err;
  EXPECT_EQ(plain.out.substr(plain.out.find("final loss")), one_host.out.substr(one_host.out.find("final loss")));
  const std::string hw = " --hardware " + std::string(DISTCA_SOURCE_DIR) + "/configs/hardware/local-2rank.json";
  const CliRun two = run("--config " + cfg_ + " --ranks-per-host 1 --tolerance auto" + hw);
  ASSERT_EQ(two.code, 0) << two.err;
  const CliRun again = run("--config " + cfg_ + " --ranks-per-host 1 --tolerance auto" + hw);
  EXPECT_EQ(two.out.substr(two.out.find("final loss")), again.out.substr(again.out.find("final loss")));
  // --kv-once moves K/V at other times, never other numbers.
  for (const std::string& kv : {std::string(" --kv-once off"), " --kv-once auto" + hw}) {
    const CliRun k = run("--config " + cfg_ + kv);
    ASSERT_EQ(k.code, 0) << kv << k.err;
    EXPECT_EQ(plain.out.substr(plain.out.find("final loss")), k.out.substr(k.out.find("final loss"))) << kv;
  }
}

// Rewrites `src` after `change` with a valid checksum (serialize_checkpoint computes it).
void write_changed(const fs::path& src, const fs::path& dst, const std::function<void(Checkpoint&)>& change) {
  auto bytes = read_file(src.string());
  ASSERT_TRUE(bytes.ok());
  auto c = parse_checkpoint(*bytes, "x");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  change(*c);
  std::ofstream(dst, std::ios::binary) << serialize_checkpoint(*c);
}

TEST_F(TrainHardening, CheckpointsWithAValidChecksumButImpossibleContentAreRefused) {
  const fs::path ck = dir_ / "first";
  const CliRun first = run("--config " + cfg_ + " --checkpoint-every 2 --checkpoint-dir " + ck.string());
  ASSERT_EQ(first.code, 0) << first.err;
  const fs::path good = ck / "step-00000002.ckpt";
  ASSERT_TRUE(fs::exists(good));
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  struct Case {
    std::string name;
    std::function<void(Checkpoint&)> change;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"negative_step", [](Checkpoint& c) { c.step = -1; c.adam_step = -1; }, "step -1 is negative"},
      {"finished", [](Checkpoint& c) { c.step = 4; c.adam_step = 4; }, "step 4 is not before the run's end"},
      {"past_end", [](Checkpoint& c) { c.step = 9; c.adam_step = 9; }, "step 9 is not before the run's end"},
      {"adam_count", [](Checkpoint& c) { c.adam_step = 7; }, "optimizer step count 7 does not match step 2"},
      {"nan_param", [&](Checkpoint& c) { c.params[5] = nan; }, "parameter 5 is not finite"},
      {"inf_m", [&](Checkpoint& c) { c.adam_m[3] = -inf; }, "AdamW first moment 3 is not finite"},
      {"nan_v", [&](Checkpoint& c) { c.adam_v.back() = nan; }, "AdamW second moment"},
      {"negative_v", [](Checkpoint& c) { c.adam_v[0] = -1.0f; }, "AdamW second moment 0 is negative"},
  };
  for (const Case& c : cases) {
    const fs::path bad = dir_ / (c.name + ".ckpt");
    write_changed(good, bad, c.change);
    expect_refused_before_work("--resume " + bad.string() + " --checkpoint-dir " + (dir_ / "ck").string(),
                               c.needle);
  }
  // The unchanged checkpoint resumes (the checks refuse only what is impossible).
  const fs::path same = dir_ / "same.ckpt";
  write_changed(good, same, [](Checkpoint&) {});
  const CliRun ok = run("--config " + cfg_ + " --resume " + same.string());
  EXPECT_EQ(ok.code, 0) << ok.err;
}

TEST_F(TrainHardening, MemoryEstimateRefusesBeforeAllocating) {
  // Every rank thread builds the step's whole plan (ranks^2 per-peer tables): 1024 ranks need
  // far more than a test machine has; refused before anything is allocated.
  struct Case {
    std::string args, flag;
  };
  for (const Case& c : std::vector<Case>{{"--ranks 1024", "--ranks 1024"},
                                         {"--ranks 8 --tokens-per-rank 2097152", "--tokens-per-rank 2097152"},
                                         {"--model llama-8b", "--model llama-8b"}}) {
    const CliRun r = run(c.args);
    EXPECT_EQ(r.code, 2) << c.args << ": " << r.err;
    EXPECT_NE(r.err.find(" needs about "), std::string::npos) << c.args << ": " << r.err;
    EXPECT_NE(r.err.find(c.flag), std::string::npos) << c.args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

// "12.3 MiB" -> bytes.
double parse_bytes(const std::string& text) {
  const double v = std::stod(text);
  const std::string unit = text.substr(text.find(' ') + 1, 3);
  const double mult = unit == "KiB" ? 1024.0 : unit == "MiB" ? 1048576.0 : unit == "GiB" ? 1073741824.0 : 1.0;
  return v * mult;
}

struct Measured {
  int code = -1;
  double max_rss = 0;   // bytes, from the kernel (wait4), not from the program
  double estimate = 0;  // bytes, the summary's "memory estimate per process"
};

// Runs the CLI in a child and reads its peak RSS from wait4's rusage: an independent
// measurement of what the estimate claims to bound.
Measured run_measured(const std::vector<std::string>& args, const fs::path& out) {
  Measured m;
  const pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> argv;
    std::string cli = DISTCA_CLI;
    argv.push_back(cli.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    FILE* f = std::freopen(out.c_str(), "w", stdout);
    if (f == nullptr) _exit(127);
    execv(cli.c_str(), argv.data());
    _exit(127);
  }
  int status = 0;
  rusage u{};
  wait4(pid, &status, 0, &u);
  m.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  m.max_rss = static_cast<double>(u.ru_maxrss) * 1024.0;
  const std::string text = distca::testing::slurp(out);
  const std::string key = "memory estimate per process: ";
  const size_t at = text.find(key);
  if (at != std::string::npos) m.estimate = parse_bytes(text.substr(at + key.size()));
  return m;
}

TEST_F(TrainHardening, MemoryEstimateBoundsTheMeasuredPeak) {
  const fs::path corpus = dir_ / "corpus";
  fs::create_directories(corpus);
  for (int i = 0; i < 20; ++i) {
    const std::string name = std::to_string(i) + ".txt";
    std::ofstream(corpus / name) << std::string(static_cast<size_t>(200 + 37 * i), static_cast<char>('a' + i % 26));
  }
  struct Case {
    std::vector<std::string> args;
  };
  const std::string ck = (dir_ / "ck").string(), metrics = (dir_ / "m.jsonl").string();
  for (const auto& extra : std::vector<std::vector<std::string>>{
           {"--ranks", "1"},
           {"--ranks", "2", "--checkpoint-dir", ck, "--checkpoint-every", "1", "--metrics", metrics},
           {"--ranks", "4", "--mode", "colocated"},
           {"--ranks", "8"},
           {"--ranks", "2", "--data", "text:" + corpus.string()},
           {"--ranks", "4", "--pp", "2", "--micro-batches", "4", "--mode", "colocated"},
           {"--ranks", "4", "--pp", "2", "--micro-batches", "4", "--mode", "cad"},
       }) {
    std::vector<std::string> args = {"train", "--config", cfg_, "--steps", "3"};
    args.insert(args.end(), extra.begin(), extra.end());
    const Measured m = run_measured(args, dir_ / "out.txt");
    ASSERT_EQ(m.code, 0) << extra[1];
    ASSERT_GT(m.estimate, 0) << distca::testing::slurp(dir_ / "out.txt");
    EXPECT_LE(m.max_rss, m.estimate) << extra[1] << " ranks: measured " << m.max_rss << " bytes";
  }
}

bool has_temp_file(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().find(".tmp.") != std::string::npos) return true;
  }
  return false;
}

// SIGTERM while checkpoints are being written every step: the process dies by the signal and no
// temporary file remains (write_file_atomic registers it; the handler removes it).
TEST_F(TrainHardening, SigtermDuringCheckpointingLeavesNoTemporaryFile) {
  const fs::path ck = dir_ / "ck";
  // A model of about 4 M parameters (48 MiB checkpoints), so a write takes a while.
  std::ofstream(cfg_) << "tokens_per_rank = 64\ndist = \"fixed:64\"\nsteps = 1000\nwarmup = 2\n"
                         "[model_overrides]\nn_layers = 1\nhidden = 512\nn_heads = 4\nn_kv_heads = 2\n"
                         "head_dim = 16\nffn = 512\nvocab = 3000\n";
  for (int sig : {SIGTERM, SIGINT}) {
    fs::remove_all(ck);
    const pid_t pid = fork();
    if (pid == 0) {
      std::string cli = DISTCA_CLI;
      std::string a[] = {"train", "--config", cfg_, "--checkpoint-dir", ck.string(), "--checkpoint-every", "1"};
      char* argv[] = {cli.data(), a[0].data(), a[1].data(), a[2].data(), a[3].data(), a[4].data(), a[5].data(),
                      a[6].data(), nullptr};
      if (std::freopen("/dev/null", "w", stdout) == nullptr) _exit(127);
      execv(cli.c_str(), argv);
      _exit(127);
    }
    // Wait (by events, not time) until a checkpoint's temporary file exists, then signal.
    bool seen = false;
    int status = 0;
    for (int i = 0; i < 2000000 && !seen; ++i) {
      if (waitpid(pid, &status, WNOHANG) == pid) break;
      std::error_code ec;
      if (fs::is_directory(ck, ec)) {
        for (const auto& e : fs::directory_iterator(ck, ec)) {
          if (e.path().filename().string().find(".tmp.") != std::string::npos) seen = true;
        }
      }
      if (!seen) usleep(200);
    }
    ASSERT_TRUE(seen) << "no checkpoint was being written";
    kill(pid, sig);
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig) << status;
    EXPECT_FALSE(has_temp_file(ck)) << "signal " << sig;
  }
}

// SIGKILL cannot be caught: the next run removes the temporary files of its own checkpoints
// left by dead processes of this host, and keeps everything else: a live run's, a user's file
// that only looks like one, and a file of another host sharing the directory.
TEST_F(TrainHardening, StaleTemporaryFilesOfDeadProcessesAreRemovedAtStart) {
  const fs::path ck = dir_ / "ck";
  fs::create_directories(ck);
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_EQ(waitpid(dead, nullptr, 0), dead);
  std::string target, host;
  long pid = 0;
  ASSERT_TRUE(distca::parse_temp_file_name(distca::temp_file_path("x"), &target, &host, &pid));
  const auto temp = [&](const std::string& name, const std::string& on, long p) {
    return ck / (name + ".tmp." + on + "." + std::to_string(p) + ".distca");
  };
  const fs::path stale = temp("step-00000003.ckpt", host, dead);
  const std::vector<fs::path> kept = {temp("step-00000003.ckpt", host, getpid()),
                                      temp("step-00000003.ckpt", "other-host", dead),
                                      temp("notes.txt", host, dead),
                                      ck / "step-important-notes.tmp.999999",
                                      ck / ("step-00000003.ckpt.tmp." + std::to_string(dead))};
  std::ofstream(stale) << "partial";
  for (const fs::path& k : kept) std::ofstream(k) << "partial";
  const CliRun r = run("--config " + cfg_ + " --checkpoint-dir " + ck.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(fs::exists(stale));
  for (const fs::path& k : kept) EXPECT_TRUE(fs::exists(k)) << k;
}

TEST_F(TrainHardening, MpiBackendOutsideMpirunAndLocalUnderALauncherAreRefused) {
  // The config says 2 ranks; a process not started by mpirun is an MPI world of 1.
  const CliRun r = run("--config " + cfg_ + " --backend mpi");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(r.err,
            "distca: error: --backend mpi: config says 2 ranks but the MPI world has 1 (not started by mpirun); run "
            "under mpirun -np 2\n");
  // What mpirun -np 2 puts in the environment of rank 0 (tests/train/train_mpi_test.cpp runs
  // the real thing); MPI itself is never initialised for it.
  const CliRun l = run("--config " + cfg_);
  ASSERT_EQ(l.code, 0);
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  setenv("OMPI_COMM_WORLD_RANK", "0", 1);
  const CliRun two = run("--config " + cfg_);
  unsetenv("OMPI_COMM_WORLD_SIZE");
  unsetenv("OMPI_COMM_WORLD_RANK");
  EXPECT_EQ(two.code, 2) << two.err;
  EXPECT_NE(two.err.find("--backend local under mpirun would run 2 independent jobs"), std::string::npos) << two.err;
  EXPECT_EQ(std::count(two.err.begin(), two.err.end(), '\n'), 1) << two.err;
  // --mpi-timeout is checked up front.
  const CliRun t = run("--config " + cfg_ + " --mpi-timeout 0");
  EXPECT_EQ(t.code, 2);
  EXPECT_NE(t.err.find("--mpi-timeout"), std::string::npos) << t.err;
}

}  // namespace
}  // namespace distca::train
