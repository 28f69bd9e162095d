// `distca train` through the CLI: bad input refused with one line before any work, a corrupt or
// mismatched checkpoint refused, the summary's last line, and the JSONL metrics.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

namespace {

struct CliRun {
  int code = 0;
  std::string out;  // stdout + stderr
};

CliRun run(const std::string& args) {
  const std::string cmd = std::string(DISTCA_CLI) + " train " + args + " 2>&1";
  CliRun r;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.code = WEXITSTATUS(st);
  return r;
}

std::filesystem::path tmp(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("distca_train_cli_" + name);
}

// A small model so a run takes a second.
std::string small_config_file() {
  const auto path = tmp("small.toml");
  std::ofstream(path) << "tokens_per_rank = 128\ndist = \"uniform:16:256\"\nsteps = 4\nwarmup = 2\n"
                         "[model_overrides]\nn_layers = 2\nhidden = 64\nn_heads = 4\nn_kv_heads = 2\n"
                         "head_dim = 16\nffn = 128\nvocab = 64\n";
  return path.string();
}

TEST(TrainCli, BadInputIsOneLineNamingTheFlagAndExit2) {
  struct Case { std::string args, needle; };
  const auto bad_toml = tmp("bad.toml");
  std::ofstream(bad_toml) << "steps = 3\nlearning_rate = 1\n";
  for (const Case& c : std::vector<Case>{{"--ranks 0", "--ranks"},
                                         {"--mode fast", "--mode"},
                                         {"--backend nccl", "--backend"},
                                         {"--data words", "--data"},
                                         {"--lr -1", "--lr"},
                                         {"--config " + bad_toml.string(), "learning_rate"},
                                         {"--resume /nonexistent/x.ckpt", "--resume"},
                                         {"--metrics /nonexistent/dir/m.jsonl", "--metrics"},
                                         {"--model llama-34b", "--model llama-34b needs"},
                                         {"--overlap fast", "--overlap must be pingpong, single-stream or signal"},
                                         {"--mode colocated --overlap pingpong", "--overlap applies to --mode cad only"},
                                         {"--mode colocated --overlap signal", "--overlap applies to --mode cad only"},
                                         {"--trace /nonexistent/dir/t.json", "--trace"},
                                         {"--trace /proc/self/status", "--trace"},
                                         {"--pp 3", "--pp 3 does not divide --ranks 2"},
                                         {"--pp 2 --mode colocated", "--micro-batches 1 is fewer than the 2"},
                                         {"--ranks 3 --pp 3 --micro-batches 3", "--pp 3 stages exceed the model's 2 layers"},
                                         {"--micro-batches 0", "--micro-batches must be in 1..4096"},
                                         {"--tp 3", "--tp 3 x --pp 1 does not divide --ranks 2"},
                                         {"--tp 4 --ranks 4", "--tp 4 must divide the model's heads (4) and KV heads (2)"},
                                         {"--tp 0", "--tp must be in 1..64 (got 0)"},
                                         {"--tp 2 --pp 2 --ranks 6 --micro-batches 2 --mode colocated",
                                          "--tp 2 x --pp 2 does not divide --ranks 6"},
                                         {"--tp 2 --ranks 4 --mode wlb", "--tp is not yet composed with --mode wlb or percp"},
                                         {"--tp 2 --ranks 4 --ranks-per-host 2", "need --tp 1"},
                                         // Past the int range: the range is stated, not "positive".
                                         {"--steps 2147483648", "--steps must be in 1..100000000 (got 2147483648)"}}) {
    const CliRun r = run(c.args);
    EXPECT_EQ(r.code, 2) << c.args << ": " << r.out;
    EXPECT_NE(r.out.find(c.needle), std::string::npos) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  }
}

TEST(TrainCli, SummaryMetricsAndCheckpointRefusals) {
  const auto dir = tmp("ckpt");
  std::filesystem::remove_all(dir);
  const auto metrics = tmp("m.jsonl");
  const std::string cfg = small_config_file();
  const CliRun r = run("--config " + cfg + " --checkpoint-dir " + dir.string() + " --metrics " + metrics.string());
  ASSERT_EQ(r.code, 0) << r.out;
  // The last line is "final loss: X", X the last step's second-half loss from the metrics.
  std::istringstream lines(r.out);
  std::string line, last;
  while (std::getline(lines, line)) last = line;
  ASSERT_EQ(last.rfind("final loss: ", 0), 0u) << r.out;
  std::ifstream m(metrics);
  std::vector<nlohmann::json> steps;
  while (std::getline(m, line)) steps.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(steps.size(), 4u);
  EXPECT_NEAR(std::stod(last.substr(12)), steps.back()["report_loss"].get<double>(), 1e-6);
  for (const char* key : {"step", "loss", "report_loss", "tokens_per_s", "imbalance_before",
                          "imbalance_after", "linear_s", "attention_s", "comm_s", "wait_s", "optimizer_s"}) {
    EXPECT_TRUE(steps[0].contains(key)) << key;
  }
  const auto ckpt = dir / "step-00000004.ckpt";
  ASSERT_TRUE(std::filesystem::exists(ckpt));
  // Resuming the finished run is refused (its step is not before --steps: nothing to resume);
  // so is a different seed.
  const CliRun again = run("--config " + cfg + " --resume " + ckpt.string());
  EXPECT_EQ(again.code, 2) << again.out;
  EXPECT_NE(again.out.find("step 4 is not before the run's end (--steps 4)"), std::string::npos) << again.out;
  const CliRun other = run("--config " + cfg + " --seed 7 --resume " + ckpt.string());
  EXPECT_EQ(other.code, 2) << other.out;
  EXPECT_NE(other.out.find("was written for seed=1; this run has seed=7"), std::string::npos) << other.out;
  // Flip one byte in the middle.
  std::string bytes;
  {
    std::ifstream in(ckpt, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  bytes[bytes.size() / 2] ^= 0x01;
  const auto bad = dir / "bad.ckpt";
  std::ofstream(bad, std::ios::binary) << bytes;
  const CliRun corrupt = run("--config " + cfg + " --resume " + bad.string());
  EXPECT_EQ(corrupt.code, 2);
  EXPECT_EQ(corrupt.out, "distca: error: --resume " + bad.string() + ": checksum mismatch (file corrupt)\n");
  // Truncated.
  std::ofstream(bad, std::ios::binary) << bytes.substr(0, bytes.size() / 3);
  const CliRun cut = run("--config " + cfg + " --resume " + bad.string());
  EXPECT_EQ(cut.code, 2) << cut.out;
  EXPECT_EQ(std::count(cut.out.begin(), cut.out.end(), '\n'), 1) << cut.out;
  std::filesystem::remove_all(dir);
  std::filesystem::remove(metrics);
}

std::vector<double> losses(const std::filesystem::path& path) {
  std::vector<double> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  return out;
}

std::string bytes_of(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Through the binary: 8 steps straight against 4 + resume 4 (a separate process, so nothing
// but the checkpoint carries over): the same losses and the same final checkpoint, bit for bit.
TEST(TrainCli, ResumeInANewProcessIsBitwiseIdentical) {
  const auto dir = tmp("resume");
  std::filesystem::remove_all(dir);
  const std::string cfg = small_config_file();
  const auto a = dir / "a.jsonl", b = dir / "b.jsonl";
  std::filesystem::create_directories(dir);
  CliRun r = run("--config " + cfg + " --steps 8 --checkpoint-every 4 --checkpoint-dir " + (dir / "a").string() +
                 " --metrics " + a.string());
  ASSERT_EQ(r.code, 0) << r.out;
  r = run("--config " + cfg + " --steps 8 --mode colocated --checkpoint-dir " + (dir / "b").string() + " --metrics " +
          b.string() + " --resume " + (dir / "a" / "step-00000004.ckpt").string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto la = losses(a), lb = losses(b);
  ASSERT_EQ(la.size(), 8u);
  ASSERT_EQ(lb.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(la[i + 4], lb[i]) << i;
  const std::string ca = bytes_of(dir / "a" / "step-00000008.ckpt");
  EXPECT_FALSE(ca.empty());
  EXPECT_TRUE(ca == bytes_of(dir / "b" / "step-00000008.ckpt"));
  std::filesystem::remove_all(dir);
}

}  // namespace
