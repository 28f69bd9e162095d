// `mpirun -np 2 distca profile --hardware-out`: the links part of a hardware profile exists only
// under mpirun. The file must load with two ranks, both links and every message size, and the
// attention grid marked as measured concurrently; plain `profile` under mpirun is refused by
// rank 0 alone.
// No figure is checked (timing).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "distca/cost/hardware_profile.h"

namespace {

std::filesystem::path tmp(const std::string& name) {
  static const auto dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("distca_profile_mpi_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir / name;
}

int sh(const std::string& cmd) {
  const int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TEST(ProfileMpi, TwoRanksWriteLinksAndConcurrentFigures) {
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  const std::string mpirun = std::string(DISTCA_MPIEXEC) + " --oversubscribe --allow-run-as-root -np 2 ";
  const std::string out = tmp("hw.json").string();
  ASSERT_EQ(sh(mpirun + DISTCA_CLI + " profile --hardware-out " + out +
               " --width 32 --head-dim 8 --ffn 64 --vocab 16 --tokens 32 --min-len 16 --max-len 32 --repeats 1"
               " --min-seconds 0 --gemm-repeats 1 --link-repeats 5 2>" + tmp("err").string()),
            0);
  auto hp = distca::load_hardware_profile(out);
  ASSERT_TRUE(hp.ok()) << hp.status().message();
  EXPECT_EQ(hp->ranks, 2);
  EXPECT_TRUE(hp->attention_concurrent);
  ASSERT_TRUE(hp->all_to_all.has_value());
  ASSERT_TRUE(hp->p2p.has_value());
  ASSERT_TRUE(hp->elementwise.has_value());  // timed on both ranks at once and on rank 0 alone
  EXPECT_GT(hp->elementwise->layer_backward.concurrent, 0);
  EXPECT_GT(hp->elementwise->optimizer.alone, 0);
  for (const distca::LinkProfile* l : {&*hp->all_to_all, &*hp->p2p}) {
    ASSERT_EQ(l->points.size(), 6u);
    EXPECT_EQ(l->points.front().bytes, 64);
    EXPECT_EQ(l->points.back().bytes, 4 << 20);
  }
  // The TP collectives through the trainer's group communicator: 1, 16 rows per rank (the
  // 32 tokens over the pair) of 32 floats; 128 rows is past the profile's tokens.
  ASSERT_TRUE(hp->tp_collective.has_value());
  ASSERT_EQ(hp->tp_collective->points.size(), 2u);
  EXPECT_EQ(hp->tp_collective->points[0].bytes, 32 * 4);
  EXPECT_EQ(hp->tp_collective->points[1].bytes, 16 * 32 * 4);
  // The TP peers' wait, timed on a decoder layer's TP forward and backward at 8, 16 and 32 rows
  // (a quarter, a half and all of the tokens): at least two points of growing compute (the
  // reader checked they strictly increase), a slope in [0, 1] equal to the fit of its points.
  ASSERT_TRUE(hp->tp_wait.has_value());
  ASSERT_GE(hp->tp_wait->points.size(), 2u);
  EXPECT_GE(hp->tp_wait->seconds_per_compute_second, 0.0);
  EXPECT_EQ(hp->tp_wait->seconds_per_compute_second, distca::fit_tp_wait(hp->tp_wait->points).seconds_per_compute_second);
  // The CPU transfers take from compute beside them: a ring of 1 to 64 MiB per rank (half a
  // second at the p2p fit's rate), sent and received: twice that counted; a rate in [0, 1e-6].
  ASSERT_TRUE(hp->comm_cpu.has_value());
  EXPECT_GE(hp->comm_cpu->bytes, 2 << 20);
  EXPECT_LE(hp->comm_cpu->bytes, 2 * (64 << 20));
  EXPECT_GE(hp->comm_cpu->seconds_per_byte, 0.0);
  // Only rank 0 writes: no temporary file of either rank is left.
  for (const auto& e : std::filesystem::directory_iterator(tmp("").parent_path())) {
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  }
  // Plain profile (a cost table is one process's) is refused under mpirun: one line, exit 2.
  EXPECT_EQ(sh(mpirun + DISTCA_CLI + " profile --max-len 128 2>" + tmp("err2").string()), 2);
  std::ifstream in(tmp("err2"));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string err = ss.str();
  EXPECT_NE(err.find("distca: error: under mpirun, profile writes a hardware profile"), std::string::npos) << err;
  // One line from distca (rank 0 speaks; mpirun adds its own notice of the exit status).
  EXPECT_EQ(err.find("distca: error:"), err.rfind("distca: error:")) << err;
  std::filesystem::remove_all(tmp("").parent_path());
}

}  // namespace
