// The CPU a transfer takes from the compute beside it (a hardware profile's links.comm_cpu,
// Rates::comm_cpu_per_byte): cad pingpong's overlapped exchanges lengthen the compute they run
// beside, by at most the profile's seconds per byte times the bytes each unit moves; modes whose
// compute never runs beside a transfer with bytes (single-stream, signal) and profiles without
// the field (or with 0) predict what they did before, bit for bit.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "distca/core/specs.h"
#include "distca/cost/hardware_profile.h"
#include "distca/sim/simulator.h"
#include "distca/plan/link_model.h"
#include "support/hardware_profile_fixture.h"

namespace distca::sim {
namespace {

// Unit 0: one document of 256 tokens; unit 1: eight of 32. cad moves part of unit 0's
// attention (its quadratic share) to unit 1.
Batch skewed() {
  Batch b{2, 256, {{{0, 0, 256, 256}}, {}}};
  for (int64_t d = 0; d < 8; ++d) b.per_rank[1].push_back({1 + d, 0, 32, 32});
  return b;
}

SimOptions options(CadMode mode, double seconds_per_byte, bool with_field) {
  HardwareProfile p = testing::test_hardware_profile(2);
  if (with_field) p.comm_cpu = CommCpuProfile{seconds_per_byte, 1 << 20};
  EXPECT_TRUE(p.validate("test").ok()) << p.validate("test").message();
  SimOptions o;
  o.model = testing::profile_test_model(2);
  o.cluster.hw = hardware_preset("local-cpu").value();
  o.cluster.gpus = 2;
  o.cluster.gpus_per_node = 1;
  o.strategy.kind = StrategyKind::kCad;
  o.strategy.cad_mode = mode;
  o.grad_sync = false;
  o.hardware_profile = std::make_shared<const HardwareProfile>(std::move(p));
  return o;
}

// The result as JSON without the planner's wall clock (not a prediction).
std::string predicted(const SimOptions& o) {
  auto r = simulate(o, {skewed()});
  EXPECT_TRUE(r.ok()) << r.status().message();
  if (!r.ok()) return "";
  nlohmann::json j = to_json(*r);
  j["plan"].erase("plan_seconds");
  return j.dump();
}

TEST(SimCommCpu, AComputeIsChargedItsShareOfEachTransfersWindow) {
  // Two transfers in flight: [1, 3) taking 0.4 s of CPU, [2, 6) taking 0.8 s.
  std::vector<CpuDraw> draws = {{1, 3, 0.4}, {2, 6, 0.8}};
  // [0, 0.5): before both windows, nothing.
  EXPECT_DOUBLE_EQ(charge_transfer_cpu(draws, 0, 0.5), 0.5);
  // [1.5, 2.5): half of the first window (0.2) and an eighth of the second (0.1).
  EXPECT_DOUBLE_EQ(charge_transfer_cpu(draws, 1.5, 1.0), 1.0 + 0.2 + 0.1);
  ASSERT_EQ(draws.size(), 2u);
  // At 3.5 the first has ended (its last half-second fell in a wait: not charged) and is
  // dropped; [3.5, 10) holds the last 2.5 s of the second: 0.5 of its CPU.
  EXPECT_DOUBLE_EQ(charge_transfer_cpu(draws, 3.5, 6.5), 6.5 + 0.5);
  ASSERT_EQ(draws.size(), 1u);
  // Past every window: nothing, and nothing left.
  EXPECT_DOUBLE_EQ(charge_transfer_cpu(draws, 6, 1), 1.0);
  EXPECT_TRUE(draws.empty());
}

TEST(SimCommCpu, AbsentOrZeroChangesNoBit) {
  for (CadMode mode : {CadMode::kPingPong, CadMode::kSingleStream, CadMode::kSignal}) {
    EXPECT_EQ(predicted(options(mode, 0, false)), predicted(options(mode, 0, true)));
  }
}

TEST(SimCommCpu, OnlyComputeBesideATransferIsCharged) {
  // single-stream waits for every exchange before it computes again, and signal's exchanges
  // carry no bytes: no compute of theirs runs beside a transfer with bytes.
  for (CadMode mode : {CadMode::kSingleStream, CadMode::kSignal}) {
    EXPECT_EQ(predicted(options(mode, 0, false)), predicted(options(mode, 1e-7, true)));
  }
}

TEST(SimCommCpu, PingPongComputeGrowsByAtMostTheUnitsTransfersCpu) {
  constexpr double kPerByte = 1e-7;
  auto plain = simulate(options(CadMode::kPingPong, 0, false), {skewed()});
  auto taxed = simulate(options(CadMode::kPingPong, kPerByte, true), {skewed()});
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  ASSERT_TRUE(taxed.ok()) << taxed.status().message();
  ASSERT_EQ(plain->per_unit.size(), 2u);
  double grown = 0;
  for (size_t u = 0; u < 2; ++u) {
    const UnitStats& a = plain->per_unit[u];
    const UnitStats& b = taxed->per_unit[u];
    // The plan and its bytes are the same; only the compute beside the transfers grows.
    EXPECT_EQ(a.bytes_sent, b.bytes_sent);
    EXPECT_EQ(a.bytes_received, b.bytes_received);
    const double extra = (b.linear + b.attention) - (a.linear + a.attention);
    EXPECT_GE(extra, 0.0) << "unit " << u;
    EXPECT_LE(extra, kPerByte * (a.bytes_sent + a.bytes_received) * (1 + 1e-12)) << "unit " << u;
    grown += extra;
  }
  ASSERT_GT(plain->per_unit[0].bytes_sent, 0.0) << "the batch must move work for the check to mean anything";
  EXPECT_GT(grown, 0.0);
  EXPECT_GE(taxed->iteration_seconds, plain->iteration_seconds);
}

}  // namespace
}  // namespace distca::sim
