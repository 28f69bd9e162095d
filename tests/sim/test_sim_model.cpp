// The simulator's inputs and schedules: strategy parsing round trip, cluster and option
// validation (bad inputs refused with the flag named), the pipeline schedules checked against
// brute-force invariants (every op once, dependencies respected, tick counts, bubble slots),
// and the parameter count against the published Llama-3-8B size; the trace writer the
// simulator shares with the runtime (core/trace.h) against a whole-document JSON reference.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "distca/core/specs.h"
#include "distca/plan/pipeline_schedule.h"
#include "distca/sim/simulator.h"

namespace distca::sim {
namespace {

TEST(Strategy, ParsesEveryFormAndRoundTrips) {
  for (const char* text : {"colocated", "wlb", "wlb:4", "percp:2", "cad", "cad:single-stream", "cad:signal"}) {
    auto s = parse_strategy(text);
    ASSERT_TRUE(s.ok()) << text << ": " << s.status().to_string();
    EXPECT_EQ(s->name(), text);
    auto again = parse_strategy(s->name());
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, *s);
  }
  auto pp = parse_strategy("cad:pingpong");
  ASSERT_TRUE(pp.ok());
  EXPECT_EQ(pp->cad_mode, CadMode::kPingPong);
  EXPECT_EQ(pp->name(), "cad");
  EXPECT_EQ(parse_strategy("percp:8")->cp_degree, 8);
  EXPECT_EQ(parse_strategy("wlb")->cp_degree, 0);
}

TEST(Strategy, RefusesBadText) {
  for (const char* text : {"", "cad:fast", "percp", "percp:0", "percp:-2", "percp:x", "wlb:", "colocated:2", "CAD"}) {
    auto s = parse_strategy(text);
    ASSERT_FALSE(s.ok()) << text;
    EXPECT_NE(s.status().message().find("--strategy"), std::string::npos) << s.status().message();
    EXPECT_EQ(s.status().message().find('\n'), std::string::npos);
  }
}

SimOptions base_options(int64_t gpus, int64_t pp = 1) {
  SimOptions o;
  o.model = model_preset("llama-8b").value();
  o.cluster.hw = hardware_preset("h200").value();
  o.cluster.gpus = gpus;
  o.cluster.gpus_per_node = 8;
  o.cluster.pp = pp;
  return o;
}

TEST(Options, RefusesBadInputNamingTheFlag) {
  struct Case {
    const char* what;
    std::function<void(SimOptions&)> edit;
    const char* flag;
  };
  const std::vector<Case> cases = {
      {"gpus not a multiple of the node", [](SimOptions& o) { o.cluster.gpus = 60; }, "--gpus"},
      {"no gpus", [](SimOptions& o) { o.cluster.gpus = 0; }, "--gpus"},
      {"pp not dividing nodes", [](SimOptions& o) { o.cluster.pp = 3; }, "--pp"},
      {"pp above layers", [](SimOptions& o) { o.cluster.gpus = 8 * 64; o.cluster.pp = 64; }, "--pp"},
      {"mfu zero", [](SimOptions& o) { o.mfu = 0; }, "--mfu"},
      {"mfu above one", [](SimOptions& o) { o.mfu = 1.5; }, "--mfu"},
      {"attention efficiency", [](SimOptions& o) { o.attention_efficiency = -1; }, "--attention-efficiency"},
      {"tolerance", [](SimOptions& o) { o.tolerance = 2; }, "--tolerance"},
      {"wlb cap", [](SimOptions& o) { o.wlb_mem_cap = 0.5; }, "--wlb-mem-cap"},
      {"cp threshold", [](SimOptions& o) { o.wlb_cp_threshold = -1; }, "--cp-threshold"},
      {"fragmentation", [](SimOptions& o) { o.framework.fragmentation = 1; }, "framework memory"},
      {"buffers", [](SimOptions& o) { o.framework.comm_buffer_bytes = -1; }, "framework memory"},
      {"dtype", [](SimOptions& o) { o.dtype_bytes = 3; }, "--dtype"},
      {"percp degree", [](SimOptions& o) { o.strategy = parse_strategy("percp:3").value(); }, "--strategy"},
      {"wlb degree", [](SimOptions& o) { o.strategy = parse_strategy("wlb:16").value(); }, "--strategy"},
  };
  for (const Case& c : cases) {
    SimOptions o = base_options(64);
    c.edit(o);
    Status st = o.validate();
    ASSERT_FALSE(st.ok()) << c.what;
    EXPECT_NE(st.message().find(c.flag), std::string::npos) << c.what << ": " << st.message();
  }
  EXPECT_TRUE(base_options(64).validate().ok());
  EXPECT_TRUE(base_options(64, 4).validate().ok());
}

TEST(Options, SimulateRefusesMismatchedBatches) {
  SimOptions o = base_options(64);
  Batch b{4, 1024, {{{0, 0, 1024, 1024}}, {{1, 0, 1024, 1024}}, {{2, 0, 1024, 1024}}, {{3, 0, 1024, 1024}}}};
  auto r = simulate(o, {b});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("nodes per pipeline stage"), std::string::npos) << r.status().message();
  EXPECT_FALSE(simulate(o, {}).ok());
  Batch bad = b;  // a document that does not tile
  bad.ranks = 8;
  bad.per_rank.resize(8);
  for (int i = 4; i < 8; ++i) bad.per_rank[static_cast<size_t>(i)] = {{10 + i, 0, 512, 1024}};
  auto r2 = simulate(o, {bad});
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find("micro-batch 0"), std::string::npos) << r2.status().message();
}

// Every (stage, micro-batch) forward and backward exactly once; forwards in order along the
// stages, backwards in reverse, each after its own forward.
void check_dependencies(const std::map<std::tuple<int64_t, int64_t, bool>, int64_t>& when, int64_t p, int64_t m) {
  ASSERT_EQ(static_cast<int64_t>(when.size()), 2 * p * m);
  for (int64_t s = 0; s < p; ++s) {
    for (int64_t j = 0; j < m; ++j) {
      const int64_t f = when.at({s, j, false}), b = when.at({s, j, true});
      EXPECT_LT(f, b);
      if (s > 0) {
        EXPECT_LT(when.at({s - 1, j, false}), f);
      }
      if (s + 1 < p) {
        EXPECT_LT(when.at({s + 1, j, true}), b);
      }
    }
  }
}

TEST(Pipeline, OneFOneBHasEveryOpOnceInDependencyOrder) {
  for (int64_t p : {1, 2, 3, 4, 8}) {
    for (int64_t m : {1, 2, 3, 5, 8, 16}) {
      const auto ops = one_f_one_b(p, m);
      ASSERT_EQ(static_cast<int64_t>(ops.size()), p);
      // Unit-time slots by list scheduling: the earliest slot after the dependency.
      std::map<std::tuple<int64_t, int64_t, bool>, int64_t> when;
      std::vector<size_t> next(static_cast<size_t>(p), 0);
      std::vector<int64_t> free_at(static_cast<size_t>(p), 0);
      bool progress = true;
      while (progress) {
        progress = false;
        for (int64_t s = 0; s < p; ++s) {
          auto& list = ops[static_cast<size_t>(s)];
          while (next[static_cast<size_t>(s)] < list.size()) {
            const PipeOp& op = list[next[static_cast<size_t>(s)]];
            EXPECT_EQ(op.stage, s);
            std::tuple<int64_t, int64_t, bool> dep;
            bool has_dep = true;
            if (!op.backward) {
              has_dep = s > 0;
              dep = {s - 1, op.microbatch, false};
            } else {
              dep = s == p - 1 ? std::make_tuple(s, op.microbatch, false) : std::make_tuple(s + 1, op.microbatch, true);
            }
            if (has_dep && !when.count(dep)) break;
            const int64_t start = std::max(free_at[static_cast<size_t>(s)], has_dep ? when.at(dep) + 1 : 0);
            when[{s, op.microbatch, op.backward}] = start;
            free_at[static_cast<size_t>(s)] = start + 1;
            ++next[static_cast<size_t>(s)];
            progress = true;
          }
        }
      }
      check_dependencies(when, p, m);
      // Uniform unit work: the makespan is 2(m + p - 1) slots, the bubble (p-1)/(m+p-1).
      int64_t makespan = 0;
      for (int64_t t : free_at) makespan = std::max(makespan, t);
      EXPECT_EQ(makespan, 2 * (m + p - 1)) << "p=" << p << " m=" << m;
      for (int64_t s = 0; s < p; ++s) EXPECT_LE(peak_in_flight(ops[static_cast<size_t>(s)]), std::min(p - s, m));
    }
  }
}

TEST(Pipeline, PeakInFlightCountsHeldMicrobatches) {
  std::vector<PipeOp> ops = {{0, 0, false}, {0, 1, false}, {0, 0, true}, {0, 2, false}, {0, 3, false},
                             {0, 1, true},  {0, 2, true},  {0, 3, true}};
  EXPECT_EQ(peak_in_flight(ops), 3);
}

TEST(Cluster, MakeClusterUsesThePresetNode) {
  auto c = make_cluster("h200", 128);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->gpus_per_node, 8);
  EXPECT_EQ(c->units(), 16);
  EXPECT_FALSE(make_cluster("h200", 12).ok());
  EXPECT_FALSE(make_cluster("nope", 8).ok());
}

// The writer assembles the document event by event; the reference builds it as one JSON tree
// (what the simulator's own writer did) and dumps it: the bytes must agree, metadata, args
// and otherData included. pack/unpack keeps every field, args too, and refuses truncation.
TEST(Trace, WriterMatchesAWholeDocumentDumpAndPackRoundTrips) {
  std::vector<TraceEvent> events = {{"fwd linear", "compute", 0, 0, 0.0, 12.5},
                                    {"Q/KV dispatch ping", "comm", 1, 1, 3.25, 7.0, {{"microbatch", 2}}},
                                    {"grad all-reduce", "comm", 1, 1, 1e6 / 3, 2e6 / 3}};
  TraceMetadata meta;
  meta.processes = {{0, "unit 0 (stage 0)", 0, {{0, "compute"}, {1, "communication"}}},
                    {1, "unit 1 (stage 1)", 1, {{0, "compute"}}}};
  meta.other_data = {{"strategy", std::string("cad")}, {"gpus", int64_t{16}}, {"iteration_seconds", 1.5}};

  nlohmann::json list = nlohmann::json::array();
  for (const auto& p : meta.processes) {
    list.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", p.pid}, {"tid", 0}, {"args", {{"name", p.name}}}});
    list.push_back(
        {{"ph", "M"}, {"name", "process_sort_index"}, {"pid", p.pid}, {"tid", 0}, {"args", {{"sort_index", p.sort_index}}}});
    for (const auto& [tid, name] : p.threads)
      list.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", p.pid}, {"tid", tid}, {"args", {{"name", name}}}});
  }
  for (const auto& e : events) {
    nlohmann::json j = {{"ph", "X"},          {"name", e.name}, {"cat", e.category}, {"pid", e.pid},
                        {"tid", e.tid},       {"ts", e.start_us}, {"dur", e.end_us - e.start_us}};
    if (!e.args.empty()) j["args"] = {{e.args[0].key, e.args[0].value}};
    list.push_back(j);
  }
  const nlohmann::json doc = {{"traceEvents", list},
                              {"displayTimeUnit", "ms"},
                              {"otherData", {{"strategy", "cad"}, {"gpus", 16}, {"iteration_seconds", 1.5}}}};
  EXPECT_EQ(chrome_trace_json(events, meta), doc.dump() + "\n");
  // Without metadata: no otherData, spans only (the runtime's form).
  const nlohmann::json bare = {{"traceEvents", nlohmann::json(list.end() - 3, list.end())}, {"displayTimeUnit", "ms"}};
  EXPECT_EQ(chrome_trace_json(events), bare.dump() + "\n");

  const auto bytes = pack_trace_events(events);
  auto back = unpack_trace_events(bytes);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(*back, events);
  // Every cut inside the last record is a truncation (a cut at a record boundary is not).
  const size_t last = pack_trace_events(std::span(events).last(1)).size();
  for (size_t cut = 1; cut < last; ++cut) {
    EXPECT_FALSE(unpack_trace_events(std::span(bytes).first(bytes.size() - cut)).ok()) << cut;
  }
}

}  // namespace
}  // namespace distca::sim
