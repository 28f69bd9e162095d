// `distca bench plan`: plan time, balance and bytes of the schedulers side by side, measured in
// one run on the same batches (docs/benchmarks.md, "Planner"), plus a tolerance sweep of `cad`
// and `cad-symmetric`.
//
// For every (distribution, tokens per rank, servers): `--batches` batches (make_batches, seed
// --seed), each planned by cad, cad-symmetric, wlb and percp (best C). Figures per scheduler:
// median plan milliseconds (the scheduler call alone, wall clock), median complete-plan
// milliseconds (make_plan: options and batch checked, scheduler, build_plan; what a training
// step pays) with its phases (PlanPhases, plan.h), median and worst load max/mean, median
// forward bytes (total and busiest rank, traffic.h rules; percp: its K/V all-gather, as plan.h
// reports it), and the batches balanced within tolerance. The ratio cad / cad-symmetric bytes
// is the median of the per-batch ratios. Tolerance monotonicity (cad, cad-symmetric): each
// batch planned again at --wide-tolerance; the worst per-batch ratio of bytes there over
// bytes at --tolerance (a wider band should never cost bytes: <= 1).
//
// percp "best C": the smallest power of two whose balance is within the tolerance, found with
// an analytic proxy (each document's pairs shared equally by its group) and confirmed by
// running it (doubling C at most twice when the real plan falls short). percp is slow to plan
// and to count at hundreds of servers, so it runs on the first kPercpBatches batches only.
// Plan times: the faster of two runs for cad, cad-symmetric and wlb; one run for percp. The
// complete plan is timed for cad and cad-symmetric (the planners a training step calls).
// --dist / --tokens-k / --servers select rows (e.g. the 512-server ProLong 512K row alone) and
// --no-sweep skips the sweep, for timing one configuration quickly.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "command.h"
#include "distca/core/stats.h"
#include "distca/core/clock.h"
#include "distca/core/io.h"
#include "distca/core/memory.h"
#include "distca/core/specs.h"
#include "distca/data/workload.h"
#include "distca/plan/cad.h"
#include "distca/plan/plan.h"
#include "distca/plan/traffic.h"

namespace distca::cli {
namespace {

struct Flags {
  std::string json_path;
  int64_t batches = 30;
  bool quick = false;
  std::string model = "llama-8b";
  std::string layout = "contiguous";
  double tolerance = 0.05;
  double wide_tolerance = 0.10;
  uint64_t seed = 42;
  // Row selection (empty / 0: the default rows); --no-sweep skips the tolerance sweep.
  std::string dist;
  int64_t tokens_k = 0;
  int64_t servers = 0;
  bool no_sweep = false;
};

const char* kSchedulers[] = {"cad", "cad-symmetric", "wlb", "percp"};
constexpr int kNumSchedulers = 4;
constexpr size_t kPercpBatches = 5;

struct Sample {
  double ms = 0, max_over_mean = 0;
  double bytes = 0, bytes_max_rank = 0;
  int64_t cp = 0;  // percp only
  double complete_ms = -1;  // make_plan, the faster of two runs (-1: not timed)
  PlanPhases phases;        // of that run
  double wide_ratio = -1;   // bytes at --wide-tolerance / bytes at --tolerance (-1: not run)
};

// PlanPhases' phases, then "rest": the complete time less their sum (mostly freeing the
// builder's scratch and the schedule when make_plan returns).
constexpr const char* kPhaseNames[] = {"validate", "schedule", "index", "tasks", "layouts", "mirror", "metrics", "rest"};
constexpr int kNumPhases = 8;

double phase_ms(const Sample& m, int i) {
  const PlanPhases& p = m.phases;
  const double s[kNumPhases] = {p.validate_s, p.schedule_s, p.index_s, p.tasks_s,
                                p.layouts_s,  p.mirror_s,   p.metrics_s, m.complete_ms / 1e3 - p.total()};
  return 1e3 * s[i];
}

std::string fmt_tol(double t) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", t);
  return buf;
}

double now_ms() { return 1e3 * monotonic_seconds(); }

// Balance and bytes of a schedule by the shared rules (traffic.h). percp (cp > 0): what
// build_plan reports for it (plan.h): the K/V all-gather of its groups (the loader lays the
// head-tail shards out, so Q and O do not cross ranks), computed here without building the
// full plan's layouts.
Result<Sample> measure(const Schedule& s, const Batch& input, const ScheduleOptions& o, int64_t cp) {
  Sample m;
  m.max_over_mean = max_over_mean(server_loads(s.batch.ranks, s.tasks, o.cost));
  m.cp = cp;
  if (cp == 0) {
    const Traffic t = compute_traffic(DocumentIndex(s.batch), s.tasks, row_bytes(o.model, o.dtype_bytes));
    m.bytes = static_cast<double>(t.bytes.forward());
    m.bytes_max_rank = static_cast<double>(t.forward_max_rank());
    return m;
  }
  (void)input;
  const DocumentIndex index(s.batch);
  const AllGatherTraffic ag = compute_allgather(index, cp, percp_groups(index, cp), row_bytes(o.model, o.dtype_bytes));
  int64_t mx = 0;
  for (const RankBytes& r : ag.per_rank) mx = std::max(mx, r.fwd());
  m.bytes = static_cast<double>(ag.bytes);
  m.bytes_max_rank = static_cast<double>(mx);
  return m;
}

// The faster of two runs: the first also pays for touching fresh memory, which on a shared
// machine says more about the allocator than about the planner.
template <class F>
Result<Sample> timed(F&& plan, const Batch& input, const ScheduleOptions& o, int64_t cp) {
  double best_ms = 0;
  std::optional<Schedule> kept;
  for (int rep = 0; rep < 2; ++rep) {
    const double t0 = now_ms();
    auto s = plan();
    const double ms = now_ms() - t0;
    if (!s.ok()) return s.status();
    if (rep == 0 || ms < best_ms) best_ms = ms;
    if (rep == 0) kept = std::move(*s);
  }
  auto m = measure(*kept, input, o, cp);
  if (m.ok()) m->ms = best_ms;
  return m;
}

// percp's balance for degree c without running it: a document's pairs are shared equally by
// the ranks of the groups holding it (head-tail chunks have equal work).
double percp_proxy_max_over_mean(const Batch& b, int64_t c) {
  std::map<int64_t, std::pair<int64_t, int64_t>> span;  // doc -> (first group, last group)
  std::map<int64_t, int64_t> len;
  for (int64_t r = 0; r < b.ranks; ++r) {
    for (const Piece& p : b.per_rank[static_cast<size_t>(r)]) {
      auto [it, fresh] = span.emplace(p.doc, std::make_pair(r / c, r / c));
      it->second.first = std::min(it->second.first, r / c);
      it->second.second = std::max(it->second.second, r / c);
      len[p.doc] = p.doc_len;
    }
  }
  std::vector<double> load(static_cast<size_t>(b.ranks), 0.0);
  for (const auto& [doc, g] : span) {
    const int64_t first = g.first * c, last = (g.second + 1) * c;
    const double share = static_cast<double>(document_pairs(len[doc])) / static_cast<double>(last - first);
    for (int64_t r = first; r < last; ++r) load[static_cast<size_t>(r)] += share;
  }
  return max_over_mean(load);
}

// Bytes per percp task while it is measured: the TaskPlacement (40 B; schedule_percp reserves
// the exact count) with a margin; measured about 40 B at 1024 servers.
constexpr double kPercpPerTask = 64;

// The complete plan of scheduler k (make_plan), the faster of two runs, into m.
Status time_complete(int k, const Batch& b, const ScheduleOptions& o, Sample& m) {
  const SchedulerKind kinds[] = {SchedulerKind::kCad, SchedulerKind::kCadSymmetric};
  for (int rep = 0; rep < 2; ++rep) {
    PlanPhases ph;
    const double t0 = now_ms();
    auto plan = make_plan(b, SchedulerSpec{kinds[k], 1}, o, &ph);
    const double ms = now_ms() - t0;
    if (!plan.ok()) return plan.status();
    if (rep == 0 || ms < m.complete_ms) {
      m.complete_ms = ms;
      m.phases = ph;
    }
  }
  return Status::ok_status();
}

// Bytes of scheduler k (cad or cad-symmetric) at `wide` over its bytes at o.tolerance (in m).
Status wide_ratio(int k, const Batch& b, const ScheduleOptions& o, double wide, Sample& m) {
  ScheduleOptions ow = o;
  ow.tolerance = wide;
  auto s = k == 0 ? schedule_cad(b, ow) : schedule_cad_symmetric(b, ow);
  if (!s.ok()) return s.status();
  const Traffic t = compute_traffic(DocumentIndex(s->batch), s->tasks, row_bytes(o.model, o.dtype_bytes));
  m.wide_ratio = static_cast<double>(t.bytes.forward()) / std::max(1.0, m.bytes);
  return Status::ok_status();
}

// `held_bytes`: what the run holds besides the schedule (the row's batches); `what`: the flags
// for a refusal's message.
Result<Sample> run_one(int k, const Batch& b, const ScheduleOptions& o, double wide, double held_bytes,
                       const std::string& what) {
  if (k <= 2) {
    auto m = k == 0   ? timed([&] { return schedule_cad(b, o); }, b, o, 0)
             : k == 1 ? timed([&] { return schedule_cad_symmetric(b, o); }, b, o, 0)
                      : timed([&] { return schedule_wlb(b, o); }, b, o, 0);
    if (!m.ok()) return m;
    if (k <= 1) {
      DISTCA_RETURN_IF_ERROR(time_complete(k, b, o, *m));
      DISTCA_RETURN_IF_ERROR(wide_ratio(k, b, o, wide, *m));
    }
    return m;
  }
  // percp: the smallest power-of-two C whose proxy balance is within tolerance (else the
  // proxy's best), then confirmed by running it, doubling C at most twice if it falls short.
  int64_t c = 1, best_c = 1;
  double best_proxy = 0;
  for (int64_t t = 1; t <= b.ranks && b.ranks % t == 0; t *= 2) {
    const double p = percp_proxy_max_over_mean(b, t);
    if (t == 1 || p < best_proxy) {
      best_proxy = p;
      best_c = t;
    }
    if (p <= 1 + o.tolerance) {
      best_c = t;
      break;
    }
  }
  c = best_c;
  std::optional<Sample> best;
  for (int tries = 0; tries < 3; ++tries) {
    // A large degree on many documents makes many tasks (2C per document): counted first.
    DISTCA_RETURN_IF_ERROR(check_memory(held_bytes + kPercpPerTask * static_cast<double>(percp_task_count(b, c)),
                                        what + " (percp:" + std::to_string(c) + ")"));
    const double t0 = now_ms();
    auto s = schedule_percp(b, c, o);
    const double ms = now_ms() - t0;
    if (!s.ok()) return s.status();
    auto mr = measure(*s, b, o, c);
    if (!mr.ok()) return mr.status();
    Sample m = *mr;
    m.ms = ms;
    if (!best || m.max_over_mean < best->max_over_mean) best = m;
    if (m.max_over_mean <= 1 + o.tolerance || 2 * c > b.ranks || b.ranks % (2 * c) != 0) break;
    c *= 2;
  }
  return *best;
}

struct Config {
  std::string dist;
  int64_t tokens = 0, servers = 0;
};

void progress(bool on, const std::string& line) {
  if (on) std::fprintf(stderr, "\r%-70s", line.c_str());
}

// What a run holds at its peak (docs/scheduler.md, "Memory"): one row's batches (measured
// about 42 bytes per piece and 1.6 KB per rank with the allocator's overhead), one schedule
// with its traffic count (about 600 bytes per task, tasks about the pieces, and a few KB per
// rank) and one complete plan (measured 110-430 bytes per task and about 1.3 KB per rank,
// docs/scheduler.md, "Performance"). The constants round the measurements up.
double bench_row_bytes(int64_t batches, int64_t servers, double pieces) {
  constexpr double kPerPiece = 64, kPerRank = 64, kSchedulePerPiece = 1536, kSchedulePerRank = 8192;
  return static_cast<double>(batches) * (kPerPiece * pieces + kPerRank * static_cast<double>(servers)) +
         kSchedulePerPiece * pieces + kSchedulePerRank * static_cast<double>(servers);
}

// Step 1: every flag checked, output path included, before any work.
Status check_flags(const Flags& f) {
  if (f.batches < 1) return Status::invalid_argument("--batches must be >= 1 (got " + std::to_string(f.batches) + ")");
  if (!std::isfinite(f.tolerance) || f.tolerance < 0 || f.tolerance > 1) {
    return Status::invalid_argument("--tolerance must be in [0, 1]");
  }
  if (!std::isfinite(f.wide_tolerance) || f.wide_tolerance < f.tolerance || f.wide_tolerance > 1) {
    return Status::invalid_argument("--wide-tolerance must be in [--tolerance, 1] (got " +
                                    std::to_string(f.wide_tolerance) + ")");
  }
  DISTCA_RETURN_IF_ERROR(model_preset(f.model).status().with_context("--model"));
  DISTCA_RETURN_IF_ERROR(parse_layout(f.layout).status());
  if (!f.json_path.empty() && f.json_path != "-") {
    DISTCA_RETURN_IF_ERROR(check_output_path(f.json_path).with_context("--json"));
  }
  if (!f.dist.empty() && f.dist != "pretrain" && f.dist != "prolong") {
    return Status::invalid_argument("--dist must be pretrain or prolong (got '" + f.dist + "')");
  }
  // Checked here in the flags' own terms (WorkloadOptions::validate would name --ranks and
  // --tokens-per-rank, which this command does not have).
  if (f.tokens_k < 0) return Status::invalid_argument("--tokens-k must be positive (got " + std::to_string(f.tokens_k) + ")");
  if (f.servers < 0) return Status::invalid_argument("--servers must be positive (got " + std::to_string(f.servers) + ")");
  constexpr int64_t kMaxServers = int64_t{1} << 24, kMaxTokensK = int64_t{1} << 30;  // 2^40 tokens
  if (f.servers > kMaxServers) {
    return Status::invalid_argument("--servers must be at most 16777216 (got " + std::to_string(f.servers) + ")");
  }
  if (f.tokens_k > kMaxTokensK) {
    return Status::invalid_argument("--tokens-k must be at most 1073741824 (got " + std::to_string(f.tokens_k) + ")");
  }
  // The largest row's batch: the given values, or the defaults' largest (1024 servers, 512K).
  const int64_t servers = f.servers > 0 ? f.servers : 1024, tokens_k = f.tokens_k > 0 ? f.tokens_k : 512;
  if (tokens_k > (kMaxTokensK / servers)) {
    return Status::invalid_argument("--servers (" + std::to_string(servers) + ") times --tokens-k (" +
                                    std::to_string(tokens_k) + ") exceeds 2^40 tokens per batch");
  }
  return Status::ok_status();
}

// The rows selected by the flags (every default row unless --dist / --tokens-k / --servers).
std::vector<Config> select_configs(const Flags& f, std::vector<const char*>& dists) {
  std::vector<Config> configs;
  std::vector<int64_t> tokens = f.quick ? std::vector<int64_t>{128 << 10, 512 << 10}
                                        : std::vector<int64_t>{128 << 10, 256 << 10, 512 << 10};
  std::vector<int64_t> servers = f.quick ? std::vector<int64_t>{8, 64, 512}
                                         : std::vector<int64_t>{8, 16, 32, 64, 128, 256, 512, 1024};
  if (f.tokens_k > 0) tokens = {f.tokens_k << 10};
  if (f.servers > 0) servers = {f.servers};
  dists = {"pretrain", "prolong"};
  if (f.dist == "pretrain") dists = {"pretrain"};
  if (f.dist == "prolong") dists = {"prolong"};
  for (const char* dist : dists) {
    for (int64_t t : tokens) {
      for (int64_t s : servers) configs.push_back({dist, t, s});
    }
  }
  return configs;
}

// Everything one run shares: the flags as resolved, the scheduling options, the output.
struct Bench {
  explicit Bench(const Flags& flags) : f(flags) {}
  const Flags& f;
  Layout layout = Layout::kContiguous;
  int64_t batches = 0;
  bool to_stdout = false;
  bool show = false;
  ScheduleOptions o;
  nlohmann::json out;
  std::string what;  // the flags that size a run, for check_memory's message

  WorkloadOptions workload(const Config& c) const {
    WorkloadOptions w;
    w.dist = c.dist;
    w.ranks = c.servers;
    w.tokens_per_rank = c.tokens;
    w.layout = layout;
    w.batches = batches;
    w.seed = f.seed;
    return w;
  }
};

// Step 2: the largest row (the sweep's included) must fit before the first one runs.
Status check_bench_memory(const Bench& b, const std::vector<Config>& configs, int64_t sweep_servers,
                          const std::vector<const char*>& dists) {
  std::vector<Config> all = configs;
  for (const char* dist : dists) all.push_back({dist, 512 << 10, sweep_servers});
  double need = 0;
  for (const Config& c : all) {
    DISTCA_ASSIGN_OR_RETURN(double pieces, estimate_batch_pieces(b.workload(c)));
    need = std::max(need, bench_row_bytes(b.batches, c.servers, pieces));
  }
  return check_memory(need, b.what);
}

// Step 3, one row: every scheduler on the row's batches, summarized (and printed).
Status run_config(Bench& b, const Config& c) {
  const Flags& f = b.f;
  progress(b.show, c.dist + " " + std::to_string(c.tokens >> 10) + "K x " + std::to_string(c.servers));
  DISTCA_ASSIGN_OR_RETURN(std::vector<Batch> bs, make_batches(b.workload(c)));
  double pieces = 0;
  for (const Batch& batch : bs) {
    double n = 0;
    for (const auto& rank : batch.per_rank) n += static_cast<double>(rank.size());
    pieces = std::max(pieces, n);
  }
  const double held = bench_row_bytes(b.batches, c.servers, pieces);
  std::vector<Sample> samples[kNumSchedulers];
  std::vector<double> ratio;
  for (size_t i = 0; i < bs.size(); ++i) {
    for (int k = 0; k < kNumSchedulers; ++k) {
      if (k == 3 && i >= kPercpBatches) continue;
      DISTCA_ASSIGN_OR_RETURN(Sample m, run_one(k, bs[i], b.o, f.wide_tolerance, held, b.what));
      samples[k].push_back(m);
    }
    ratio.push_back(samples[0].back().bytes / std::max(1.0, samples[1].back().bytes));
  }
  progress(b.show, "");
  if (b.show) std::fprintf(stderr, "\r");
  nlohmann::json row = {{"dist", c.dist}, {"tokens_per_rank", c.tokens}, {"servers", c.servers},
                        {"cad_over_symmetric_bytes_median", median(ratio)}, {"schedulers", nlohmann::json::object()}};
  for (int k = 0; k < kNumSchedulers; ++k) {
    std::vector<double> ms, mm, by, br, cp, full, wide, phase[kNumPhases];
    int64_t balanced = 0, wider_costs = 0;
    for (const Sample& s : samples[k]) {
      ms.push_back(s.ms);
      mm.push_back(s.max_over_mean);
      by.push_back(s.bytes);
      br.push_back(s.bytes_max_rank);
      cp.push_back(static_cast<double>(s.cp));
      if (s.max_over_mean <= 1 + f.tolerance) ++balanced;
      if (s.complete_ms >= 0) {
        full.push_back(s.complete_ms);
        for (int p = 0; p < kNumPhases; ++p) phase[p].push_back(phase_ms(s, p));
      }
      if (s.wide_ratio >= 0) {
        wide.push_back(s.wide_ratio);
        if (s.wide_ratio > 1) ++wider_costs;
      }
    }
    const double wide_worst = wide.empty() ? 0 : *std::max_element(wide.begin(), wide.end());
    nlohmann::json j = {{"plan_ms_median", median(ms)},
                        {"load_max_over_mean_median", median(mm)},
                        {"load_max_over_mean_worst", *std::max_element(mm.begin(), mm.end())},
                        {"comm_bytes_total_median", median(by)},
                        {"comm_bytes_max_rank_median", median(br)},
                        {"balanced_batches", balanced},
                        {"batches", samples[k].size()}};
    if (k == 3) j["cp_degree_median"] = median(cp);
    if (!full.empty()) {
      j["complete_plan_ms_median"] = median(full);
      nlohmann::json ph = nlohmann::json::object();
      for (int p = 0; p < kNumPhases; ++p) ph[kPhaseNames[p]] = median(phase[p]);
      j["complete_plan_phases_ms_median"] = ph;
    }
    if (!wide.empty()) {
      j["wide_over_tight_bytes_worst"] = wide_worst;
      j["wide_over_tight_bytes_median"] = median(wide);
      j["wide_costs_more_batches"] = wider_costs;
    }
    row["schedulers"][kSchedulers[k]] = j;
    if (!b.to_stdout) {
      char full_ms[16] = "       -", wide_s[40] = "";
      if (!full.empty()) std::snprintf(full_ms, sizeof full_ms, "%8.2f", median(full));
      if (!wide.empty()) std::snprintf(wide_s, sizeof wide_s, " | %6.3f (%lld)", wide_worst, static_cast<long long>(wider_costs));
      std::printf("%-8s %4lldK %5lld | %-13s %8.2f %s %8.4f %8.4f %9.2f %9.3f | %lld/%lld%s%s\n", c.dist.c_str(),
                  static_cast<long long>(c.tokens >> 10), static_cast<long long>(c.servers), kSchedulers[k],
                  median(ms), full_ms, median(mm), *std::max_element(mm.begin(), mm.end()), median(by) / 1e9,
                  median(br) / 1e9, static_cast<long long>(balanced), static_cast<long long>(samples[k].size()),
                  k == 3 ? (" (C=" + std::to_string(static_cast<long long>(median(cp))) + ")").c_str() : "", wide_s);
      if (k == 0 && !full.empty()) {
        std::printf("%-8s %4lldK %5lld | cad complete plan, median ms per phase:", c.dist.c_str(),
                    static_cast<long long>(c.tokens >> 10), static_cast<long long>(c.servers));
        for (int p = 0; p < kNumPhases; ++p) std::printf(" %s %.2f", kPhaseNames[p], median(phase[p]));
        std::printf("\n");
      }
    }
  }
  if (!b.to_stdout) std::printf("%-8s %4lldK %5lld | cad / cad-symmetric bytes: %.3f (median of per-batch ratios)\n",
                                c.dist.c_str(), static_cast<long long>(c.tokens >> 10),
                                static_cast<long long>(c.servers), median(ratio));
  b.out["configs"].push_back(row);
  std::fflush(stdout);
  return Status::ok_status();
}

// Step 4, one distribution: bytes of cad and cad-symmetric as the tolerance grows.
Status run_sweep(Bench& b, const char* dist, int64_t sweep_servers) {
  DISTCA_ASSIGN_OR_RETURN(std::vector<Batch> bs, make_batches(b.workload({dist, 512 << 10, sweep_servers})));
  for (double tol : {0.0, 0.05, 0.1, 0.15, 0.2, 0.3}) {
    progress(b.show, std::string("sweep ") + dist + " tol " + std::to_string(tol));
    ScheduleOptions ot = b.o;
    ot.tolerance = tol;
    std::vector<double> bytes[2], mm[2];
    int64_t balanced[2] = {0, 0};
    for (const Batch& batch : bs) {
      for (int k = 0; k < 2; ++k) {
        CadStats st;
        auto s = k == 0 ? schedule_cad(batch, ot, &st) : schedule_cad_symmetric(batch, ot, &st);
        if (!s.ok()) return s.status();
        bytes[k].push_back(static_cast<double>(st.bytes_incremental));
        mm[k].push_back(st.load_max / st.mean);
        if (st.balanced) ++balanced[k];
      }
    }
    progress(b.show, "");
    if (b.show) std::fprintf(stderr, "\r");
    b.out["sweep"].push_back({{"dist", dist}, {"servers", sweep_servers}, {"tokens_per_rank", 512 << 10},
                              {"tolerance", tol},
                              {"cad_bytes_median", median(bytes[0])},
                              {"cad_symmetric_bytes_median", median(bytes[1])},
                              {"cad_load_max_over_mean_worst", *std::max_element(mm[0].begin(), mm[0].end())},
                              {"cad_balanced_batches", balanced[0]},
                              {"cad_symmetric_balanced_batches", balanced[1]}});
    if (!b.to_stdout) {
      std::printf("%-8s tol %.2f  cad %9.2f (%lld/%lld)  cad-symmetric %9.2f (%lld/%lld)  ratio %.3f\n", dist, tol,
                  median(bytes[0]) / 1e9, static_cast<long long>(balanced[0]), static_cast<long long>(b.batches),
                  median(bytes[1]) / 1e9, static_cast<long long>(balanced[1]), static_cast<long long>(b.batches),
                  median(bytes[0]) / std::max(1.0, median(bytes[1])));
    }
  }
  return Status::ok_status();
}

int run(const Flags& f) {
  Status st = check_flags(f);
  if (!st.ok()) return fail_input(st.message());
  Bench b(f);
  b.layout = *parse_layout(f.layout);
  b.to_stdout = f.json_path == "-";
  b.show = stderr_is_terminal() && !b.to_stdout;
  b.batches = f.quick ? std::min<int64_t>(f.batches, 5) : f.batches;
  b.o.model = *model_preset(f.model);
  b.o.tolerance = f.tolerance;
  b.what = "--batches " + std::to_string(b.batches) + (f.servers > 0 ? " --servers " + std::to_string(f.servers) : "") +
           (f.tokens_k > 0 ? " --tokens-k " + std::to_string(f.tokens_k) : "");
  std::vector<const char*> dists;
  const std::vector<Config> configs = select_configs(f, dists);
  const int64_t sweep_servers = f.quick ? 64 : 256;
  if (f.no_sweep) dists.clear();
  st = check_bench_memory(b, configs, sweep_servers, dists);
  if (!st.ok()) return st.code() == StatusCode::kOutOfMemory ? fail_input(st.message()) : fail(st);

  b.out = {{"bench", "plan"}, {"model", f.model}, {"layout", f.layout},
           {"tolerance", f.tolerance}, {"wide_tolerance", f.wide_tolerance}, {"batches", b.batches}, {"seed", f.seed},
           {"dtype_bytes", b.o.dtype_bytes}, {"configs", nlohmann::json::array()},
           {"sweep", nlohmann::json::array()}};
  if (!b.to_stdout) {
    std::printf("distca bench plan: %s, %s layout, tolerance %g, %lld batches per row, medians\n",
                f.model.c_str(), f.layout.c_str(), f.tolerance, static_cast<long long>(b.batches));
    std::printf("%-8s %5s %5s | %-13s %8s %8s %8s %8s %9s %9s | %s | %s\n", "dist", "tok", "srv", "scheduler",
                "plan ms", "full ms", "max/mean", "worst", "bytes GB", "rank GB", "balanced",
                ("bytes tol " + fmt_tol(f.wide_tolerance) + " / " + fmt_tol(f.tolerance) + " worst (batches > 1)").c_str());
  }
  for (const Config& c : configs) {
    st = run_config(b, c);
    if (!st.ok()) return st.code() == StatusCode::kOutOfMemory ? fail_input(st.message()) : fail(st);
  }
  if (!b.to_stdout && !dists.empty()) {
    std::printf("\ntolerance sweep, %lld servers x 512K tokens, median forward GB (balanced batches)\n",
                static_cast<long long>(sweep_servers));
  }
  for (const char* dist : dists) {
    st = run_sweep(b, dist, sweep_servers);
    if (!st.ok()) return fail(st);
  }
  if (b.show) std::fprintf(stderr, "\r%70s\r", "");
  const std::string text = b.out.dump(2) + "\n";
  if (b.to_stdout) st = write_stdout(text);
  else if (!f.json_path.empty()) st = write_file_atomic(f.json_path, text);
  return st.ok() ? kExitOk : fail(st);
}

Runner setup(CLI::App& sub) {
  auto f = std::make_shared<Flags>();
  sub.add_option("--json", f->json_path, "Write the figures as JSON to FILE (atomically), or - for stdout");
  sub.add_option("--batches", f->batches, "Batches per configuration")->capture_default_str();
  sub.add_flag("--quick", f->quick, "A small subset: 128K and 512K tokens, 8/64/512 servers, <= 5 batches");
  sub.add_option("--model", f->model, "Model preset for the byte counts")->capture_default_str();
  sub.add_option("--layout", f->layout, "Batch layout: contiguous | head-tail")->capture_default_str();
  sub.add_option("--tolerance", f->tolerance, "cad / cad-symmetric tolerance, in [0, 1]")->capture_default_str();
  sub.add_option("--wide-tolerance", f->wide_tolerance,
                 "Tolerance monotonicity: cad and cad-symmetric planned again at this tolerance (>= --tolerance)")
      ->capture_default_str();
  sub.add_option("--seed", f->seed, "Workload seed")->capture_default_str();
  sub.add_option("--dist", f->dist, "Only this distribution's rows (and sweep): pretrain | prolong");
  sub.add_option("--tokens-k", f->tokens_k, "Only rows with this many K tokens per rank (e.g. 512)");
  sub.add_option("--servers", f->servers, "Only rows with this many servers");
  sub.add_flag("--no-sweep", f->no_sweep, "Skip the tolerance sweep");
  return [f] { return run(*f); };
}

}  // namespace

DISTCA_REGISTER_COMMAND(bench_plan, {"plan", "bench", "Planner: plan time, balance and bytes of cad, cad-symmetric, wlb, percp",
                                     60, &setup});

}  // namespace distca::cli
