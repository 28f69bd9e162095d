// The hardware profile's reader (cost/hardware_profile.h): a round trip, every refusal naming
// the file and the field, and the link fit against its closed form.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "distca/cost/hardware_profile.h"
#include "support/hardware_profile_fixture.h"

namespace distca {
namespace {

// A valid profile of `ranks` ranks: GEMMs at 1e10 FLOP/s alone and 5e9 concurrent, attention
// on a 2 x 2 grid, links latency 1e-4 s and 1e9 B/s (points on the line).
HardwareProfile make_profile(int64_t ranks) {
  HardwareProfile p = testing::test_hardware_profile(ranks);
  p.cpu = "test cpu";
  if (ranks > 1) {
    LinkProfile l;
    l.latency_seconds = 1e-4;
    l.bytes_per_second = 1e9;
    l.points = {{64, 1e-4 + 64e-9}, {4096, 1e-4 + 4096e-9}};
    p.all_to_all = l;
    p.p2p = l;
    p.tp_collective = LinkProfile{5e-4, 2e9, {{1024, 5e-4 + 1024 / 2e9}, {1 << 20, 5e-4 + (1 << 20) / 2e9}}};
    p.tp_wait = TpWaitProfile{0.05, {{1e-3, 1e-4 + 0.05e-3}, {4e-3, 1e-4 + 0.2e-3}, {16e-3, 1e-4 + 0.8e-3}}};
    p.comm_cpu = CommCpuProfile{9e-9, 1 << 25};
    // The element-wise figures (optional): on the two-rank profile only, so the round trip
    // sees both a file with them and one without.
    ElementwiseProfile e;
    e.layer_forward = {1e-7, 2e-7};
    e.layer_backward = {3e-7, 4e-7};
    e.loss_forward = {5e-8, 6e-8};
    e.loss_backward = {7e-8, 8e-8};
    e.optimizer = {1e-9, 2e-9};
    p.elementwise = e;
  }
  return p;
}

TEST(HardwareProfile, RoundTripKeepsEveryField) {
  for (int64_t ranks : {1, 2}) {
    const HardwareProfile p = make_profile(ranks);
    ASSERT_TRUE(p.validate("x").ok()) << p.validate("x").message();
    auto q = hardware_profile_from_json(to_json(p), "p.json");
    ASSERT_TRUE(q.ok()) << q.status().message();
    EXPECT_EQ(to_json(*q), to_json(p));
    EXPECT_EQ(q->ranks, ranks);
    EXPECT_EQ(q->all_to_all.has_value(), ranks > 1);
    ASSERT_EQ(q->tp_collective.has_value(), ranks > 1);
    if (ranks > 1) {
      EXPECT_EQ(q->tp_collective->latency_seconds, 5e-4);
      EXPECT_EQ(q->tp_collective->bytes_per_second, 2e9);
      ASSERT_EQ(q->tp_collective->points.size(), 2u);
      EXPECT_EQ(q->tp_collective->points[1].bytes, 1 << 20);
    }
    ASSERT_EQ(q->tp_wait.has_value(), ranks > 1);
    if (ranks > 1) {
      EXPECT_EQ(q->tp_wait->seconds_per_compute_second, 0.05);
      ASSERT_EQ(q->tp_wait->points.size(), 3u);
      EXPECT_EQ(q->tp_wait->points[2].compute_seconds, 16e-3);
    }
    ASSERT_EQ(q->comm_cpu.has_value(), ranks > 1);
    if (ranks > 1) {
      EXPECT_EQ(q->comm_cpu->seconds_per_byte, 9e-9);
      EXPECT_EQ(q->comm_cpu->bytes, 1 << 25);
    }
    ASSERT_EQ(q->elementwise.has_value(), ranks > 1);
    if (ranks > 1) {
      EXPECT_EQ(q->elementwise->layer_backward.alone, 3e-7);
      EXPECT_EQ(q->elementwise->optimizer.concurrent, 2e-9);
      EXPECT_EQ(q->elementwise->loss_forward.get(true), 6e-8);
      EXPECT_EQ(q->elementwise->loss_forward.get(false), 5e-8);
    }
  }
}

TEST(HardwareProfile, ElementwiseIsOptional) {
  // A file written before the object (version 1 still) loads without it.
  nlohmann::json old = to_json(make_profile(2));
  ASSERT_TRUE(old.contains("elementwise"));
  EXPECT_TRUE(old["elementwise"].contains("optimizer_seconds_per_param"));
  old.erase("elementwise");
  auto q = hardware_profile_from_json(old, "p.json");
  ASSERT_TRUE(q.ok()) << q.status().message();
  EXPECT_FALSE(q->elementwise.has_value());
}

TEST(HardwareProfile, TpCollectiveIsOptional) {
  // A file written before the field (version 1 still) loads without it: the simulator then
  // prices TP collectives on links.all_to_all.
  nlohmann::json old = to_json(make_profile(2));
  ASSERT_TRUE(old["links"].contains("tp_collective"));
  old["links"].erase("tp_collective");
  old["links"].erase("tp_wait");  // written with it, so absent from those files too
  auto q = hardware_profile_from_json(old, "p.json");
  ASSERT_TRUE(q.ok()) << q.status().message();
  EXPECT_FALSE(q->tp_collective.has_value());
  // Checked like the other links, and only with ranks to group.
  nlohmann::json bad = to_json(make_profile(2));
  bad["links"]["tp_collective"]["latency_seconds"] = 2.0;
  auto b = hardware_profile_from_json(bad, "p.json");
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("links.tp_collective.latency_seconds must be in [0, 1]"), std::string::npos);
  HardwareProfile one = make_profile(1);
  one.tp_collective = make_profile(2).tp_collective;
  EXPECT_NE(one.validate("p").message().find("links.tp_collective needs machine.ranks >= 2"), std::string::npos);
}

// An optional links.<name> object: a file written before it (version 1 still) loads without
// it, and each bad value of one of its fields is refused with `message`.
struct BadField {
  const char* key;
  nlohmann::json value;
  const char* message;
};
void expect_optional_link_field(const char* name, std::initializer_list<BadField> cases) {
  nlohmann::json old = to_json(make_profile(2));
  ASSERT_TRUE(old["links"].contains(name)) << name;
  old["links"].erase(name);
  auto q = hardware_profile_from_json(old, "p.json");
  ASSERT_TRUE(q.ok()) << q.status().message();
  EXPECT_EQ(to_json(*q)["links"].contains(name), false) << name;
  for (const BadField& c : cases) {
    nlohmann::json bad = to_json(make_profile(2));
    bad["links"][name][c.key] = c.value;
    auto b = hardware_profile_from_json(bad, "p.json");
    ASSERT_FALSE(b.ok()) << c.message;
    EXPECT_NE(b.status().message().find(c.message), std::string::npos) << b.status().message();
  }
}

TEST(HardwareProfile, TpWaitIsOptionalAndChecked) {
  // Absent, the simulator charges no TP wait (Rates::tp_wait 0).
  expect_optional_link_field(
      "tp_wait",
      {{"seconds_per_compute_second", 1.5, "links.tp_wait.seconds_per_compute_second must be in [0, 1]"},
       {"seconds_per_compute_second", -0.1, "links.tp_wait.seconds_per_compute_second must be in [0, 1]"},
       {"seconds_per_compute_second", "x", "links.tp_wait.seconds_per_compute_second"},
       {"points", nlohmann::json::array({{{"compute_seconds", 1e-3}, {"seconds", 1e-4}}}),
        "links.tp_wait.points must hold 2 to 16 points"},
       {"points",
        nlohmann::json::array({{{"compute_seconds", 2e-3}, {"seconds", 1e-4}}, {{"compute_seconds", 1e-3}, {"seconds", 1e-4}}}),
        "links.tp_wait.points[1].compute_seconds must be larger than the previous point's"},
       {"points",
        nlohmann::json::array({{{"compute_seconds", 1e-3}, {"seconds", 0.0}}, {{"compute_seconds", 2e-3}, {"seconds", 1e-4}}}),
        "links.tp_wait.points[0].seconds must be a time"}});
  // Only beside the collective fit it adds to.
  HardwareProfile p = make_profile(2);
  p.tp_collective.reset();
  EXPECT_NE(p.validate("p").message().find("links.tp_wait needs links.tp_collective"), std::string::npos);
}

TEST(HardwareProfile, CommCpuIsOptionalAndChecked) {
  // Absent, the simulator and the planner charge transfers no CPU (Rates::comm_cpu_per_byte 0).
  expect_optional_link_field("comm_cpu", {{"seconds_per_byte", -1e-9, "links.comm_cpu.seconds_per_byte must be in [0, 1e-6]"},
                                          {"seconds_per_byte", 2e-6, "links.comm_cpu.seconds_per_byte must be in [0, 1e-6]"},
                                          {"seconds_per_byte", "x", "links.comm_cpu.seconds_per_byte"},
                                          {"bytes", 0, "links.comm_cpu.bytes positive"},
                                          {"bytes", 1.5, "links.comm_cpu.bytes"}});
  HardwareProfile one = make_profile(1);
  one.comm_cpu = CommCpuProfile{1e-9, 1024};
  EXPECT_NE(one.validate("p").message().find("links.comm_cpu needs machine.ranks >= 2"), std::string::npos);
}

TEST(HardwareProfile, TpWaitFitRecoversTheSlope) {
  // wait = 0.03 compute exactly: the slope comes back. Through the origin, by hand: (1 ms,
  // 0.05 ms) and (4 ms, 0.1 ms) give (0.05 + 0.4) / (1 + 16) 1e-3 = 0.45 / 17 (ordinary least
  // squares with an intercept would give 0.05 / 3). A wait above the compute is clamped to 1.
  std::vector<TpWaitPoint> pts;
  for (double c : {1e-3, 4e-3, 16e-3}) pts.push_back({c, 0.03 * c});
  EXPECT_NEAR(fit_tp_wait(pts).seconds_per_compute_second, 0.03, 1e-12);
  EXPECT_EQ(fit_tp_wait(pts).points.size(), 3u);
  EXPECT_NEAR(fit_tp_wait({{1e-3, 5e-5}, {4e-3, 1e-4}}).seconds_per_compute_second, 0.45 / 17, 1e-12);
  EXPECT_EQ(fit_tp_wait({{1e-3, 1e-3}, {2e-3, 5e-3}}).seconds_per_compute_second, 1.0);
}

TEST(HardwareProfile, AloneWaitersIsOptionalAndRoundTrips) {
  HardwareProfile p = make_profile(2);
  for (bool sleep : {false, true}) {
    p.alone_waiters_sleep = sleep;
    nlohmann::json j = to_json(p);
    EXPECT_EQ(j["machine"]["alone_waiters"], sleep ? "sleep" : "spin");
    auto q = hardware_profile_from_json(j, "p.json");
    ASSERT_TRUE(q.ok()) << q.status().message();
    EXPECT_EQ(q->alone_waiters_sleep, sleep);
  }
  // A file written before the field (version 1 still): the waiters spun.
  nlohmann::json old = to_json(p);
  old["machine"].erase("alone_waiters");
  auto q = hardware_profile_from_json(old, "p.json");
  ASSERT_TRUE(q.ok()) << q.status().message();
  EXPECT_FALSE(q->alone_waiters_sleep);
}

TEST(HardwareProfile, RatesAndTotalsFollowTheRecords) {
  const HardwareProfile p = make_profile(2);
  EXPECT_DOUBLE_EQ(p.gemm_rate("w2", GemmPass::kBackwardWeight, false), 1e10);
  EXPECT_DOUBLE_EQ(p.gemm_rate("lm_head", GemmPass::kForward, true), 5e9);
  // w2: (in, out) = (ffn, hidden); backward_weight is dw (out, in) = dy^T x: m = out, k = tokens.
  const GemmRecord& g = p.gemm("w2", GemmPass::kBackwardWeight);
  EXPECT_EQ(g.m, 64);
  EXPECT_EQ(g.n, 128);
  EXPECT_EQ(g.k, 32);
  const CostTable t = p.attention_total();
  EXPECT_DOUBLE_EQ(t.seconds[0][1], 2e-5 * 3.5);
  EXPECT_DOUBLE_EQ(p.attention_backward_ratio(), 2.5);
}

TEST(HardwareProfile, LinkFitRecoversAnExactLine) {
  // seconds = 2e-5 + (ranks - 1) bytes / 3e9 with 4 ranks: the fit gives back both figures.
  std::vector<LinkPoint> pts;
  for (int64_t b : {64, 1024, 65536, 1 << 20}) pts.push_back({b, 2e-5 + 3.0 * static_cast<double>(b) / 3e9});
  const LinkProfile l = fit_link(pts, 3.0);
  EXPECT_NEAR(l.latency_seconds, 2e-5, 1e-12);
  EXPECT_NEAR(l.bytes_per_second / 3e9, 1.0, 1e-9);
  EXPECT_EQ(l.points.size(), 4u);
}

TEST(HardwareProfile, LinkFitClampsANegativeLatency) {
  // The smallest point below the line the large sizes give (1 ns per byte exactly): latency 0.
  const std::vector<LinkPoint> pts = {{1000, 1e-7}, {1000000, 1e-3}, {2000000, 2e-3}};
  const LinkProfile l = fit_link(pts, 1.0);
  EXPECT_EQ(l.latency_seconds, 0.0);
  EXPECT_NEAR(l.bytes_per_second / 1e9, 1.0, 1e-9);
}

TEST(HardwareProfile, LinkFitTakesTheRateFromTheLargestSizes) {
  // A token bucket (the lab's tbf): up to 128 KiB passes at 1 GB/s, then 31.25 MB/s, after
  // 50 us per message. The profile's sizes: the rate is the bucket's, the latency the smallest
  // size's. A fit over every size weighted by relative error gives a rate several times too
  // high here (the old fit: 250 MB/s and more on such points).
  std::vector<LinkPoint> pts;
  const double burst_rate = 1e9, rate = 31.25e6, latency = 5e-5;
  for (int64_t b : {64, 1024, 16384, 262144, 1 << 20, 4 << 20}) {
    const double x = static_cast<double>(b);
    pts.push_back({b, latency + (b <= (128 << 10) ? x / burst_rate : x / rate)});
  }
  const LinkProfile l = fit_link(pts, 1.0);
  EXPECT_NEAR(l.bytes_per_second / rate, 1.0, 1e-9);
  EXPECT_NEAR(l.latency_seconds, latency + 64 / burst_rate - 64 / rate, 1e-12);
  // With the all-to-all's wire factor the rate is per wire byte.
  const LinkProfile a = fit_link(pts, 3.0);
  EXPECT_NEAR(a.bytes_per_second / (3 * rate), 1.0, 1e-9);
  // One point: no rate to fit (the largest), its time the latency.
  const LinkProfile one = fit_link({{4096, 1e-4}}, 1.0);
  EXPECT_EQ(one.bytes_per_second, kMaxLinkBandwidth);
  EXPECT_NEAR(one.latency_seconds, 1e-4 - 4096 / kMaxLinkBandwidth, 1e-15);
}

struct BadCase {
  const char* name;
  std::function<void(nlohmann::json&)> mutate;
  const char* expect;  // substring of the message (after "p.json: ")
};

TEST(HardwareProfile, RefusesBadFieldsNamingFileAndField) {
  const std::vector<BadCase> cases = {
      {"format", [](auto& j) { j["format"] = "distca-cost-table"; }, "format must be \"distca-hardware-profile\""},
      {"version", [](auto& j) { j["version"] = 2; }, "version must be 1"},
      {"version type", [](auto& j) { j["version"] = "1"; }, "version must be 1"},
      {"no machine", [](auto& j) { j.erase("machine"); }, "machine is missing"},
      {"cores type", [](auto& j) { j["machine"]["cores"] = "2"; }, "machine.cores must be an integer"},
      {"cores range", [](auto& j) { j["machine"]["cores"] = 0; }, "machine.cores must be in 1..65536"},
      {"ranks range", [](auto& j) { j["machine"]["ranks"] = 100000; }, "machine.ranks must be in 1..65536"},
      {"cpu type", [](auto& j) { j["machine"]["cpu"] = 3; }, "machine.cpu must be a string"},
      {"waiters", [](auto& j) { j["machine"]["alone_waiters"] = "nap"; }, "machine.alone_waiters must be \"sleep\" or \"spin\""},
      {"waiters type", [](auto& j) { j["machine"]["alone_waiters"] = true; }, "machine.alone_waiters must be a string"},
      {"hidden", [](auto& j) { j["model"]["hidden"] = -1; }, "model.hidden must be in 1..2^24"},
      {"heads", [](auto& j) { j["model"]["n_kv_heads"] = 3; }, "model.n_kv_heads must divide model.n_heads"},
      {"gemm type", [](auto& j) { j["gemm"] = 1; }, "gemm must be an array"},
      {"gemm count", [](auto& j) { j["gemm"].erase(0); }, "gemm must hold 24 products"},
      {"gemm m type", [](auto& j) { j["gemm"][3]["m"] = 1.5; }, "gemm[3].m must be an integer"},
      {"gemm shape", [](auto& j) { j["gemm"][3]["m"] = 33; }, "gemm[3]: wk forward must be (m, n, k) = (32, 32, 64)"},
      {"gemm layer", [](auto& j) { j["gemm"][0]["layer"] = "wx"; }, "gemm[0].layer 'wx' is not one of"},
      {"gemm pass", [](auto& j) { j["gemm"][0]["pass"] = "sideways"; }, "gemm[0].pass must be forward"},
      {"gemm twice", [](auto& j) { j["gemm"][1] = j["gemm"][0]; }, "gemm[1]: wq forward appears twice"},
      {"gemm seconds", [](auto& j) { j["gemm"][2]["seconds_alone"] = 0; }, "gemm[2].seconds_alone must be a time"},
      {"gemm null", [](auto& j) { j["gemm"][2]["seconds_concurrent"] = nullptr; }, "gemm[2].seconds_concurrent must be a number"},
      {"gemm huge", [](auto& j) { j["gemm"][2]["seconds_concurrent"] = 1e300; }, "gemm[2].seconds_concurrent must be a time"},
      {"attention missing", [](auto& j) { j.erase("attention"); }, "attention is missing"},
      {"attention concurrent", [](auto& j) { j["attention"]["concurrent"] = 1; }, "attention.concurrent must be true or false"},
      {"attention rows", [](auto& j) { j["attention"]["forward_seconds"].erase(0); }, "attention.forward_seconds must have one row per q_lens entry"},
      {"attention cell", [](auto& j) { j["attention"]["backward_seconds"][0][1] = "x"; }, "attention.backward_seconds[0][1] must be a number"},
      {"attention zero", [](auto& j) { j["attention"]["forward_seconds"][1][1] = 0; }, "attention.forward_seconds: seconds[1][1] must be a time"},
      {"attention lens", [](auto& j) { j["attention"]["q_lens"] = {32, 16}; }, "q_lens must be strictly increasing"},
      {"links missing", [](auto& j) { j.erase("links"); }, "links.all_to_all and links.p2p are required"},
      {"links type", [](auto& j) { j["links"] = 5; }, "links must be an object"},
      {"latency", [](auto& j) { j["links"]["p2p"]["latency_seconds"] = 2.0; }, "links.p2p.latency_seconds must be in [0, 1]"},
      {"bandwidth", [](auto& j) { j["links"]["all_to_all"]["bytes_per_second"] = 0; }, "links.all_to_all.bytes_per_second must be in [1, 1e15]"},
      {"points order", [](auto& j) { j["links"]["p2p"]["points"][1]["bytes"] = 64; }, "links.p2p.points[1].bytes must be larger"},
      {"points seconds", [](auto& j) { j["links"]["p2p"]["points"][0]["seconds"] = -1; }, "links.p2p.points[0].seconds must be a time"},
      {"points empty", [](auto& j) { j["links"]["p2p"]["points"] = nlohmann::json::array(); }, "links.p2p.points must hold 1 to 64 points"},
      {"ew type", [](auto& j) { j["elementwise"] = 1; }, "elementwise must be an object"},
      {"ew missing", [](auto& j) { j["elementwise"].erase("loss_backward_seconds_per_token"); },
       "elementwise.loss_backward_seconds_per_token is missing"},
      {"ew term type", [](auto& j) { j["elementwise"]["layer_forward_seconds_per_token"] = 1e-7; },
       "elementwise.layer_forward_seconds_per_token must be an object"},
      {"ew alone", [](auto& j) { j["elementwise"]["layer_backward_seconds_per_token"].erase("alone"); },
       "elementwise.layer_backward_seconds_per_token.alone is missing"},
      {"ew number", [](auto& j) { j["elementwise"]["optimizer_seconds_per_param"]["concurrent"] = "x"; },
       "elementwise.optimizer_seconds_per_param.concurrent must be a number"},
      {"ew negative", [](auto& j) { j["elementwise"]["loss_forward_seconds_per_token"]["alone"] = -1e-9; },
       "elementwise.loss_forward_seconds_per_token.alone must be in [0, 1] seconds"},
      {"ew huge", [](auto& j) { j["elementwise"]["optimizer_seconds_per_param"]["concurrent"] = 2.0; },
       "elementwise.optimizer_seconds_per_param.concurrent must be in [0, 1] seconds"},
      {"one rank links", [](auto& j) { j["machine"]["ranks"] = 1; }, "links must be absent when machine.ranks is 1"},
  };
  const nlohmann::json good = to_json(make_profile(2));
  for (const BadCase& c : cases) {
    nlohmann::json j = good;
    c.mutate(j);
    auto r = hardware_profile_from_json(j, "p.json");
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.name;
    const std::string& m = r.status().message();
    EXPECT_EQ(m.rfind("p.json: ", 0), 0u) << c.name << ": " << m;
    EXPECT_NE(m.find(c.expect), std::string::npos) << c.name << ": " << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << c.name;
  }
  EXPECT_FALSE(hardware_profile_from_json(nlohmann::json::array(), "p.json").ok());
}

}  // namespace
}  // namespace distca
