// `cad`: the communication-aware greedy scheduler. The algorithm (levels, donor and receiver
// phases, why it stops) and schedule_cad's candidate ladder (why the bytes never rise with the
// tolerance) are docs/scheduler.md, "cad" and "cad: candidate plans, tolerance monotonicity
// and bytes"; the comments below say what each piece does.
#include <algorithm>
#include <cmath>
#include <limits>

#include "cad_state.h"
#include "distca/plan/cad.h"
#include "distca/plan/split.h"

namespace distca {
namespace {

using cad_internal::State;

constexpr int64_t kMin = kMinChunkRows;
// Candidate widths: wider spreads a donor's work in smaller chunks, which costs more bytes
// (docs/scheduler.md).
constexpr size_t kSegCandidates = 2;   // home segments considered per source
constexpr size_t kLeastLoaded = 1;     // least loaded destinations considered per donor
constexpr size_t kMostLoaded = 4;      // most loaded sources considered per receiver
constexpr size_t kReusePerDoc = 8;     // context-holding servers considered per document
constexpr double kHostInset = 0.25;    // hosts_first's levels: this share of the way to the mean
constexpr double kHostMinShare = 0.05;  // hosts_first's chunks across hosts: at least this of the mean

struct Levels {
  double mean = 0, hi = 0, lo = 0;
};

Levels levels(const State& st, double tol) {
  Levels l;
  l.mean = st.mean();
  const double margin = std::min(0.002, tol / 4.0);
  const double up = 1.0 + tol - margin;
  const double down = 1.0 - tol + margin;
  l.hi = up * l.mean;
  l.lo = down * l.mean;
  if (st.integral()) {  // pairs are integers: keep the band's integer points only
    l.hi = std::floor(l.hi);
    l.lo = std::ceil(l.lo);
  }
  return l;
}

// The water level w with sum((load - w)+) = y over `loads` (y <= sum of loads).
double water_level(std::vector<double> loads, double y) {
  std::sort(loads.begin(), loads.end(), std::greater<>());
  double prefix = 0;
  for (size_t k = 0; k < loads.size(); ++k) {
    prefix += loads[k];
    const double w = (prefix - y) / static_cast<double>(k + 1);
    if (k + 1 == loads.size() || w >= loads[k + 1]) return w;
  }
  return 0;
}

struct Candidate {
  int64_t seg = -1, dest = -1, x = 0, y = 0;
  double gain = 0;
  int64_t dbytes = 0;  // priced (HostTopology): the bytes themselves without a topology
  double ratio() const { return static_cast<double>(dbytes) / gain; }
};

// Lower bytes per unit of work first; ties: more work, lower destination, lower segment,
// higher top (a total order, so the choice never depends on the enumeration order).
bool better(const Candidate& c, const Candidate& best) {
  if (best.seg < 0) return true;
  const double rc = c.ratio(), rb = best.ratio();
  if (rc != rb) return rc < rb;
  if (c.gain != best.gain) return c.gain > best.gain;
  if (c.dest != best.dest) return c.dest < best.dest;
  if (c.seg != best.seg) return c.seg < best.seg;
  return c.y > best.y;
}

class Planner {
 public:
  // `state` is the caller's scratch (reused between calls, see schedule_cad).
  // Plans with the band of `tolerance` and stops at the first state inside the band of
  // `stop` (>= tolerance).
  // `hosts_first` (with a topology): a donor whose host holds more than its servers may sends
  // that excess to other hosts before it moves work inside its host, filling servers of other
  // hosts only up to lo while they are below it: the fewest rows, those with the most work per
  // row, cross hosts, and a host's servers share the K/V that crosses once (docs/scheduler.md,
  // "cad: topology-aware placement").
  Planner(double tolerance, double stop, int64_t align, bool hosts_first, State* state)
      : st_(*state), tol_(tolerance), stop_(stop), hosts_first_(hosts_first), align_(align) {}

  // Plans; true when it ended inside the band of `stop`. `moves` (may be null) receives the
  // moves in order (replaying them on the restarted state rebuilds the plan).
  bool run(CadStats* stats, std::vector<Candidate>* moves);

 private:
  void donor_phase();
  void receiver_phase();
  // Adds the best chunk of segment `id` (home = its rank) going to `dest` to `best`: wants
  // `want` work, accepts at most `cap` (both > 0).
  // `top_only`: the chunk ending at the segment's top alone (the most work per row).
  void consider(int64_t id, int64_t dest, double want, double cap, Candidate* best, bool top_only = false);
  std::optional<std::pair<int64_t, int64_t>> fit(int64_t id, int64_t y, double want, double cap) const;
  // Every load inside the band of `stop_`.
  bool stopped() const;
  // Server s may receive in the donor phase: it never was a donor, or (hosts_first) it was
  // but gave to another host below lo, and its host mates refill it.
  bool destination(int64_t s, const Levels& lv) const {
    return !donor_[static_cast<size_t>(s)] || (hosts_first_ && st_.load(s) < lv.lo);
  }
  // The load of r's host above `hi` per server (negative: below).
  double host_excess(int64_t r, double hi) const;
  // hosts_first: while the donor's host holds more than its servers may (`hi` each), that
  // excess (`cross`) goes to other hosts first, in the chunks that carry the most work per
  // row, filling their servers to `lo`. The levels sit a quarter of the way from the band's
  // edges to the mean, so that rounding (chunks carry at least what they are asked) leaves no
  // server just outside the band, which would pull a last small chunk across hosts.
  struct HostLevels {
    double hi = 0, lo = 0, cross = 0;
  };
  HostLevels host_levels(int64_t r, const Levels& lv) const;
  // The donor phase's candidates for segment `id`: to `least` and to the servers holding
  // context of its document, wanting at most `excess`; `cross_only`: to other hosts' servers
  // below hl.lo, up to it, the segment's top chunk only.
  void donor_candidates(int64_t id, const std::vector<int64_t>& least, const Levels& lv, const HostLevels& hl,
                        double excess, bool cross_only, Candidate* best);
  void apply(const Candidate& c);
  // Up to kSegCandidates alive segments of rank r with the highest tops (cached per rank until
  // a move takes rows from it).
  void top_segments(int64_t r, std::vector<int64_t>* out);

  // Cut points on multiples of align_ (ScheduleOptions::align_rows).
  int64_t down(int64_t v) const { return v / align_ * align_; }
  int64_t up(int64_t v) const { return (v + align_ - 1) / align_ * align_; }

  State& st_;
  double tol_;
  double stop_;
  bool hosts_first_;
  bool done_ = false;  // inside the band of stop_: no further move
  std::vector<Candidate>* moves_ = nullptr;
  int64_t align_ = 1;
  int64_t iterations_ = 0;
  int64_t cap_iterations_ = 0;
  std::vector<char> donor_;  // [ranks] took part as a donor: never a destination
  std::vector<int64_t> top_version_;  // [ranks] rank_version of the cached top (-1: none)
  std::vector<int64_t> top_;          // [ranks * kSegCandidates] cached top segments (-1: none)
  std::vector<int64_t> scratch_, servers_, homes_;
};

bool Planner::stopped() const {
  const Levels lv = levels(st_, stop_);
  return st_.by_load().rbegin()->first <= lv.hi && st_.by_load().begin()->first >= lv.lo;
}

double Planner::host_excess(int64_t r, double hi) const {
  double e = 0;
  for (int64_t s = 0; s < st_.ranks(); ++s) {
    if (st_.same_host(s, r)) e += st_.load(s) - hi;
  }
  return e;
}

void Planner::apply(const Candidate& c) {
  st_.move(c.seg, c.dest, c.x, c.y);
  if (moves_ != nullptr) moves_->push_back(c);
  done_ = stopped();
}

void Planner::top_segments(int64_t r, std::vector<int64_t>* out) {
  const auto ru = static_cast<size_t>(r);
  int64_t* top = top_.data() + ru * kSegCandidates;
  if (top_version_[ru] != st_.rank_version(r)) {
    // One pass keeping the best few: the ranks hold ~100 segments each on ProLong-like batches,
    // and the phases ask for the same ranks' tops again and again.
    auto higher = [&](int64_t p, int64_t q) {
      const auto& a = st_.seg(p);
      const auto& b = st_.seg(q);
      return a.b != b.b ? a.b > b.b : p < q;
    };
    size_t n = 0;
    for (const int32_t id : st_.rank_segs(r)) {
      if (n == kSegCandidates && !higher(id, top[n - 1])) continue;
      if (n < kSegCandidates) ++n;
      size_t i = n - 1;  // insertion into the sorted prefix
      for (; i > 0 && higher(id, top[i - 1]); --i) top[i] = top[i - 1];
      top[i] = id;
    }
    for (size_t i = n; i < kSegCandidates; ++i) top[i] = -1;
    top_version_[ru] = st_.rank_version(r);
  }
  out->clear();
  for (size_t i = 0; i < kSegCandidates && top[i] >= 0; ++i) out->push_back(top[i]);
}

std::optional<std::pair<int64_t, int64_t>> Planner::fit(int64_t id, int64_t y, double want,
                                                        double cap) const {
  const auto& g = st_.seg(id);
  const auto w = st_.work(g.doc);
  const int64_t a = g.a, b = g.b;
  if (y <= a || y > b || (y < b && (b - y < kMin || y % align_ != 0))) return std::nullopt;
  // Aligned starts round down (the chunk carries at least `want`), or up when that exceeds cap.
  int64_t x = w.start_for(a, y, want);
  if (y - x < kMin) x = std::max(a, y - kMin);
  x = std::max(a, down(x));
  if (x > a && x - a < kMin) x = a;
  if (w(x, y) > cap) {
    // Too much: the largest chunk within cap, keeping the lower remainder legal.
    x = w.start_for(a, y, cap);
    if (w(x, y) > cap) ++x;
    if (x > a && x - a < kMin) x = a + kMin;
    x = up(x);
    if (x >= y || w(x, y) > cap) return std::nullopt;
  }
  const bool whole = x == a && y == b;
  if (y - x < kMin && !whole) return std::nullopt;
  return std::make_pair(x, y);
}

void Planner::consider(int64_t id, int64_t dest, double want, double cap, Candidate* best, bool top_only) {
  const auto& g = st_.seg(id);
  if (dest == g.rank) return;
  const int64_t nd = st_.need(g.doc, dest);
  int64_t tops[7];
  int n = 0;
  tops[n++] = g.b;
  // The lowest chunk: the fewest pairs per row, for when a small want must fit a small cap.
  // Only taken when it carries the whole want (so it finishes a donor, a receiver or a
  // destination's room), else it would crawl in tiny steps.
  int bottom = -1;
  if (g.b - g.a >= 2 * kMin) {
    bottom = n;
    tops[n++] = up(g.a + kMin);
  }
  // Appendix B: in pairs the continuous optimum; with a cost model the pairs that `want`
  // corresponds to at this segment's rate (an estimate; the exact bytes decide anyway).
  double want_pairs = want;
  if (!st_.work(g.doc).is_pairs()) {
    const double c = st_.work(g.doc)(g.a, g.b);
    if (c > 0) want_pairs = want * static_cast<double>(causal_pairs(g.a, g.b)) / c;
  }
  if (want_pairs >= 1) {
    const double star = appendix_b_top(want_pairs, {st_.s_q(), st_.s_kv()});
    auto y = static_cast<int64_t>(std::min(star, static_cast<double>(g.b)));
    y = std::max(y, nd);
    if (y < g.b && g.b - y < kMin) y = g.b - kMin;
    if (y > g.a && y < g.b) {
      // Unaligned: both neighbours (the lower one stays within context the destination has).
      tops[n++] = down(y);
      if (y % align_ != 0) tops[n++] = up(y);
    }
  }
  if (nd > g.a && nd < g.b && g.b - nd >= kMin) tops[n++] = down(nd);
  // With a topology, the end of the context the destination's host has: the rows below it
  // cross no host boundary again (topology_relay.h).
  if (st_.priced()) {
    const int64_t eh = st_.host_need(g.doc, st_.host_of(dest));
    if (eh > nd && eh > g.a && eh < g.b && g.b - eh >= kMin) tops[n++] = down(eh);
  }
  if (top_only) n = 1;
  for (int i = 0; i < n; ++i) {
    const auto xy = fit(id, tops[i], want, cap);
    if (!xy) continue;
    Candidate c;
    c.seg = id;
    c.dest = dest;
    c.x = xy->first;
    c.y = xy->second;
    c.gain = st_.dest_gain(g.doc, c.x, c.y);
    if (c.gain <= 0 || (i == bottom && c.gain < want)) continue;
    c.dbytes = st_.delta_bytes(id, dest, c.x, c.y).cost;
    // No move lowers the bytes, so they never fall along the sequence (schedule_cad's
    // monotonicity argument). Such moves are rare: a short tail of a document going back to
    // the rank that holds the rest.
    if (c.dbytes < 0) continue;
    if (better(c, *best)) *best = c;
  }
}

Planner::HostLevels Planner::host_levels(int64_t r, const Levels& lv) const {
  HostLevels hl;
  hl.hi = lv.hi - kHostInset * (lv.hi - lv.mean);
  hl.lo = lv.lo + kHostInset * (lv.mean - lv.lo);
  // Only while the host holds more than hi per server does anything have to leave it; then
  // it sheds down to hl.hi.
  hl.cross = hosts_first_ && host_excess(r, lv.hi) > 0 ? host_excess(r, hl.hi) : 0;
  return hl;
}

void Planner::donor_candidates(int64_t id, const std::vector<int64_t>& least, const Levels& lv, const HostLevels& hl,
                               double excess, bool cross_only, Candidate* best) {
  const int64_t home = st_.seg(id).rank;
  // ... plus the servers already holding context of this segment's document.
  st_.context_servers(st_.seg(id).doc, &servers_);
  scratch_ = least;
  size_t reuse = 0;
  for (int64_t s : servers_) {
    if (reuse >= kReusePerDoc) break;
    if (!destination(s, lv) || st_.load(s) >= lv.hi) continue;
    if (std::find(least.begin(), least.end(), s) == least.end()) scratch_.push_back(s);
    ++reuse;
  }
  for (int64_t d : scratch_) {
    const bool remote = !st_.same_host(d, home);
    const double room = lv.hi - st_.load(d);
    const double to_lo = hl.lo - st_.load(d);
    if (cross_only && (!remote || to_lo <= 0)) continue;
    // Across hosts the home may fall below lo: its host holds enough to fill it up again.
    const double cap = cross_only ? std::min(room, excess) : std::min(room, st_.load(home) - lv.lo);
    const double want = std::min(excess, hosts_first_ && remote && to_lo > 0 ? to_lo : room);
    // A small remainder is left to the usual candidates (every top, either host): a segment's
    // top chunk for little work would drag its whole context across.
    if (want <= 0 || cap <= 0 || (cross_only && want < kHostMinShare * lv.mean)) continue;
    consider(id, d, want, cap, best, cross_only);
  }
}

void Planner::donor_phase() {
  Levels lv = levels(st_, tol_);
  double excess = 0, deficit = 0;
  std::vector<double> loads(static_cast<size_t>(st_.ranks()));
  for (int64_t r = 0; r < st_.ranks(); ++r) {
    loads[static_cast<size_t>(r)] = st_.load(r);
    excess += std::max(0.0, st_.load(r) - lv.hi);
    deficit += std::max(0.0, lv.lo - st_.load(r));
  }
  const bool to_water = excess < deficit;
  double target = lv.hi;
  if (to_water) {
    target = std::max(lv.lo, water_level(loads, deficit));
    if (st_.integral()) target = std::ceil(target);
  }
  std::set<std::pair<double, int64_t>> donors;
  for (int64_t r = 0; r < st_.ranks(); ++r) {
    if (st_.load(r) > target) {
      donors.emplace(st_.load(r), r);
      donor_[static_cast<size_t>(r)] = 1;
    }
  }
  std::vector<int64_t> segs;
  while (!donors.empty() && !done_ && iterations_ < cap_iterations_) {
    const int64_t r = donors.rbegin()->second;
    donors.erase(std::prev(donors.end()));
    lv = levels(st_, tol_);
    const double tgt = to_water ? std::min(target, lv.hi) : lv.hi;
    const double excess_r = st_.load(r) - tgt;
    if (excess_r <= 0) continue;
    ++iterations_;
    // Destinations: the least loaded non-donors with room ...
    std::vector<int64_t> least;
    for (const auto& [l, s] : st_.by_load()) {
      if (least.size() >= kLeastLoaded || l >= lv.hi) break;
      if (destination(s, lv)) least.push_back(s);
    }
    // With a topology, also the least loaded of the donor's own host (cheap bytes), and with
    // hosts_first the least loaded of another host.
    for (const bool own : {true, false}) {
      for (const auto& [l, s] : st_.by_load()) {
        if (!st_.priced() || l >= lv.hi || (!own && !hosts_first_)) break;
        if (!destination(s, lv) || st_.same_host(s, r) != own) continue;
        if (std::find(least.begin(), least.end(), s) == least.end()) least.push_back(s);
        break;
      }
    }
    const HostLevels hl = host_levels(r, lv);
    Candidate best;
    for (int pass = hl.cross > 0 ? 0 : 1; pass < 2 && best.seg < 0; ++pass) {
      // Pass 0 (hosts_first, the host holding too much): chunks of any server of r's host.
      homes_.assign(1, r);
      if (pass == 0) {
        for (int64_t s = 0; s < st_.ranks(); ++s) {
          if (s != r && st_.same_host(s, r)) homes_.push_back(s);
        }
      }
      for (const int64_t home : homes_) {
        top_segments(home, &segs);
        for (int64_t id : segs) donor_candidates(id, least, lv, hl, pass == 0 ? hl.cross : excess_r, pass == 0, &best);
      }
    }
    if (best.seg < 0) continue;  // nothing fits: this donor stays as it is
    apply(best);
    if (st_.load(r) > tgt) donors.emplace(st_.load(r), r);
  }
}

void Planner::receiver_phase() {
  std::vector<char> stuck(static_cast<size_t>(st_.ranks()), 0);
  std::vector<int64_t> segs, sources;
  while (!done_ && iterations_ < cap_iterations_) {
    const Levels lv = levels(st_, tol_);
    int64_t s = -1;
    for (const auto& [l, r] : st_.by_load()) {
      if (l >= lv.lo) break;
      if (!stuck[static_cast<size_t>(r)]) {
        s = r;
        break;
      }
    }
    if (s < 0) break;
    ++iterations_;
    const double need = lv.lo - st_.load(s);
    const double room = lv.hi - st_.load(s);
    Candidate best;
    auto try_seg = [&](int64_t id) {
      const int64_t src = st_.seg(id).rank;
      if (src == s) return;
      const double give = st_.load(src) - lv.lo;
      if (give <= 0) return;
      const double cap = std::min(room, give);
      consider(id, s, std::min(need, cap), cap, &best);
    };
    // Sources: the most loaded servers ...
    sources.clear();
    for (auto it = st_.by_load().rbegin(); it != st_.by_load().rend(); ++it) {
      if (sources.size() >= kMostLoaded || it->first <= lv.lo) break;
      if (it->second != s) sources.push_back(it->second);
    }
    // With a topology, also the most loaded of the receiver's own host (cheap bytes).
    for (auto it = st_.by_load().rbegin(); st_.priced() && it != st_.by_load().rend(); ++it) {
      if (it->first <= lv.lo) break;
      if (it->second == s || !st_.same_host(it->second, s)) continue;
      if (std::find(sources.begin(), sources.end(), it->second) == sources.end()) sources.push_back(it->second);
      break;
    }
    for (int64_t src : sources) {
      top_segments(src, &segs);
      for (int64_t id : segs) try_seg(id);
    }
    // ... and the homes of documents whose context this server already has.
    for (int64_t d : st_.server_docs(s)) {
      st_.doc_segs(d, &scratch_);
      for (size_t i = 0; i < scratch_.size() && i < kReusePerDoc; ++i) try_seg(scratch_[i]);
    }
    if (best.seg < 0) {
      stuck[static_cast<size_t>(s)] = 1;
      continue;
    }
    apply(best);
  }
}

bool Planner::run(CadStats* stats, std::vector<Candidate>* moves) {
  moves_ = moves;
  if (moves_ != nullptr) moves_->clear();
  donor_.assign(static_cast<size_t>(st_.ranks()), 0);
  top_version_.assign(static_cast<size_t>(st_.ranks()), -1);
  top_.assign(static_cast<size_t>(st_.ranks()) * kSegCandidates, -1);
  cap_iterations_ = 16 * (st_.ranks() + st_.num_pieces()) + 1024;
  iterations_ = 0;
  done_ = stopped();
  if (!done_) donor_phase();
  if (!done_) receiver_phase();
  done_ = stopped();
  if (stats != nullptr) {
    const Levels lv = levels(st_, stop_);
    stats->moves = st_.moves();
    stats->iterations = iterations_;
    stats->bytes_colocated = st_.bytes_start();
    stats->bytes_incremental = st_.bytes();
    stats->cost_incremental = st_.cost();
    stats->mean = lv.mean;
    stats->load_max = st_.by_load().rbegin()->first;
    stats->load_min = st_.by_load().begin()->first;
    stats->balanced = stats->load_max <= (1.0 + stop_) * lv.mean && stats->load_min >= (1.0 - stop_) * lv.mean;
  }
  return done_;
}

// The planning tolerances schedule_cad tries; each one up to the requested tolerance costs one
// more search (docs/scheduler.md has the measurements behind the choice).
constexpr double kLadder[] = {0.0, 0.05, 0.15, 0.4};
// The bands of the tightening candidate, widest first (docs/scheduler.md, "Tightening").
constexpr double kTighten[] = {0.05, 0.04, 0.03, 0.02, 0.01, 0.005, 0.0};

// The greedy with the band of each kTighten entry in turn, every run continuing from the state
// the previous one left, each stopped at its first state inside the band of `stop`. A narrow
// band from the colocated start caps every move at the mean and can stop far from it where
// chunks are coarse; from a state inside a wider band the excess left is small and the narrow
// band's moves fit. `moves` receives every run's moves in order; true when it ended inside the
// band of `stop`.
bool run_tightening(double stop, int64_t align, bool hosts_first, State* state, CadStats* stats,
                    std::vector<Candidate>* moves) {
  thread_local std::vector<Candidate> part;
  moves->clear();
  bool in_band = false;
  int64_t iterations = 0;
  for (const double g : kTighten) {
    Planner planner(g, stop, align, hosts_first, state);
    in_band = planner.run(stats, &part);  // its moves count every move since the restart
    moves->insert(moves->end(), part.begin(), part.end());
    iterations += stats->iterations;
    if (in_band) break;
  }
  stats->iterations = iterations;
  return in_band;
}

}  // namespace

Result<Schedule> schedule_cad(const Batch& batch, const ScheduleOptions& options, CadStats* stats) {
  // One State per thread, reused: its arrays keep their capacity, so planning batch after
  // batch touches no fresh memory (the function stays pure; init starts the state afresh).
  thread_local State scratch;
  DISTCA_RETURN_IF_ERROR(scratch.init(batch, options));
  const double tol = options.tolerance;
  // Candidates: for every ladder tolerance g <= tol, the greedy planned with band g, stopped
  // at its first state inside the band of tol; the tightening candidate follows the band-0
  // greedy below 0.05, and above it when that greedy ends outside the band. Inside the band
  // the fewest bytes win; outside it the smallest largest load, then the fewest bytes (ties:
  // the later candidate, the widest g).
  // The widest is tried last (most often the cheapest): the last candidate is kept as it is,
  // an earlier one is rebuilt by replaying its moves.
  // With a topology every band runs twice: as without one, and with hosts_first (Planner).
  struct Run {
    double band;
    bool hosts_first;
    bool tighten = false;
  };
  std::vector<Run> ladder;
  for (const double g : kLadder) {
    if (g > tol) continue;
    if (scratch.priced()) ladder.push_back({g, true});
    ladder.push_back({g, false});
  }
  thread_local std::vector<Candidate> moves, best_moves;
  int best = -1;
  int64_t best_bytes = 0;
  double best_top = 0;
  bool best_in_band = false;
  for (size_t i = 0; i < ladder.size(); ++i) {
    if (i > 0) scratch.restart();
    const Run run = ladder[i];
    CadStats st;
    bool in_band = false;
    if (run.tighten) {
      in_band = run_tightening(tol, options.align_rows, run.hosts_first, &scratch, &st, &moves);
    } else {
      Planner planner(run.band, tol, options.align_rows, run.hosts_first, &scratch);
      in_band = planner.run(&st, &moves);
      // Below the ladder's 0.05 always (so the bytes stay monotone in the tolerance,
      // docs/scheduler.md), above it when the band-0 run missed the band.
      if (run.band == 0.0 && (!in_band || tol < kTighten[0])) {
        ladder.insert(ladder.begin() + static_cast<std::ptrdiff_t>(i) + 1, {0.0, run.hosts_first, true});
      }
    }
    const double top = scratch.by_load().rbegin()->first;
    // A candidate inside the band beats one outside it whatever their bytes.
    bool wins = best < 0 || (in_band && !best_in_band);
    if (!wins && in_band == best_in_band) {
      const int64_t bytes = scratch.cost();
      wins = in_band ? bytes <= best_bytes : top < best_top || (top == best_top && bytes <= best_bytes);
    }
    if (wins) {
      best = static_cast<int>(i);
      best_bytes = scratch.cost();
      best_top = top;
      best_in_band = in_band;
      if (stats != nullptr) *stats = st;
      std::swap(moves, best_moves);
    }
  }
  const int count = static_cast<int>(ladder.size());
  if (stats != nullptr) stats->runs = count;
  if (best != count - 1) {
    scratch.restart();
    for (const Candidate& c : best_moves) scratch.move(c.seg, c.dest, c.x, c.y);
  }
  return Schedule{scratch.tasks(), batch};
}

Result<Schedule> schedule_cad(const Batch& batch, const ScheduleOptions& options) {
  return schedule_cad(batch, options, nullptr);
}

}  // namespace distca
