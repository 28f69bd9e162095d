// Processor sharing: the host model and the fixed-point passes (sharing.h;
// docs/simulation-model.md, "Processor sharing").
#include "sharing.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "distca/core/check.h"
#include "engine.h"

namespace distca::sim {

namespace {

// The cores one computing rank of the profile keeps busy: its threads, or its CPU quota when
// that is less (a capped rank never runs faster than its quota, however many threads it has).
double rank_demand(const HardwareProfile& p) {
  const double T = static_cast<double>(std::max<int64_t>(p.threads_per_rank, 1));
  return p.cpu_quota > 0 ? std::min(T, p.cpu_quota) : T;
}

// The cores the profile's concurrent figures saw, over all its ranks: machine.cores, or in an
// oversubscribed profile timed with sleeping waiters ranks x threads x alone / concurrent.
// Alone, rank 0 had T cores of its own (the others slept); at once, each rank had its share
// of the cores the run got. Time-weighted over the products (the long ones dominate, the
// short ones are the noisy ones). Not clamped to machine.cores: a short timed call started
// by every rank at once can get more than a fair share of the cores (the ranks the scheduler
// runs first finish on a core of their own while the others wait for theirs).
double concurrent_cores(const HardwareProfile& p) {
  const auto cores = static_cast<double>(p.cores);
  const double T = rank_demand(p);
  // Under a CPU quota each rank had its quota whether the others computed or not: the run
  // had what the quotas add up to (at most the cores), not what alone / concurrent suggests.
  if (p.cpu_quota > 0) return std::min(cores, static_cast<double>(p.ranks) * T);
  // Only an oversubscribed run shares cores; with a core per rank what slows the concurrent
  // figures (memory bandwidth, caches) is not a share of a core.
  if (!p.alone_waiters_sleep || static_cast<double>(p.ranks) * T <= cores) return cores;
  double alone = 0, concurrent = 0;
  for (const GemmRecord& g : p.gemms) {
    alone += g.seconds_alone;
    concurrent += g.seconds_concurrent;
  }
  return std::clamp(static_cast<double>(p.ranks) * T * alone / concurrent, 1.0, static_cast<double>(p.ranks) * T);
}

}  // namespace

double profile_cores(const HardwareProfile& p) {
  return std::min(concurrent_cores(p), static_cast<double>(p.cores));
}

}  // namespace distca::sim

namespace distca::sim::detail {

double HostModel::speed(int64_t n) const {
  return std::min(1.0, cores / (static_cast<double>(std::max<int64_t>(n, 1)) * demand)) / base_share;
}

bool HostModel::active() const {
  // speed is non-increasing in n: its two ends decide.
  return speed(1) != 1.0 || speed(units_per_host) != 1.0;
}

Result<HostModel> host_model(const SimOptions& o) {
  HostModel h;
  for (auto [name, v] : {std::pair{"host_ranks", o.host_ranks}, {"host_cores", o.host_cores}}) {
    if (v < 0 || v > kMaxProfileCount) {
      return Status::invalid_argument(std::string(name) + " must be in 0..65536 (0: the hardware profile's; got " +
                                      std::to_string(v) + ")");
    }
  }
  const HardwareProfile* p = o.hardware_profile.get();
  if (p == nullptr) {
    if (o.host_ranks != 0 || o.host_cores != 0) {
      return Status::invalid_argument(
          "host_ranks / host_cores need a hardware profile (a preset's units are devices: they never share cores)");
    }
    return h;
  }
  const auto G = static_cast<double>(std::max<int64_t>(o.cluster.gpus_per_node, 1));
  const double T = rank_demand(*p);
  const int64_t ranks = o.host_ranks > 0 ? o.host_ranks : p->ranks;
  // A unit is G ranks' worth (the engines' rates are G x a rank's): a host of `ranks` ranks
  // holds ranks / G units (at least one), each keeping G x T cores busy while it computes.
  h.units_per_host = std::max<int64_t>(1, ranks / std::max<int64_t>(o.cluster.gpus_per_node, 1));
  const double cores = profile_cores(*p);
  h.cores = o.host_cores > 0 ? static_cast<double>(o.host_cores) : cores;
  h.demand = G * T;
  // The profile's concurrent figures: each of its ranks ran T threads on its share of the
  // cores those figures saw (more than cores / ranks when a timed call got more than a fair
  // share: then the sustained all-busy rate is slower than the concurrent figures).
  h.base_share = std::min(1.0, concurrent_cores(*p) / (static_cast<double>(p->ranks) * T));
  return h;
}

Sharing::Sharing(const HostModel& host, int64_t units)
    : host_(host), units_(units), prev_(static_cast<size_t>(units)), cur_(static_cast<size_t>(units)) {}

double Sharing::stretch(int64_t u, double start, double base) {
  std::vector<Span>& cur = cur_[static_cast<size_t>(u)];
  const size_t k = cur.size();
  double dur = base;
  if (base > 0 && passes_ > 0) {
    dur = solve(u, start, base);
    const std::vector<Span>& prev = prev_[static_cast<size_t>(u)];
    if (passes_ >= kUndampedSharingPasses && k < prev.size()) dur = 0.5 * (dur + (prev[k].end - prev[k].start));
  }
  cur.push_back({start, base > 0 ? start + dur : start});
  return dur;
}

// Walks the timelines of u's host-mates from `start`: between two of their boundaries the
// count n of computing units is constant, so work advances at speed(n) base-seconds per
// second. A host-mate's timeline is what it charged so far in this pass followed by the rest
// of its previous pass (clipped to start after the former; Gauss-Seidel: what is known of this
// pass is used, so a chain of dependent intervals settles in few passes; the rest is shifted
// by how far the host-mate's latest interval moved since the previous pass, so a timeline that
// slid as a whole is predicted where it now is). Lengths are summed
// piece by piece; a unit whose host-mates never change its speed (speed 1 throughout) gets
// exactly `base` back.
double Sharing::solve(int64_t u, double start, double base) const {
  const int64_t per = host_.units_per_host;
  const int64_t h0 = u / per * per, h1 = std::min(units_, h0 + per);
  struct View {
    const std::vector<Span>* cur;
    const std::vector<Span>* prev;
    double cut;    // the end of the last span charged this pass
    double shift;  // how far that span's end moved since the previous pass
    size_t size() const { return std::max(cur->size(), prev->size()); }
    Span at(size_t i) const {
      if (i < cur->size()) return (*cur)[i];
      const Span& p = (*prev)[i];
      return {std::max(p.start + shift, cut), std::max(p.end + shift, cut)};
    }
  };
  std::vector<View> views;
  std::vector<size_t> at;  // per host-mate: the first span ending after t (ends are sorted)
  for (int64_t v = h0; v < h1; ++v) {
    const std::vector<Span>& c = cur_[static_cast<size_t>(v)];
    const std::vector<Span>& p = prev_[static_cast<size_t>(v)];
    const size_t m = c.size();
    const View view{&c, &p, m == 0 ? 0.0 : c.back().end, m == 0 || m > p.size() ? 0.0 : c.back().end - p[m - 1].end};
    size_t lo = 0, hi = view.size();
    while (lo < hi) {
      const size_t mid = (lo + hi) / 2;
      if (view.at(mid).end <= start) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    views.push_back(view);
    at.push_back(lo);
  }
  double t = start, wall = 0, left = base;
  bool unit_speed = true;  // speed 1 all along: `base` itself, free of the pieces' rounding
  for (;;) {
    int64_t n = 1;
    double next = std::numeric_limits<double>::infinity();
    for (int64_t v = h0; v < h1; ++v) {
      if (v == u) continue;
      const View& view = views[static_cast<size_t>(v - h0)];
      size_t& i = at[static_cast<size_t>(v - h0)];
      while (i < view.size() && (view.at(i).end <= t || view.at(i).end <= view.at(i).start)) ++i;  // past or empty
      if (i == view.size()) continue;
      const Span sp = view.at(i);
      if (sp.start <= t) {
        ++n;
        next = std::min(next, sp.end);
      } else {
        next = std::min(next, sp.start);
      }
    }
    const double g = host_.speed(n);
    unit_speed = unit_speed && g == 1.0;
    if (!(next < std::numeric_limits<double>::infinity()) || (next - t) * g >= left) {
      return unit_speed ? base : wall + left / g;
    }
    left -= (next - t) * g;
    wall += next - t;
    t = next;
  }
}

bool Sharing::end_pass() {
  bool same = passes_ > 0;
  double scale = 0, moved = 0;
  for (size_t u = 0; u < cur_.size(); ++u) {
    const std::vector<Span>& c = cur_[u];
    const std::vector<Span>& p = prev_[u];
    if (c.size() != p.size()) same = false;
    for (size_t k = 0; k < c.size(); ++k) {
      scale = std::max(scale, std::abs(c[k].end));
      if (k < p.size()) moved = std::max({moved, std::abs(c[k].start - p[k].start), std::abs(c[k].end - p[k].end)});
    }
  }
  ++passes_;
  prev_.swap(cur_);
  for (std::vector<Span>& c : cur_) c.clear();
  return same && moved <= kSharingTolerance * scale;
}

Status run_shared(Rates& rates, const std::function<Status(const Rates&, SimResult&)>& engine, SimResult& r) {
  if (!rates.host.active()) return engine(rates, r);
  Sharing sharing(rates.host, rates.units);
  rates.sharing = &sharing;
  Status st;
  for (;;) {
    SimResult pass;
    st = engine(rates, pass);
    if (!st.ok()) break;
    const bool converged = sharing.end_pass();
    r = std::move(pass);
    r.sharing_passes = sharing.passes();
    r.sharing_converged = converged;
    if (converged || sharing.passes() >= kMaxSharingPasses) break;
  }
  rates.sharing = nullptr;
  return st;
}

}  // namespace distca::sim::detail
