// The overlap modes of `distca train` under mpirun (issue 13): pingpong on the mpi backend gives
// the local backend's bits at -np 2 and -np 4, single-stream and colocated agree with it to float
// rounding, and the trace shows exchanges progressing while the rank computes the other
// nano-batch's linear layers (the mpi backend's progress thread; comm/mpi.h).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/shell_run.h"

namespace {

using distca::testing::jsonl_column;
using distca::testing::read_text;

std::filesystem::path tmp(const std::string& name) { return distca::testing::temp_path("distca_train_overlap_mpi_", name); }
int sh(const std::string& cmd) { return distca::testing::run_logged(cmd, tmp("log.txt")); }
std::string log_text() { return read_text(tmp("log.txt")); }

std::string mpirun(int np) {
  return std::string(DISTCA_MPIEXEC) + " --oversubscribe --allow-run-as-root -np " + std::to_string(np) + " ";
}

// Documents long enough that the split cuts some and cad moves pieces between ranks.
std::filesystem::path config_file() {
  const auto cfg = tmp("cfg.toml");
  std::ofstream(cfg) << "tokens_per_rank = 512\ndist = \"uniform:16:1024\"\nmax_doc_len = 0\nsteps = 20\nwarmup = 5\n"
                        "[model_overrides]\nn_layers = 2\nhidden = 64\nn_heads = 4\nn_kv_heads = 2\n"
                        "head_dim = 16\nffn = 128\nvocab = 64\n";
  return cfg;
}

TEST(TrainOverlapMpi, PingPongMatchesLocalBitwiseAndOtherModesWithinRounding) {
  const std::string cli = DISTCA_CLI;
  const std::string base = " train --config " + config_file().string() + " --metrics ";
  for (int np : {2, 4}) {
    const std::string n = std::to_string(np);
    const auto local = tmp("local" + n + ".jsonl"), pp = tmp("pp" + n + ".jsonl"), ss = tmp("ss" + n + ".jsonl"),
               colo = tmp("colo" + n + ".jsonl");
    ASSERT_EQ(sh(cli + base + local.string() + " --ranks " + n), 0) << log_text();
    ASSERT_EQ(sh(mpirun(np) + cli + base + pp.string() + " --backend mpi --overlap pingpong"), 0) << log_text();
    ASSERT_EQ(sh(mpirun(np) + cli + base + ss.string() + " --backend mpi --overlap single-stream"), 0) << log_text();
    ASSERT_EQ(sh(mpirun(np) + cli + base + colo.string() + " --backend mpi --mode colocated"), 0) << log_text();
    const auto want = jsonl_column(local, "loss");
    ASSERT_EQ(want.size(), 20u);
    EXPECT_EQ(jsonl_column(pp, "loss"), want) << "-np " << np;
    for (const auto& path : {ss, colo}) {
      const auto got = jsonl_column(path, "loss");
      ASSERT_EQ(got.size(), want.size()) << path;
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_LT(std::abs(got[i] - want[i]) / want[i], 1e-6) << path << " step " << i;
      }
    }
  }
}

struct Span {
  std::string name;
  double start = 0, end = 0;
};

// Rank r's events of the traced step, by rank.
std::map<int64_t, std::vector<Span>> read_trace(const std::filesystem::path& path) {
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in);
  std::map<int64_t, std::vector<Span>> out;
  for (const auto& e : j.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    const double ts = e.at("ts").get<double>();
    out[e.at("tid").get<int64_t>()].push_back({e.at("name").get<std::string>(), ts, ts + e.at("dur").get<double>()});
  }
  return out;
}

// On every rank, some transfer of one nano-batch (as the progress thread saw it: posted, then
// completed) finishes while the rank is inside the other nano-batch's linear work, which it
// entered after posting: the bytes moved while the rank computed.
TEST(TrainOverlapMpi, TraceShowsExchangesCompletingDuringTheOtherNanoBatchsLinearWork) {
  const auto cfg = tmp("wide.toml");
  std::ofstream(cfg) << "tokens_per_rank = 2048\ndist = \"uniform:256:4096\"\nmax_doc_len = 0\nsteps = 2\nwarmup = 1\n"
                        "[model_overrides]\nn_layers = 2\nhidden = 256\nn_heads = 8\nn_kv_heads = 4\n"
                        "head_dim = 32\nffn = 768\nvocab = 256\n";
  const auto trace = tmp("trace.json");
  std::filesystem::remove(trace);
  ASSERT_EQ(sh(mpirun(2) + DISTCA_CLI + " train --backend mpi --config " + cfg.string() + " --trace " + trace.string()), 0)
      << log_text();
  const auto ranks = read_trace(trace);
  ASSERT_EQ(ranks.size(), 2u);
  for (const auto& [rank, spans] : ranks) {
    int hidden = 0, transfers = 0;
    for (const Span& t : spans) {
      if (!t.name.ends_with(" transfer")) continue;
      ++transfers;
      const std::string nano = t.name.substr(0, 4), other = nano == "ping" ? "pong" : "ping";
      for (const Span& l : spans) {
        if (!l.name.starts_with(other + " linear")) continue;
        if (t.start <= l.start && t.end > l.start && t.end < l.end) {
          ++hidden;
          break;
        }
      }
    }
    EXPECT_GT(transfers, 0) << "rank " << rank << ": no labelled transfers in the trace";
    EXPECT_GT(hidden, 0) << "rank " << rank << ": no transfer completed during the other nano-batch's linear work";
    RecordProperty("rank" + std::to_string(rank) + "_hidden_transfers", hidden);
  }
}

}  // namespace
