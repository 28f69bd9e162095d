// Ranks started with different settings (mpirun's MPMD form, -np 1 A : -np 1 B) must all stop
// before their first exchange with one line naming the setting, exit 2: no crash from
// mismatched message sizes, no hang until --mpi-timeout from mismatched loop counts
// (comm/launch.h, agree_on_settings).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "support/shell_run.h"

namespace {

using distca::testing::read_text;
using distca::testing::run_logged;
using distca::testing::temp_path;

struct Outcome {
  int code = -1;
  std::string log;
};

// mpirun -np 1 distca A : -np 1 distca B, bounded by `timeout` so that a hang fails the test.
Outcome mpmd(const std::string& name, const std::string& a, const std::string& b) {
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  setenv("OMP_NUM_THREADS", "1", 1);
  const std::string cli = DISTCA_CLI;
  const std::string cmd = "timeout -k 5 120 " + std::string(DISTCA_MPIEXEC) + " --oversubscribe --allow-run-as-root -np 1 " +
                          cli + " " + a + " : -np 1 " + cli + " " + b;
  const auto log = temp_path("distca_rank_agreement_", name + ".log");
  Outcome o;
  o.code = run_logged(cmd, log);
  o.log = read_text(log);
  return o;
}

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

void expect_refused(const Outcome& o, const std::string& line) {
  EXPECT_EQ(o.code, 2) << o.log;
  EXPECT_EQ(count(o.log, "distca: error: " + line + "\n"), 1) << o.log;
  EXPECT_EQ(count(o.log, "distca: error:"), 1) << o.log;  // one line, from rank 0 alone
  EXPECT_EQ(o.log.find("failed:"), std::string::npos) << o.log;  // no rank failure, no timeout
  for (const char* crash : {"exited on signal", "Segmentation", "double free", "munmap_chunk"}) {
    EXPECT_EQ(o.log.find(crash), std::string::npos) << crash << "\n" << o.log;
  }
}

const std::string kTrain = "train --backend mpi --mpi-timeout 30 --steps 3";
const std::string kBench =
    "bench train --backend mpi --mpi-timeout 30 --tokens-per-rank 256 --layers 1 --short-doc 32 --rounds 1 --steps 2";

TEST(RankAgreement, DifferentOverlapIsRefusedOnEveryRank) {
  expect_refused(mpmd("overlap", kTrain + " --overlap signal", kTrain),
                 "ranks disagree on --overlap: rank 0 has 'signal', rank 1 has 'pingpong'");
}

TEST(RankAgreement, DifferentWidthInBenchTrainIsRefusedOnEveryRank) {
  expect_refused(mpmd("width", kBench + " --width 64", kBench + " --width 128"),
                 "ranks disagree on --width: rank 0 has '64', rank 1 has '128'");
}

TEST(RankAgreement, DifferentStepsAreRefusedInsteadOfHanging) {
  expect_refused(mpmd("steps", kTrain, "train --backend mpi --mpi-timeout 30 --steps 4"),
                 "ranks disagree on --steps: rank 0 has '3', rank 1 has '4'");
}

TEST(RankAgreement, DifferentCommandsAreRefused) {
  expect_refused(mpmd("command", kTrain, kBench + " --width 64"),
                 "ranks disagree on command: rank 0 has 'train', rank 1 has 'bench train'");
}

}  // namespace
