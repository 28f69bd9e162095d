// The network model (network.h; docs/simulation-model.md, "Communication").
#include "network.h"

#include <algorithm>
#include <iterator>

#include "distca/core/check.h"

namespace distca::sim::detail {

double Link::effective_bandwidth(double bytes) const {
  const double t = message_seconds(bytes);
  return t > 0 ? bytes / t : 0.0;
}

void PeerLists::reset(int64_t units) {
  DISTCA_CHECK(units >= 0 && units <= (int64_t{1} << 32));
  units_ = units;
  std::vector<uint64_t>().swap(pairs_);
  normalized_ = true;
}

void PeerLists::add(int64_t from, int64_t to) {
  DISTCA_CHECK(from >= 0 && from < units_ && to >= 0 && to < units_);
  if (from == to) return;
  pairs_.push_back(pack(from, to));
  normalized_ = false;
}

void PeerLists::normalize() {
  if (normalized_) return;
  std::sort(pairs_.begin(), pairs_.end());
  pairs_.erase(std::unique(pairs_.begin(), pairs_.end()), pairs_.end());
  normalized_ = true;
}

void PeerLists::merge(const PeerLists& other) {
  DISTCA_CHECK(other.units_ == units_);
  DISTCA_CHECK(normalized_ && other.normalized_);
  if (other.pairs_.empty()) return;
  std::vector<uint64_t> out;
  out.reserve(pairs_.size() + other.pairs_.size());
  std::set_union(pairs_.begin(), pairs_.end(), other.pairs_.begin(), other.pairs_.end(), std::back_inserter(out));
  pairs_ = std::move(out);
}

PeerLists PeerLists::transposed() const {
  DISTCA_CHECK(normalized_);
  // Walking the pairs in (from, to) order and placing each under its `to` (a counting sort)
  // leaves every new row sorted by from: no sort needed.
  std::vector<int64_t> start(static_cast<size_t>(units_) + 1, 0);
  for (const uint64_t p : pairs_) ++start[static_cast<size_t>(p & 0xffffffffu) + 1];
  for (size_t u = 1; u < start.size(); ++u) start[u] += start[u - 1];
  PeerLists t(units_);
  t.pairs_.resize(pairs_.size());
  for (const uint64_t p : pairs_) {
    const auto to = static_cast<size_t>(p & 0xffffffffu);
    t.pairs_[static_cast<size_t>(start[to]++)] = pack(static_cast<int64_t>(to), static_cast<int64_t>(p >> 32));
  }
  return t;
}

bool PeerLists::has(int64_t from, int64_t to) const {
  DISTCA_CHECK(normalized_);
  DISTCA_CHECK(from >= 0 && from < units_ && to >= 0 && to < units_);
  return std::binary_search(pairs_.begin(), pairs_.end(), pack(from, to));
}

void PeerLists::add_counts(std::vector<int64_t>& sends, std::vector<int64_t>& receives) const {
  DISTCA_CHECK(normalized_);
  DISTCA_CHECK(static_cast<int64_t>(sends.size()) == units_ && static_cast<int64_t>(receives.size()) == units_);
  for (const uint64_t p : pairs_) {
    ++sends[static_cast<size_t>(p >> 32)];
    ++receives[static_cast<size_t>(p & 0xffffffffu)];
  }
}

void PeerLists::counts(std::vector<int64_t>& sends, std::vector<int64_t>& receives) const {
  sends.assign(static_cast<size_t>(units_), 0);
  receives.assign(static_cast<size_t>(units_), 0);
  add_counts(sends, receives);
}

void add_plan_peers(const DocumentIndex& index, const std::vector<TaskPlacement>& tasks,
                    const std::vector<int64_t>* unit_of, PeerLists& dispatch, PeerLists& queries) {
  auto unit = [&](int64_t rank) { return unit_of != nullptr ? (*unit_of)[static_cast<size_t>(rank)] : rank; };
  for (const TaskPlacement& t : tasks) {
    const int64_t srv = unit(t.server);
    if (t.home != t.server) {
      queries.add(unit(t.home), srv);
      dispatch.add(unit(t.home), srv);
    }
    for (const HeldRun& run : index.runs(t.doc)) {
      if (run.begin >= t.q_end) break;  // runs are sorted by begin
      if (run.rank != t.server) dispatch.add(unit(run.rank), srv);
    }
  }
  dispatch.normalize();
  queries.normalize();
}

double all_to_all_unit_seconds(const Link& link, double sent, double recv, int64_t sends, int64_t receives) {
  const double out = static_cast<double>(sends) * link.latency + std::max(sent, 0.0) / link.bytes_per_second;
  const double in = static_cast<double>(receives) * link.latency + std::max(recv, 0.0) / link.bytes_per_second;
  return std::max(out, in);
}

double ring_all_reduce_seconds(const Link& link, int64_t n, double data, double* moved) {
  const auto nn = static_cast<double>(n);
  const double m = n > 1 && data > 0 ? 2.0 * (nn - 1.0) / nn * data : 0.0;
  if (moved != nullptr) *moved = m;
  if (!(m > 0)) return 0.0;
  return 2.0 * (nn - 1.0) * link.latency + m / link.bytes_per_second;
}

}  // namespace distca::sim::detail
