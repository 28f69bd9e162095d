// The input and output rules across commands (docs/development.md, "Input and output rules"),
// each checked as a class on several commands: two outputs naming one file, empty values,
// --mpi-timeout's one rule, JSON followed by a NUL byte, model sizes out of range, messages
// that name the command's own flags, and the benchmarks' defaults against a 24 GiB machine.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/cli_fixture.h"

namespace distca::testing {
namespace {

class CliRulesTest : public CliFixture {
 protected:
  CliRulesTest() : CliFixture("cli_rules", "") {}

  // `args` ends with exit 2 and one stderr line holding `says`; none of `files` exists after.
  void expect_refused(const std::string& args, const std::string& says, const std::vector<fs::path>& files = {}) {
    const CliRun r = run(args, 120);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("distca: error: ", 0), 0u) << args << ": " << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
    for (const fs::path& f : files) EXPECT_FALSE(fs::exists(f)) << args << ": " << f;
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // A training config of a few tiny steps.
  std::string small_config(const std::string& extra = "") const {
    const std::string cfg = path("small.toml");
    std::ofstream(cfg) << "steps = 2\nwarmup = 1\ntokens_per_rank = 64\ndist = \"fixed:32\"\n" << extra;
    return cfg;
  }
};

// A small hardware profile run: what `profile --hardware-out` would measure if it started.
constexpr const char* kSmallProfile =
    "profile --width 32 --head-dim 16 --ffn 64 --vocab 16 --tokens 32 --min-len 16 --max-len 32 --repeats 1 "
    "--min-seconds 0 --gemm-repeats 1";

TEST_F(CliRulesTest, TwoOutputsNamingOneFileAreRefusedBeforeWork) {
  const std::string x = path("x.json"), same = (dir_ / "." / "x.json").string();
  expect_refused(std::string(kSmallProfile) + " --hardware-out " + x + " --out " + x,
                 "--out '" + x + "' and --hardware-out '" + x + "' name the same file", {x});
  expect_refused("simulate --gpus 8 --json " + x + " --trace " + same, "name the same file", {x});
  const std::string cfg = small_config();
  expect_refused("train --config " + cfg + " --metrics " + x + " --trace " + x, "--metrics '" + x + "' and --trace", {x});
  expect_refused("train --config " + cfg + " --metrics " + x + " --checkpoint-dir " + same, "--checkpoint-dir", {x});
  expect_refused("bench train --ranks 2 --width 64 --layers 1 --tokens-per-rank 256 --short-doc 32 --rounds 1 --steps 2 "
                 "--json " + x + " --trace " + same,
                 "name the same file", {x});
  expect_refused("bench step --json " + x + " --trace " + x, "name the same file", {x});
  // A link to an existing file, and "-" with the file standard output goes to.
  std::ofstream(x) << "kept";
  fs::create_symlink(x, dir_ / "link.json");
  expect_refused("simulate --gpus 8 --json " + x + " --trace " + path("link.json"), "name the same file");
  EXPECT_EQ(slurp(x), "kept");
  expect_refused("simulate --gpus 8 --json - --trace " + path("stdout"), "--json - (standard output) and --trace");
  // /dev/null takes any number of outputs.
  const CliRun ok = run("simulate --gpus 8 --json /dev/null --trace /dev/null", 120);
  EXPECT_EQ(ok.code, 0) << ok.err;
}

TEST_F(CliRulesTest, EmptyValuesAreRefusedForEveryOptionThatTakesOne) {
  const std::string cfg = small_config();
  expect_refused("train --config " + cfg + " --mode colocated --overlap ''", "--overlap");
  expect_refused("train --config " + cfg + " --overlap ''", "--overlap");
  expect_refused("train --config " + cfg + " --backend ''", "--backend");
  expect_refused("train --config " + cfg + " --tp-overlap yes", "--tp-overlap must be on or off (got 'yes')");
  expect_refused("bench train --workload ''", "--workload");
  expect_refused("bench step --mode ''", "--mode");
  expect_refused("simulate --gpus 8 --strategy ''", "--strategy");
  expect_refused("train --config " + cfg + " --metrics ''", "--metrics");
}

TEST_F(CliRulesTest, MpiTimeoutHasOneRuleOnEveryCommand) {
  const std::string cfg = small_config();
  for (const std::string& cmd : {std::string(kSmallProfile) + " --hardware-out " + path("hw.json"),
                                 "train --config " + cfg, std::string("bench train"), std::string("bench step")}) {
    for (const std::string v : {"0", "-1", "1e7"}) {
      expect_refused(cmd + " --mpi-timeout " + v, "--mpi-timeout: must be in (0, 1e6] seconds (got " + v + ")",
                     {dir_ / "hw.json"});
    }
  }
}

TEST_F(CliRulesTest, JsonFollowedByANulByteIsRefusedAsAnyTrailingJunk) {
  const std::string good = std::string(DISTCA_SOURCE_DIR) + "/configs/hardware/local-2rank.json";
  ASSERT_TRUE(fs::exists(good));
  const std::string text = slurp(good);
  std::ofstream(path("nul.json"), std::ios::binary) << text << std::string("\0junk", 5);
  std::ofstream(path("space.json"), std::ios::binary) << text << " junk";
  expect_refused("simulate --gpus 8 --hardware " + path("nul.json"), "a NUL byte at byte " + std::to_string(text.size()));
  expect_refused("simulate --gpus 8 --hardware " + path("space.json"), "is not valid JSON");
  const CliRun ok = run("simulate --gpus 8 --hardware " + good, 120);
  EXPECT_EQ(ok.code, 0) << ok.err;
}

// DISTCA_WAIT (the mpi backend's wait policy) is read by every command before any work: a
// bad value is one line and exit 2, with no output file written; spin and sleep run.
TEST_F(CliRulesTest, BadWaitPolicyIsRefusedBeforeWork) {
  const std::string cfg = small_config(), metrics = path("m.jsonl");
  ::setenv("DISTCA_WAIT", "yield", 1);
  expect_refused("train --config " + cfg + " --metrics " + metrics, "DISTCA_WAIT must be spin or sleep (got 'yield')",
                 {metrics});
  expect_refused("simulate --gpus 8 --json " + path("s.json"), "DISTCA_WAIT must be spin or sleep (got 'yield')",
                 {dir_ / "s.json"});
  for (const char* ok : {"spin", "sleep", ""}) {
    ::setenv("DISTCA_WAIT", ok, 1);
    const CliRun r = run("simulate --gpus 8 --json /dev/null", 120);
    EXPECT_EQ(r.code, 0) << "DISTCA_WAIT='" << ok << "': " << r.err;
  }
  ::unsetenv("DISTCA_WAIT");
}

// Every [model_overrides] field has a range, checked before anything is sized: neither a
// per-layer table of 10 million layers nor a rank's BLAS call sees them.
TEST_F(CliRulesTest, ModelOverridesOutOfRangeAreRefusedBeforeAllocation) {
  const std::string metrics = path("m.jsonl");
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"n_layers", "10000000"}, {"hidden", "4611686018427387904"}, {"ffn", "4611686018427387904"},
           {"vocab", "4611686018427387904"}, {"n_heads", "0"}, {"head_dim", "4096"}}) {
    const std::string cfg = small_config("[model_overrides]\n" + key + " = " + value + "\n");
    expect_refused("train --config " + cfg + " --max-memory 1G --metrics " + metrics,
                   "model_overrides." + key + " must be in ", {metrics});
  }
  // In range each, but the logits (tokens per rank x vocab) exceed BLAS's sizes.
  const std::string cfg = small_config("[model_overrides]\nvocab = 16777216\n");
  expect_refused("train --config " + cfg + " --tokens-per-rank 256 --metrics " + metrics,
                 "--tokens-per-rank 256 times the model's widest layer (16777216) exceeds the BLAS int range", {metrics});
}

TEST_F(CliRulesTest, PipelinedRunsNameTheirOwnSchedule) {
  const std::string cfg = small_config();
  const CliRun cad = run("train --config " + cfg + " --ranks 2 --pp 2 --micro-batches 2 --mode cad", 300);
  ASSERT_EQ(cad.code, 0) << cad.err;
  EXPECT_NE(cad.out.find("per replica and step (1F1B ticks"), std::string::npos) << cad.out;
  EXPECT_EQ(cad.out.find("(1F1B)"), std::string::npos) << cad.out;
  const CliRun colocated = run("train --config " + cfg + " --ranks 2 --pp 2 --micro-batches 2 --mode colocated", 300);
  ASSERT_EQ(colocated.code, 0) << colocated.err;
  EXPECT_NE(colocated.out.find("per replica and step (1F1B)"), std::string::npos) << colocated.out;
  const CliRun accum = run("train --config " + cfg + " --ranks 2 --micro-batches 2 --mode colocated", 300);
  ASSERT_EQ(accum.code, 0) << accum.err;
  EXPECT_NE(accum.out.find("per replica and step (gradient accumulation)"), std::string::npos) << accum.out;
}

// bench train's refusals name its own flags, never `distca train`'s (--mode, model_overrides).
// The baselines' flag rules (issue 26): refused with exit 2 before any work (no metrics file),
// from flags and from the TOML config alike.
TEST_F(CliRulesTest, BaselineModeCombinationsAreRefusedBeforeWork) {
  const std::string m = path("m.jsonl"), cfg = small_config();
  const std::string train = "train --config " + cfg + " --metrics " + m + " ";
  expect_refused(train + "--ranks 4 --mode wlb --cp 3", "--cp 3 does not divide the 4 data-parallel ranks", {m});
  expect_refused(train + "--mode cad --cp 2", "--cp applies to --mode wlb or percp only (got --mode cad)", {m});
  expect_refused(train + "--mode colocated --cp 2", "--cp applies to --mode wlb or percp only", {m});
  expect_refused(train + "--mode wlb --wlb-cap 0.5", "--wlb-cap must be >= 1 (got 0.5)", {m});
  expect_refused(train + "--mode percp", "--mode percp needs --cp C >= 2", {m});
  expect_refused(train + "--mode colocated --wlb-cap 1.5", "--wlb-cap applies to --mode wlb only", {m});
  expect_refused(train + "--mode wlb --cp-threshold 64", "--cp-threshold needs --cp C >= 2", {m});
  expect_refused(train + "--mode percp --cp 2 --overlap pingpong", "--overlap applies to --mode cad only", {m});
  expect_refused(train + "--mode thd", "--mode must be cad, colocated, wlb or percp (got 'thd')", {m});
  expect_refused("train --metrics " + m + " --config " + small_config("mode = \"wlb\"\ncp = 2\nranks = 3\n"),
                 "--cp 2 does not divide the 3 data-parallel ranks", {m});
}

TEST_F(CliRulesTest, BenchTrainRefusalsNameItsOwnFlags) {
  const std::string small = "bench train --ranks 4 --width 64 --short-doc 32 --rounds 1 --steps 2";
  for (const auto& [extra, says] : std::vector<std::pair<std::string, std::string>>{
           {" --tokens-per-rank 256 --pp 2 --layers 3", "--pp 2 must divide --layers 3"},
           {" --tokens-per-rank 256 --pp 4 --layers 2", "--pp 4 must divide --layers 2"},
           {" --tokens-per-rank 256 --pp 2 --layers 2 --micro-batches 1", "--micro-batches 1 is fewer than --pp 2"},
           {" --tokens-per-rank 256 --pp 3 --layers 3", "--pp 3 must divide the ranks (4: --ranks)"},
           {" --vocab 1048576 --tokens-per-rank 4096", "--tokens-per-rank 4096 times the model's widest layer"},
           {" --tokens-per-rank 256 --width 131072", "--width"},
       }) {
    const CliRun r = run(small + extra, 120);
    EXPECT_EQ(r.code, 2) << extra << ": " << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << extra << ": " << r.err;
    EXPECT_EQ(r.err.find("--mode"), std::string::npos) << extra << ": " << r.err;
    EXPECT_EQ(r.err.find("model_overrides"), std::string::npos) << extra << ": " << r.err;
  }
}

// bench train's defaults fit the machine class its figures are documented for (2 cores, 24 GiB)
// at up to 4 ranks: the memory estimate, read from its refusal under a 1 MiB limit, stays well
// below the machine (--pp 4 at 4 ranks needed about 35 GiB with 8192 tokens per micro-batch).
TEST_F(CliRulesTest, BenchTrainDefaultsFitA24GiBMachineAtUpToFourRanks) {
  for (const std::string extra : {"--ranks 2", "--ranks 4", "--ranks 2 --pp 2", "--ranks 4 --pp 2", "--ranks 4 --pp 4"}) {
    const CliRun r = run("bench train " + extra + " --max-memory 1M", 120);
    ASSERT_EQ(r.code, 2) << extra << ": " << r.err;
    const size_t at = r.err.find("needs about ");
    ASSERT_NE(at, std::string::npos) << extra << ": " << r.err;
    const std::string figure = r.err.substr(at + 12);
    const double value = std::stod(figure);
    const double gib = figure.find(" GiB") != std::string::npos ? value : figure.find(" MiB") != std::string::npos ? value / 1024 : 1e9;
    EXPECT_LT(gib, 12.0) << extra << ": " << r.err;
  }
}

}  // namespace
}  // namespace distca::testing
