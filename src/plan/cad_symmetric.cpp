// `cad-symmetric`: the reference implementation's greedy, kept as the yardstick for `cad`, with
// the second (pushing) phase we added so that both are compared at equal balance: the rules are
// docs/scheduler.md, "cad-symmetric". Bytes are counted exactly (State, traffic.h rules) like
// every scheduler's; only the decisions use the whole-document estimate.
#include <algorithm>
#include <cmath>

#include "cad_state.h"
#include "distca/plan/cad.h"

namespace distca {
namespace {

using cad_internal::State;

constexpr int64_t kMin = kMinChunkRows;
constexpr size_t kSources = 8;     // surplus servers considered per step
constexpr size_t kItems = 8;       // items (home segments) considered per source
constexpr size_t kDests = 8;       // least loaded destinations per step of the second phase

struct Pick {
  int64_t seg = -1, dest = -1;
  int64_t k = 0;  // slice rows (head and tail); 0: the whole segment
  double gain = 0;
  double score = 0;
};

class Symmetric {
 public:
  explicit Symmetric(double tolerance) : tol_(tolerance) {}

  void run(CadStats* stats);
  State& state() { return st_; }

 private:
  double mean() const { return st_.mean(); }
  double hi() const { return (1.0 + tol_ - margin()) * mean(); }
  double lo() const { return (1.0 - tol_ + margin()) * mean(); }
  double margin() const { return std::min(0.002, tol_ / 4.0); }
  double ht_work(const cad_internal::Seg& g, int64_t k) const {
    const auto w = st_.work(g.doc);
    return w(g.a, g.a + k) + w(g.b - k, g.b);
  }
  // The reference's candidate: item `id` to `dest` moving at most df work.
  void consider(int64_t id, int64_t dest, double df, Pick* best) const;
  void apply(const Pick& p);
  void items(int64_t r, std::vector<int64_t>* out);

  State st_;
  double tol_;
  int64_t iterations_ = 0;
};

void Symmetric::items(int64_t r, std::vector<int64_t>* out) {
  const auto& ids = st_.rank_segs(r);
  out->assign(ids.begin(), ids.end());
  auto heavier = [&](int64_t p, int64_t q) {
    const auto& gp = st_.seg(p);
    const auto& gq = st_.seg(q);
    const double wp = st_.work(gp.doc)(gp.a, gp.b), wq = st_.work(gq.doc)(gq.a, gq.b);
    return wp != wq ? wp > wq : p < q;
  };
  if (out->size() > kItems) {
    std::partial_sort(out->begin(), out->begin() + static_cast<std::ptrdiff_t>(kItems), out->end(), heavier);
    out->resize(kItems);
  } else {
    std::sort(out->begin(), out->end(), heavier);
  }
}

void Symmetric::consider(int64_t id, int64_t dest, double df, Pick* best) const {
  const auto& g = st_.seg(id);
  if (dest == g.rank || df <= 0) return;
  const double whole = st_.work(g.doc)(g.a, g.b);
  Pick p;
  p.seg = id;
  p.dest = dest;
  int64_t rows = g.b - g.a;
  if (whole <= df) {
    p.gain = whole;
  } else {
    // Largest k with head + tail work <= df, slices >= kMin, middle remainder >= kMin.
    const int64_t kmax = (g.b - g.a - kMin) / 2;
    if (kmax < kMin || ht_work(g, kMin) > df) return;
    int64_t good = kMin, bad = kmax + 1;
    while (bad - good > 1) {
      const int64_t mid = good + (bad - good) / 2;
      if (ht_work(g, mid) <= df) {
        good = mid;
      } else {
        bad = mid;
      }
    }
    p.k = good;
    rows = 2 * good;
    p.gain = ht_work(g, good);
  }
  const int64_t doc_len = st_.doc_len(g.doc);
  const double est = static_cast<double>(rows * st_.s_q() + doc_len * st_.s_kv());
  p.score = p.gain / est;
  const bool better = best->seg < 0 || p.score > best->score ||
                      (p.score == best->score &&
                       (p.gain > best->gain ||
                        (p.gain == best->gain && (p.dest < best->dest ||
                                                  (p.dest == best->dest && p.seg < best->seg)))));
  if (better) *best = p;
}

void Symmetric::apply(const Pick& p) {
  const auto g = st_.seg(p.seg);
  if (p.k == 0) {
    st_.move(p.seg, p.dest, g.a, g.b);
  } else {
    st_.move(p.seg, p.dest, g.b - p.k, g.b);  // the tail; [a, b-k) keeps the id
    st_.move(p.seg, p.dest, g.a, g.a + p.k);  // the head
  }
}

void Symmetric::run(CadStats* stats) {
  const int64_t cap = 16 * (st_.ranks() + st_.num_pieces()) + 1024;
  std::vector<int64_t> segs, sources;
  // Phase 1 (the reference): deficit servers, most deficit first, fill up to the mean.
  std::vector<int64_t> deficit;
  for (const auto& [l, r] : st_.by_load()) {
    if (l >= lo()) break;
    deficit.push_back(r);
  }
  for (int64_t d : deficit) {
    while (st_.load(d) < lo() && iterations_ < cap) {
      ++iterations_;
      sources.clear();
      for (auto it = st_.by_load().rbegin(); it != st_.by_load().rend(); ++it) {
        if (sources.size() >= kSources || it->first <= mean()) break;
        sources.push_back(it->second);
      }
      Pick best;
      for (int64_t s : sources) {
        items(s, &segs);
        const double surplus = st_.load(s) - mean();
        for (int64_t id : segs) consider(id, d, std::min(surplus, mean() - st_.load(d)), &best);
      }
      if (best.seg < 0) break;
      apply(best);
    }
  }
  // Phase 2 (ours): servers still above hi push to the least loaded, again up to the mean.
  std::vector<char> stuck(static_cast<size_t>(st_.ranks()), 0);
  while (iterations_ < cap) {
    int64_t s = -1;
    for (auto it = st_.by_load().rbegin(); it != st_.by_load().rend(); ++it) {
      if (it->first <= hi()) break;
      if (!stuck[static_cast<size_t>(it->second)]) {
        s = it->second;
        break;
      }
    }
    if (s < 0) break;
    ++iterations_;
    items(s, &segs);
    Pick best;
    // First to the mean (the reference's bound); when no slice fits that, anywhere in band.
    for (int pass = 0; pass < 2 && best.seg < 0; ++pass) {
      size_t n = 0;
      for (const auto& [l, d] : st_.by_load()) {
        if (n >= kDests || l >= (pass == 0 ? mean() : hi())) break;
        ++n;
        const double df = pass == 0 ? std::min(st_.load(s) - mean(), mean() - l)
                                    : std::min(st_.load(s) - lo(), hi() - l);
        for (int64_t id : segs) consider(id, d, df, &best);
      }
    }
    if (best.seg < 0) {
      stuck[static_cast<size_t>(s)] = 1;
      continue;
    }
    apply(best);
  }
  if (stats != nullptr) {
    stats->moves = st_.moves();
    stats->iterations = iterations_;
    stats->bytes_colocated = st_.bytes_start();
    stats->bytes_incremental = st_.bytes();
    stats->cost_incremental = st_.cost();
    stats->mean = mean();
    stats->load_max = st_.by_load().rbegin()->first;
    stats->load_min = st_.by_load().begin()->first;
    stats->balanced = stats->load_max <= (1.0 + tol_) * mean() && stats->load_min >= (1.0 - tol_) * mean();
  }
}

}  // namespace

Result<Schedule> schedule_cad_symmetric(const Batch& batch, const ScheduleOptions& options,
                                        CadStats* stats) {
  Symmetric planner(options.tolerance);
  DISTCA_RETURN_IF_ERROR(planner.state().init(batch, options));
  planner.run(stats);
  return Schedule{planner.state().tasks(), batch};
}

Result<Schedule> schedule_cad_symmetric(const Batch& batch, const ScheduleOptions& options) {
  return schedule_cad_symmetric(batch, options, nullptr);
}

}  // namespace distca
