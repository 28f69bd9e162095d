// Flags are read by one strict rule for every subcommand (apps/distca/flags.h): decimal only,
// range-checked against the bound type, finite floats; unknown commands are named; every leaf
// takes --max-memory. Each refusal: exit 2, one stderr line naming the flag.
#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/cli_fixture.h"

namespace distca::testing {
namespace {

class CliNumbersTest : public CliFixture {
 protected:
  CliNumbersTest() : CliFixture("cli_numbers", "") {}

  // `args` exits 2 with one stderr line that contains every one of `parts`.
  void expect_bad_input(const std::string& args, const std::vector<std::string>& parts) const {
    const CliRun r = run(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
    EXPECT_EQ(r.err.rfind("distca: error: ", 0), 0u) << args << ": " << r.err;
    for (const std::string& p : parts) EXPECT_NE(r.err.find(p), std::string::npos) << args << ": " << r.err;
  }
};

TEST_F(CliNumbersTest, LeadingZeroIsNotOctal) {
  expect_bad_input("workload --ranks 010", {"--ranks", "decimal integer", "'010'"});
  // The same digits without the zero are read as ten, not as anything else.
  const CliRun r = run("workload --ranks 10 --tokens-per-rank 4096");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("ranks 10,"), std::string::npos) << r.out;
}

TEST_F(CliNumbersTest, PrefixesSignsAndSuffixesAreRefused) {
  for (const std::string v : {"0x10", "0b1", "0o7", "+4", "4k", "4.0", "1e3", "' 4'", "''", "--", "0-1"}) {
    expect_bad_input("workload --ranks " + v, {"--ranks"});
  }
}

TEST_F(CliNumbersTest, NegativeIntoUnsignedIsRefusedNotWrapped) {
  expect_bad_input("workload --seed -1", {"--seed", "-1 is out of range (at least 0)"});
}

TEST_F(CliNumbersTest, UnsignedOverflowIsRefusedNotSaturated) {
  expect_bad_input("workload --seed 18446744073709551616",
                   {"--seed", "18446744073709551616 is out of range (at most 18446744073709551615)"});
  // The largest value itself is a valid seed.
  const CliRun r = run("workload --seed 18446744073709551615 --ranks 2 --tokens-per-rank 4096");
  EXPECT_EQ(r.code, 0) << r.err;
}

TEST_F(CliNumbersTest, SignedOverflowEchoesTheValueGiven) {
  expect_bad_input("workload --ranks 9223372036854775808",
                   {"--ranks", "9223372036854775808 is out of range (at most 9223372036854775807)"});
  expect_bad_input("workload --ranks -9223372036854775809",
                   {"--ranks", "-9223372036854775809 is out of range (at least -9223372036854775808)"});
  expect_bad_input("train --steps 9223372036854775808", {"--steps", "out of range"});
}

TEST_F(CliNumbersTest, IntOverflowNamesTheIntRange) {
  // --heads is an int (with CLI11's PositiveNumber check, a double): 2^31 passes that check and
  // does not fit the int.
  expect_bad_input("bench attention --heads 2147483648", {"--heads", "2147483648 is out of range (at most 2147483647)"});
  expect_bad_input("profile --heads -2147483649", {"--heads"});
}

TEST_F(CliNumbersTest, IntegerFlagWithFloatValidatorStillWantsAnInteger) {
  // --heads carries CLI11's PositiveNumber (a double check): 1.5 and 0x20 are still refused
  // as integers, and 0 is refused as not positive, in plain words.
  expect_bad_input("bench attention --heads 1.5", {"--heads", "decimal integer"});
  expect_bad_input("bench attention --head-dims 64 0x20", {"--head-dims", "decimal integer"});
  const CliRun r = run("bench attention --heads 0");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--heads: must be positive (got 0)"), std::string::npos) << r.err;
}

TEST_F(CliNumbersTest, NonFiniteFloatsAreRefusedNamingTheFlag) {
  for (const std::string v : {"nan", "NaN", "inf", "-inf", "infinity", "0x1p3", "1e999", "-1e999", "1e", ".", "1.2.3"}) {
    expect_bad_input("profile --min-seconds " + v, {"--min-seconds"});
    expect_bad_input("plan --tolerance " + v, {"--tolerance"});
  }
}

TEST_F(CliNumbersTest, ScaleNanNamesScaleNotAnotherFlag) {
  // Parsing refuses it before the command looks at any of its (missing) files.
  expect_bad_input("attention --q q.npy --k k.npy --v v.npy --cu-seqlens-q cq.npy --cu-seqlens-k ck.npy "
                   "--out-dir out --scale nan",
                   {"--scale"});
  const CliRun r = run("attention --q q.npy --k k.npy --v v.npy --cu-seqlens-q cq.npy --cu-seqlens-k ck.npy "
                       "--out-dir out --scale nan");
  EXPECT_EQ(r.err.find("--cu-seqlens"), std::string::npos) << r.err;
}

TEST_F(CliNumbersTest, PlainFloatsAreAccepted) {
  for (const std::string v : {"0.25", ".25", "2.5e-1", "25E-2", "0"}) {
    const CliRun r = run("workload --ranks 2 --tokens-per-rank 4096 --long-prob " + v);
    EXPECT_EQ(r.code, 0) << v << ": " << r.err;
  }
}

TEST_F(CliNumbersTest, UnknownCommandIsNamed) {
  expect_bad_input("frobnicate", {"unknown command 'frobnicate'"});
  expect_bad_input("bench frob", {"unknown command 'bench frob'"});
  expect_bad_input("--version-typo", {});  // an unknown flag stays CLI11's one-line error
  expect_bad_input("", {"no command given"});
  expect_bad_input("bench", {"no command given"});
}

TEST_F(CliNumbersTest, EveryLeafTakesMaxMemory) {
  for (const std::string cmd : {"train", "workload", "plan", "simulate", "profile", "attention", "bench plan",
                                "bench attention", "bench step", "bench simulate"}) {
    expect_bad_input(cmd + " --max-memory 12Q", {"--max-memory", "'12Q'"});
    const CliRun help = run(cmd + " --help");
    EXPECT_EQ(help.code, 0) << cmd;
    EXPECT_NE(help.out.find("--max-memory SIZE"), std::string::npos) << cmd << ": " << help.out;
  }
}

TEST_F(CliNumbersTest, AllocationFailureIsOneLineNotAnAbort) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer reserves terabytes of shadow memory: ulimit -v stops it at start";
#endif
  // 300 MB of address space cannot hold 16 TB of query rows; --max-memory 1000T lets the run past
  // any estimate, so the allocation itself fails (std::bad_alloc): one line, exit 1.
  // OPENBLAS_NUM_THREADS=1: OpenBLAS's pthread build starts a worker per core when it loads,
  // and a worker that cannot get its 128 MB buffer retries for ever, so under this limit the
  // process could fail or hang at exit (joining it) depending on which thread allocated first
  // (the test failed once that way). distca calls OpenBLAS on one thread only.
  const std::string cmd = "ulimit -v 300000; OPENBLAS_NUM_THREADS=1 " + std::string(DISTCA_CLI) +
                          " profile --heads 60000 --head-dim 1024 --min-len 65536 --max-len 65536 --max-memory 1000T"
                          " >/dev/null 2>" +
                          (dir_ / "err").string();
  const int st = std::system(("/bin/sh -c '" + cmd + "'").c_str());
  ASSERT_TRUE(WIFEXITED(st));
  const std::string err = slurp(dir_ / "err");
  EXPECT_EQ(WEXITSTATUS(st), 1) << err;
  EXPECT_NE(err.find("out of memory"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_EQ(err.rfind("distca: error: ", 0), 0u) << err;
}

}  // namespace
}  // namespace distca::testing
