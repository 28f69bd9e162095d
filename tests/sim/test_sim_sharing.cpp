// Processor sharing (SimOptions::host_ranks / host_cores, docs/simulation-model.md "Processor
// sharing"): four units on a host of two cores against the fluid model's closed form; balanced
// units keep the concurrent rates; an unshared host changes no bit; the fluid model's work
// equation on every compute span of 1F1B and cad pipelines; the host fields' refusals; and the
// attention forward : backward split taken from the profile.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "distca/core/specs.h"
#include "distca/cost/hardware_profile.h"
#include "distca/sim/simulator.h"
#include "support/hardware_profile_fixture.h"

namespace distca::sim {
namespace {

ModelSpec small_model(int64_t layers) { return testing::profile_test_model(layers); }

// support/hardware_profile_fixture.h's profile of `ranks` ranks on `cores` cores (GEMMs at
// 1e10 FLOP/s alone and 5e9 concurrent, attention on the grid {16, 32}, backward `bwd` x
// forward), its attention measured with every rank at once when there are several.
std::shared_ptr<const HardwareProfile> make_profile(int64_t ranks, int64_t cores, double bwd = 2.5) {
  HardwareProfile p = testing::test_hardware_profile(ranks, cores, bwd);
  p.attention_concurrent = ranks > 1;
  EXPECT_TRUE(p.validate("test").ok()) << p.validate("test").message();
  return std::make_shared<const HardwareProfile>(std::move(p));
}

SimOptions options(int64_t units, int64_t pp, int64_t layers, std::shared_ptr<const HardwareProfile> hp) {
  SimOptions o;
  o.model = small_model(layers);
  o.cluster.hw = hardware_preset("local-cpu").value();
  o.cluster.gpus = units;
  o.cluster.gpus_per_node = 1;
  o.cluster.pp = pp;
  o.strategy.kind = StrategyKind::kColocated;
  o.grad_sync = false;
  o.lm_head = false;
  o.hardware_profile = std::move(hp);
  return o;
}

// Four units whose documents never leave them (no exchange): unit 0 one of 32 tokens, unit 1
// 24 + 8, units 2 and 3 two of 16: three different amounts of work.
Batch four_units() {
  return Batch{4, 32,
               {{{0, 0, 32, 32}},
                {{1, 0, 24, 24}, {2, 0, 8, 8}},
                {{3, 0, 16, 16}, {4, 0, 16, 16}},
                {{5, 0, 16, 16}, {6, 0, 16, 16}}}};
}

Batch balanced(int64_t ranks) {
  Batch b{ranks, 32, {}};
  for (int64_t r = 0; r < ranks; ++r) b.per_rank.push_back({{r, 0, 32, 32}});
  return b;
}

TEST(SimSharing, FourUnitsOnTwoCoresFollowTheFluidClosedForm) {
  // The base: the same concurrent figures measured with every rank on a core of its own (4
  // ranks on 4 cores: nothing shared): each unit computes without a gap from 0 to its busy
  // seconds d_u.
  SimOptions o = options(4, 1, 2, make_profile(4, 2));
  const SimOptions ref = options(4, 1, 2, make_profile(4, 4));
  auto base = simulate(ref, {four_units()});
  ASSERT_TRUE(base.ok()) << base.status().message();
  EXPECT_EQ(base->sharing_passes, 0);
  std::vector<double> d;
  for (const UnitStats& u : base->per_unit) d.push_back(u.busy);
  ASSERT_GT(d[0], d[1]);
  ASSERT_GT(d[1], d[2]);
  ASSERT_EQ(d[2], d[3]);

  // By hand: the concurrent rates are half a core (4 ranks on 2 cores); with n units
  // computing each gets min(1, 2 / n) of a core, i.e. speed min(2, 4 / n) in base seconds per
  // second. Units 2 and 3 end at d2 (all four compute until then); units 0 and 1 then run at
  // speed 2: unit 1 ends at d2 + (d1 - d2) / 2; unit 0, alone after that, still at speed 2.
  // Colocated units meet at every layer's exchange; every layer holds the same shares of each
  // unit's work, so each layer is this timeline scaled down and the ends are the same. Those
  // meetings couple the units' intervals, so the fixed point takes more passes than units
  // that run apart did (2-4), and settles within its tolerance (kSharingTolerance, relative).
  const double end2 = d[2];
  const double end1 = d[2] + (d[1] - d[2]) / 2;
  const double end0 = d[2] + (d[0] - d[2]) / 2;
  auto r = simulate(o, {four_units()});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->sharing_converged);
  EXPECT_GE(r->sharing_passes, 2);
  EXPECT_LE(r->sharing_passes, 16);
  const double expect[4] = {end0, end1, end2, end2};
  const double tol = 1e-9 * end0;
  for (size_t u = 0; u < 4; ++u) EXPECT_NEAR(r->per_unit[u].busy, expect[u], tol) << "unit " << u;
  EXPECT_NEAR(r->iteration_seconds, end0, tol);
  EXPECT_NEAR(r->per_unit[2].comm_blocked, end0 - end2, tol);  // its waits at the exchanges

  // Four units on one core each (host_cores 4 with the 4-rank profile: its concurrent figures
  // were half a core, so every unit runs twice as fast as the base).
  SimOptions wide = o;
  wide.host_cores = 8;
  wide.host_ranks = 4;
  auto w = simulate(wide, {four_units()});
  ASSERT_TRUE(w.ok());
  EXPECT_NEAR(w->iteration_seconds, d[0] / 2, 1e-12 * d[0]);
}

TEST(SimSharing, TheCoresTheProfilesRunHadComeFromItsAloneFigures) {
  // Alone 4x as fast as at once, timed with sleeping waiters: the 4 ranks had 1 core of the 2
  // (other processes took the other). Speed min(1, 1 / n) / (1 / 4) = 4 / n over the base.
  HardwareProfile hp = *make_profile(4, 2);
  hp.alone_waiters_sleep = true;
  for (GemmRecord& g : hp.gemms) g.seconds_alone = g.seconds_concurrent / 4;
  auto prof = std::make_shared<const HardwareProfile>(hp);
  EXPECT_DOUBLE_EQ(profile_cores(*prof), 1.0);
  auto base = simulate(options(4, 1, 2, make_profile(4, 4)), {four_units()});
  ASSERT_TRUE(base.ok());
  std::vector<double> d;
  for (const UnitStats& u : base->per_unit) d.push_back(u.busy);
  // All four until d2; units 0 and 1 at speed 2 until unit 1 ends; unit 0 alone at speed 4.
  const double end1 = d[2] + (d[1] - d[2]) / 2;
  const double end0 = end1 + (d[0] - d[1]) / 4;
  auto r = simulate(options(4, 1, 2, prof), {four_units()});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->sharing_converged);
  EXPECT_NEAR(r->per_unit[1].busy, end1, 1e-9 * end0);
  EXPECT_NEAR(r->iteration_seconds, end0, 1e-9 * end0);
  // Spinning waiters (or a file without the field): machine.cores.
  hp.alone_waiters_sleep = false;
  EXPECT_DOUBLE_EQ(profile_cores(hp), 2.0);
}

TEST(SimSharing, BalancedUnitsKeepTheConcurrentRates) {
  // Every unit computes all the time: each has its share of the cores the profile measured.
  SimOptions o = options(4, 1, 2, make_profile(4, 2));
  const SimOptions ref = options(4, 1, 2, make_profile(4, 4));
  auto a = simulate(o, {balanced(4)});
  auto b = simulate(ref, {balanced(4)});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(a->sharing_converged);
  EXPECT_NEAR(a->iteration_seconds, b->iteration_seconds, 1e-12 * b->iteration_seconds);
}

TEST(SimSharing, AConcurrentFigureAboveTheFairShareIsSlowedToIt) {
  // 4 ranks on 2 cores whose timed concurrent calls ran only 1.6x slower than alone (sleeping
  // waiters): together they got 4 / 1.6 = 2.5 cores' worth in those short calls, more than
  // the 2 there are. Sustained, 4 busy units get 1/2 core each: twice the alone seconds, i.e.
  // 2 / 1.6 = 1.25x the concurrent ones. The host's cores stay machine.cores.
  HardwareProfile hp = *make_profile(4, 2);
  hp.alone_waiters_sleep = true;
  for (GemmRecord& g : hp.gemms) g.seconds_alone = g.seconds_concurrent / 1.6;
  auto prof = std::make_shared<const HardwareProfile>(hp);
  EXPECT_DOUBLE_EQ(profile_cores(*prof), 2.0);
  auto a = simulate(options(4, 1, 2, prof), {balanced(4)});
  auto b = simulate(options(4, 1, 2, make_profile(4, 4)), {balanced(4)});  // unshared: the concurrent rates
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(a->sharing_converged);
  for (size_t u = 0; u < a->per_unit.size(); ++u) {
    // Within the fixed point's stop rule (kSharingTolerance of the latest end per pass).
    EXPECT_NEAR(a->per_unit[u].busy, 1.25 * b->per_unit[u].busy, 1e-8 * b->per_unit[u].busy) << "unit " << u;
  }
}

TEST(SimSharing, ACappedProfileSharesNothing) {
  // 4 ranks on 2 cores, each capped at half a core (rank-cap.sh --cpus 0.5): alone and at once
  // alike (a rank alone gets no more than its quota), timed with sleeping waiters. Without the
  // quota the alone figures say the run had 4 x 1.1 cores, clamped to 2: 4 computing units
  // would run at half the concurrent rates. With it each rank is a device of half a core whose
  // rates do not depend on what the others do: every bit as on an unshared host.
  HardwareProfile hp = *make_profile(4, 2);
  hp.alone_waiters_sleep = true;
  for (GemmRecord& g : hp.gemms) g.seconds_alone = g.seconds_concurrent / 1.1;
  hp.cpu_quota = 0.5;
  ASSERT_TRUE(hp.validate("test").ok());
  auto capped = std::make_shared<const HardwareProfile>(hp);
  auto unshared = simulate(options(4, 1, 2, make_profile(4, 4)), {four_units()});
  auto a = simulate(options(4, 1, 2, capped), {four_units()});
  ASSERT_TRUE(a.ok() && unshared.ok());
  EXPECT_EQ(a->iteration_seconds, unshared->iteration_seconds);
  for (size_t u = 0; u < a->per_unit.size(); ++u) EXPECT_EQ(a->per_unit[u].busy, unshared->per_unit[u].busy);
  // The quota survives the file (and a file without it reads 0).
  const Result<HardwareProfile> back = hardware_profile_from_json(to_json(hp), "test");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->cpu_quota, 0.5);
  nlohmann::json bad = to_json(hp);
  bad["machine"]["cpu_quota"] = 3.0;  // above machine.cores
  EXPECT_FALSE(hardware_profile_from_json(bad, "test").ok());
  hp.cpu_quota = 0;  // the same figures read as an oversubscribed host
  EXPECT_FALSE(to_json(hp)["machine"].contains("cpu_quota"));
  auto b = simulate(options(4, 1, 2, std::make_shared<const HardwareProfile>(hp)), {four_units()});
  ASSERT_TRUE(b.ok());
  EXPECT_GT(b->iteration_seconds, 1.2 * unshared->iteration_seconds);
  // A simulated host of 8 such ranks on the 2 cores (quotas adding up to 4): shared again,
  // 8 busy units at 2 / (8 x 0.5) of their rate.
  SimOptions eight = options(8, 1, 2, capped);
  eight.host_ranks = 8;
  auto c = simulate(eight, {balanced(8)});
  auto ref = simulate(options(8, 1, 2, make_profile(8, 8)), {balanced(8)});
  ASSERT_TRUE(c.ok() && ref.ok());
  EXPECT_NEAR(c->per_unit[0].busy, 2 * ref->per_unit[0].busy, 1e-8 * ref->per_unit[0].busy);
}

TEST(SimSharing, AnUnsharedHostChangesNoBit) {
  // 2 ranks on 2 cores (every rank had its core): sharing is off, one plain run per engine.
  for (const char* strategy : {"colocated", "cad", "cad:single-stream", "wlb"}) {
    SimOptions o = options(4, 2, 2, make_profile(2, 2));
    o.strategy = parse_strategy(strategy).value();
    o.record_events = true;
    std::vector<Batch> mbs = {balanced(2), Batch{2, 32, {{{0, 0, 32, 32}}, {{1, 0, 16, 16}, {2, 0, 16, 16}}}}};
    auto r = simulate(o, mbs);
    ASSERT_TRUE(r.ok()) << strategy << ": " << r.status().message();
    EXPECT_EQ(r->sharing_passes, 0) << strategy;
    // The same with hosts of one unit on one core each: also unshared, the same bits.
    SimOptions one = o;
    one.host_ranks = 1;
    one.host_cores = 1;
    auto q = simulate(one, mbs);
    ASSERT_TRUE(q.ok());
    nlohmann::json a = to_json(*r), b = to_json(*q);
    a["plan"].erase("plan_seconds");
    b["plan"].erase("plan_seconds");
    EXPECT_EQ(a, b) << strategy;
    ASSERT_EQ(r->events.size(), q->events.size());
    for (size_t i = 0; i < r->events.size(); ++i) {
      EXPECT_EQ(r->events[i].start_us, q->events[i].start_us);
      EXPECT_EQ(r->events[i].end_us, q->events[i].end_us);
    }
  }
}

// The fluid model's work equation on every compute span: integrated over the span, the speed
// min(2, 4 / n) (n spans of the host open at that moment; 4 ranks on 2 cores) equals the span's
// base seconds, read from the same figures measured unshared (the spans in the same order).
void expect_work_equation(const SimResult& shared, const SimResult& base, int64_t units_per_host) {
  std::map<int64_t, std::vector<const TraceEvent*>> by_host, base_by_unit, by_unit;
  for (const TraceEvent& e : shared.events) {
    if (e.tid != 0) continue;
    by_host[e.pid / units_per_host].push_back(&e);
    by_unit[e.pid].push_back(&e);
  }
  for (const TraceEvent& e : base.events) {
    if (e.tid == 0) base_by_unit[e.pid].push_back(&e);
  }
  const double scale = shared.iteration_seconds * 1e6;
  for (const auto& [u, spans] : by_unit) {
    const auto& ref = base_by_unit[u];
    ASSERT_EQ(spans.size(), ref.size()) << "unit " << u;
    const auto& host = by_host[u / units_per_host];
    for (size_t k = 0; k < spans.size(); ++k) {
      const TraceEvent& e = *spans[k];
      std::vector<double> cuts = {e.start_us, e.end_us};
      for (const TraceEvent* h : host) {
        for (double c : {h->start_us, h->end_us}) {
          if (c > e.start_us && c < e.end_us) cuts.push_back(c);
        }
      }
      std::sort(cuts.begin(), cuts.end());
      double work = 0;
      for (size_t i = 0; i + 1 < cuts.size(); ++i) {
        const double mid = 0.5 * (cuts[i] + cuts[i + 1]);
        int64_t n = 0;
        for (const TraceEvent* h : host) n += h->start_us <= mid && mid < h->end_us;
        work += (cuts[i + 1] - cuts[i]) * std::min(2.0, 4.0 / static_cast<double>(n));
      }
      EXPECT_NEAR(work, ref[k]->end_us - ref[k]->start_us, 1e-6 * scale) << "unit " << u << " span " << k;
    }
  }
}

TEST(SimSharing, PipelinesSatisfyTheFluidWorkEquation) {
  // 1F1B over 4 stages (bubbles: fewer units compute in warm-up and drain) and cad (every
  // unit serves), 4 micro-batches with one long document in the first.
  std::vector<Batch> mbs = {Batch{1, 32, {{{0, 0, 32, 32}}}}, Batch{1, 32, {{{1, 0, 16, 16}, {2, 0, 16, 16}}}},
                            Batch{1, 32, {{{3, 0, 16, 16}, {4, 0, 16, 16}}}}, Batch{1, 32, {{{5, 0, 24, 24}, {6, 0, 8, 8}}}}};
  for (const char* strategy : {"colocated", "cad", "cad:single-stream"}) {
    SimOptions o = options(4, 4, 4, make_profile(4, 2));
    o.strategy = parse_strategy(strategy).value();
    o.record_events = true;
    SimOptions ref = o;
    ref.hardware_profile = make_profile(4, 4);  // the same figures, nothing shared
    auto r = simulate(o, mbs);
    auto b = simulate(ref, mbs);
    ASSERT_TRUE(r.ok() && b.ok()) << strategy;
    EXPECT_TRUE(r->sharing_converged) << strategy << ": " << r->sharing_passes << " passes";
    EXPECT_LT(r->iteration_seconds, b->iteration_seconds) << strategy;  // the bubbles run faster
    expect_work_equation(*r, *b, 4);
    // Deterministic: the same bits again.
    auto again = simulate(o, mbs);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->iteration_seconds, r->iteration_seconds) << strategy;
    EXPECT_EQ(again->sharing_passes, r->sharing_passes) << strategy;
  }
}

TEST(SimSharing, RefusesHostFieldsWithoutAProfileOrOutOfRange) {
  SimOptions o = options(4, 1, 2, nullptr);
  o.host_ranks = 4;
  auto r = simulate(o, {balanced(4)});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("host_ranks / host_cores need a hardware profile"), std::string::npos)
      << r.status().message();
  SimOptions neg = options(4, 1, 2, make_profile(4, 2));
  neg.host_cores = -1;
  auto n = simulate(neg, {balanced(4)});
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.status().message().find("host_cores must be in 0..65536"), std::string::npos) << n.status().message();
}

// Sum of the durations of events named `name`.
double span_seconds(const SimResult& r, const std::string& name) {
  double s = 0;
  for (const TraceEvent& e : r.events) {
    if (e.name == name) s += (e.end_us - e.start_us) * 1e-6;
  }
  return s;
}

TEST(SimSharing, AttentionSplitFollowsTheProfile) {
  // Backward 3x forward in the profile: forward attention is a quarter of the task's seconds.
  SimOptions o = options(2, 1, 2, make_profile(2, 2, 3.0));
  o.record_events = true;
  auto r = simulate(o, {balanced(2)});
  ASSERT_TRUE(r.ok()) << r.status().message();
  const double fwd = span_seconds(*r, "fwd attention"), bwd = span_seconds(*r, "bwd attention");
  EXPECT_NEAR(fwd / (fwd + bwd), 0.25, 1e-9);
  // An explicit attention table (not the profile's) keeps 1 : 2.5.
  const ProfiledCostModel table(make_profile(2, 2, 3.0)->attention_total());
  o.attention_table = &table;
  auto t = simulate(o, {balanced(2)});
  ASSERT_TRUE(t.ok()) << t.status().message();
  const double tf = span_seconds(*t, "fwd attention"), tb = span_seconds(*t, "bwd attention");
  EXPECT_NEAR(tf / (tf + tb), 1.0 / 3.5, 1e-9);
}

}  // namespace
}  // namespace distca::sim
