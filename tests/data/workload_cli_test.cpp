// `distca workload` end to end: every bad input is refused with exit 2, nothing on stdout and
// exactly one stderr line naming the flag; a good run's JSON agrees with brute-force counting
// on the batch it prints, and that batch reads back through --batch.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "distca/core/specs.h"
#include "distca/cost/analytic.h"

namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("distca_cli_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct CliRun {
  int code = -1;
  std::string out, err;
};

// `timeout_s` > 0 runs it under `timeout`: a blocked read ends with exit 124 instead of
// hanging the suite.
CliRun run_cli(const std::string& args, int timeout_s = 0) {
  const std::string out = temp_path("stdout"), err = temp_path("stderr");
  const std::string prefix = timeout_s > 0 ? "timeout " + std::to_string(timeout_s) + " " : "";
  const std::string cmd = prefix + std::string(DISTCA_CLI) + " workload " + args + " >" + out + " 2>" + err;
  const int status = std::system(cmd.c_str());
  CliRun r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  std::filesystem::remove(out);
  std::filesystem::remove(err);
  return r;
}

void expect_refused(const std::string& args, const std::string& flag) {
  const CliRun r = run_cli(args);
  EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
  EXPECT_TRUE(r.out.empty()) << args << ": stdout not empty";
  ASSERT_FALSE(r.err.empty()) << args;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << args << ": not exactly one line: " << r.err;
  EXPECT_NE(r.err.find(flag), std::string::npos) << args << ": does not name " << flag << ": " << r.err;
}

TEST(WorkloadCli, BadInputIsRefusedInOneLine) {
  const std::string bad_lengths = temp_path("bad_lengths.txt");
  std::ofstream(bad_lengths) << "100\n200\n300\n400\n500\n600\n-7\n";
  const std::string bad_json = temp_path("bad_lengths.json");
  std::ofstream(bad_json) << "[100, 200";
  const std::string overfilled = temp_path("overfilled.json");
  std::ofstream(overfilled) << R"({"ranks": 1, "tokens_per_rank": 16,
      "per_rank": [[{"doc": 0, "offset": 0, "len": 32, "doc_len": 32}]]})";
  const std::string gap = temp_path("gap.json");
  std::ofstream(gap) << R"({"ranks": 2, "tokens_per_rank": 64,
      "per_rank": [[{"doc": 0, "offset": 0, "len": 16, "doc_len": 64}],
                   [{"doc": 0, "offset": 32, "len": 32, "doc_len": 64}]]})";

  expect_refused("--dist foo", "--dist");
  expect_refused("--dist fixed:0", "--dist");
  expect_refused("--dist fixed:-16", "--dist");
  expect_refused("--dist uniform:9:3", "--dist");
  expect_refused("--dist uniform:abc", "--dist");
  expect_refused("--dist file:" + temp_path("does_not_exist.json"), "--dist file:");
  expect_refused("--dist file:" + bad_lengths, "line 7");
  expect_refused("--dist file:" + bad_json, "--dist file:");
  expect_refused("--ranks 0", "--ranks");
  expect_refused("--ranks -4", "--ranks");
  expect_refused("--ranks many", "--ranks");
  expect_refused("--tokens-per-rank 0", "--tokens-per-rank");
  expect_refused("--tokens-per-rank -1024", "--tokens-per-rank");
  expect_refused("--tokens-per-rank 1000", "--tokens-per-rank");
  // More ranks than tokens: 64 ranks cannot share 8-token slots (a rank holds whole 16-token
  // blocks), and 2^20 ranks of 2^30 tokens exceed the batch limit.
  expect_refused("--ranks 64 --tokens-per-rank 8", "--tokens-per-rank");
  expect_refused("--ranks 1048576 --tokens-per-rank 1073741824", "--ranks");
  expect_refused("--max-doc-len 15", "--max-doc-len");
  expect_refused("--max-doc-len -1", "--max-doc-len");
  expect_refused("--batches 0", "--batches");
  expect_refused("--long-prob 1.5", "--long-prob");
  expect_refused("--layout diagonal", "--layout");
  expect_refused("--model gpt-5", "--model");
  expect_refused("--full", "--full");
  expect_refused("--batch " + temp_path("no_batch.json"), "--batch");
  expect_refused("--batch " + overfilled, "--batch");
  expect_refused("--batch " + gap, "--batch");
  expect_refused("--batch " + bad_json, "--batch");
  expect_refused("--batch " + overfilled + " --ranks 4", "--batch");
  expect_refused("--no-such-flag", "--no-such-flag");
  for (const auto& p : {bad_lengths, bad_json, overfilled, gap}) std::filesystem::remove(p);
}

// Sizes that cannot fit are refused from the flags before anything is drawn, naming them:
// 2^24 ranks of 64K tokens (16 batches: over a TiB of batches), and --full's JSON of every
// piece of 16-token documents.
TEST(WorkloadCli, RefusesWhatCannotFitBeforeDrawing) {
  expect_refused("--ranks 16777216 --tokens-per-rank 65536 --batches 16", "--ranks 16777216 --tokens-per-rank 65536");
  expect_refused("--ranks 65536 --tokens-per-rank 65536 --dist fixed:16 --json --full", "--full");
  const CliRun r = run_cli("--ranks 16777216 --tokens-per-rank 65536 --batches 16");
  EXPECT_NE(r.err.find("needs about"), std::string::npos) << r.err;
}

// Inputs that are not regular files, as --batch and as a length file: a FIFO without a writer
// (would block forever; `timeout` turns a hang into exit 124), /dev/zero (would be read without
// end) and a directory (says so, not "not valid JSON").
TEST(WorkloadCli, NonRegularInputsAreRefused) {
  const std::string fifo = temp_path("fifo");
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string dir = temp_path("a_dir");
  std::filesystem::create_directories(dir);
  for (const std::string& flag : {std::string("--batch "), std::string("--dist file:")}) {
    for (const std::string& path : {fifo, std::string("/dev/zero"), dir}) {
      const CliRun r = run_cli(flag + path, 60);
      EXPECT_EQ(r.code, 2) << flag << path << ": " << r.err;
      EXPECT_NE(r.err.find(flag.substr(0, flag.size() - 1)), std::string::npos) << r.err;
      EXPECT_EQ(r.err.find("not valid JSON"), std::string::npos) << r.err;
      EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
    }
    EXPECT_NE(run_cli(flag + dir, 60).err.find("directory"), std::string::npos);
  }
  std::filesystem::remove(fifo);
  std::filesystem::remove_all(dir);
}

// Numbers a length file or a batch file cannot hold, each refused in one line naming the file
// and the element or field: out of double range, beyond int64, not an integer, negative.
TEST(WorkloadCli, NumbersOutOfRangeAreRefused) {
  const std::string f = temp_path("numbers.json");
  const std::vector<std::pair<std::string, std::string>> lengths = {
      {"[16, 32, 1e999]", "field [2]"},
      {"[16, 9223372036854775808]", "element 1"},
      {"[16, 18446744073709551616]", "element 1"},
      {"[16, 2.5]", "element 1"},
      {"[16, -16]", "element 1"},
  };
  for (const auto& [text, expect] : lengths) {
    std::ofstream(f) << text;
    const CliRun r = run_cli("--dist file:" + f);
    EXPECT_EQ(r.code, 2) << text << ": " << r.err;
    EXPECT_NE(r.err.find(f), std::string::npos) << text << ": " << r.err;
    EXPECT_NE(r.err.find(expect), std::string::npos) << text << ": " << r.err;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
  }
  const std::string head = R"({"ranks": 1, "tokens_per_rank": 16, "per_rank": [[{"doc": 0, "offset": 0, "len": 16, "doc_len": )";
  const std::vector<std::pair<std::string, std::string>> fields = {
      {"1e999", "per_rank[0][0].doc_len"},
      {"9223372036854775808", "'doc_len' is beyond int64"},
      {"16.5", "'doc_len' must be an integer"},
      {"-16", "'doc_len' must be positive"},
  };
  for (const auto& [value, expect] : fields) {
    std::ofstream(f) << head << value << "}]]}";
    const CliRun r = run_cli("--batch " + f);
    EXPECT_EQ(r.code, 2) << value << ": " << r.err;
    EXPECT_NE(r.err.find(f), std::string::npos) << value << ": " << r.err;
    EXPECT_NE(r.err.find(expect), std::string::npos) << value << ": " << r.err;
  }
  // A field out of range in a `batches` list names its position in the list.
  std::ofstream(f) << R"({"batches": [{"batch": {"ranks": 1e999}}]})";
  EXPECT_NE(run_cli("--batch " + f).err.find("batches[0].batch.ranks"), std::string::npos);
  std::filesystem::remove(f);
}

// Brute-force attention pairs of a piece: query positions [offset, offset + len) over keys
// [0, doc_len) with key <= query.
int64_t brute_pairs(int64_t offset, int64_t len, int64_t doc_len) {
  int64_t n = 0;
  for (int64_t q = offset; q < offset + len; ++q) {
    for (int64_t k = 0; k < doc_len; ++k) n += k <= q;
  }
  return n;
}

void check_summary(const nlohmann::json& s, const nlohmann::json& batch, const distca::ModelSpec& m) {
  ASSERT_EQ(s["ranks"], batch["ranks"]);
  ASSERT_EQ(s["tokens_per_rank"], batch["tokens_per_rank"]);
  std::map<int64_t, bool> all_docs;
  int64_t max_pairs = 0, sum_pairs = 0;
  for (size_t r = 0; r < batch["per_rank"].size(); ++r) {
    int64_t tokens = 0, pairs = 0;
    std::map<int64_t, bool> docs;
    for (const auto& p : batch["per_rank"][r]) {
      tokens += p["len"].get<int64_t>();
      pairs += brute_pairs(p["offset"], p["len"], p["doc_len"]);
      docs[p["doc"]] = all_docs[p["doc"]] = true;
    }
    const auto& row = s["per_rank"][r];
    EXPECT_EQ(row["tokens"].get<int64_t>(), tokens);
    EXPECT_EQ(row["documents"].get<int64_t>(), static_cast<int64_t>(docs.size()));
    EXPECT_EQ(row["attn_pairs"].get<int64_t>(), pairs);
    EXPECT_DOUBLE_EQ(row["attn_flops"].get<double>(), 4.0 * m.head_dim * m.n_heads * static_cast<double>(pairs));
    EXPECT_DOUBLE_EQ(row["linear_flops"].get<double>(),
                     distca::linear_forward_flops_per_token(m) * static_cast<double>(tokens));
    max_pairs = std::max(max_pairs, pairs);
    sum_pairs += pairs;
  }
  EXPECT_EQ(s["documents"].get<int64_t>(), static_cast<int64_t>(all_docs.size()));
  EXPECT_NEAR(s["attn_load_max_over_mean"].get<double>(),
              static_cast<double>(max_pairs) * static_cast<double>(batch["ranks"].get<int64_t>()) /
                  static_cast<double>(sum_pairs),
              1e-12);
}

TEST(WorkloadCli, JsonAgreesWithBruteForceAndBatchReadsBack) {
  const auto model = distca::model_preset("tiny");
  ASSERT_TRUE(model.ok());
  for (const char* layout : {"contiguous", "head-tail"}) {
    const std::string args =
        std::string("--dist uniform:1:300 --ranks 4 --tokens-per-rank 512 --seed 7 --model tiny --layout ") + layout;
    const CliRun full = run_cli(args + " --json --full");
    ASSERT_EQ(full.code, 0) << full.err;
    const auto j = nlohmann::json::parse(full.out);
    ASSERT_TRUE(j.contains("batch"));
    check_summary(j, j["batch"], *model);
    EXPECT_EQ(j["dist"], "uniform:1:300");
    EXPECT_EQ(j["layout"], layout);

    // The --full output (whole object) and the bare batch both read back to the same summary.
    const std::string whole = temp_path("whole.json"), bare = temp_path("bare.json");
    std::ofstream(whole) << full.out;
    std::ofstream(bare) << j["batch"].dump();
    for (const auto& path : {whole, bare}) {
      const CliRun back = run_cli("--batch " + path + " --model tiny --json");
      ASSERT_EQ(back.code, 0) << back.err;
      const auto k = nlohmann::json::parse(back.out);
      EXPECT_EQ(k["per_rank"], j["per_rank"]);
      EXPECT_EQ(k["attn_load_max_over_mean"], j["attn_load_max_over_mean"]);
    }
    std::filesystem::remove(whole);
    std::filesystem::remove(bare);
  }
}

TEST(WorkloadCli, SeveralBatchesAggregateAndReadBack) {
  const CliRun r = run_cli("--dist pretrain --ranks 2 --tokens-per-rank 4096 --batches 3 --json --full");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["batches"].size(), 3u);
  int64_t docs = 0;
  double ratio_max = 0, ratio_sum = 0;
  for (const auto& s : j["batches"]) {
    docs += s["documents"].get<int64_t>();
    ratio_max = std::max(ratio_max, s["attn_load_max_over_mean"].get<double>());
    ratio_sum += s["attn_load_max_over_mean"].get<double>();
  }
  EXPECT_EQ(j["documents"].get<int64_t>(), docs);
  EXPECT_DOUBLE_EQ(j["attn_load_max_over_mean_max"].get<double>(), ratio_max);
  EXPECT_NEAR(j["attn_load_max_over_mean"].get<double>(), ratio_sum / 3, 1e-12);
  const std::string path = temp_path("batches.json");
  std::ofstream(path) << r.out;
  const CliRun back = run_cli("--batch " + path + " --json");
  ASSERT_EQ(back.code, 0) << back.err;
  const auto k = nlohmann::json::parse(back.out);
  ASSERT_EQ(k["batches"].size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(k["batches"][i]["per_rank"], j["batches"][i]["per_rank"]);
  std::filesystem::remove(path);
}

TEST(WorkloadCli, TablePrintsOneRowPerRank) {
  const CliRun r = run_cli("--dist prolong --ranks 8 --tokens-per-rank 524288");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(r.err.empty());
  EXPECT_NE(r.out.find("attention imbalance"), std::string::npos) << r.out;
  int rows = 0;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) rows += line.find(" 524288 ") != std::string::npos;
  EXPECT_EQ(rows, 8) << r.out;
}

}  // namespace
