// The network model (network.h; docs/simulation-model.md, "Communication").
#include "network.h"

#include <algorithm>
#include <bit>

namespace distca::sim::detail {

double Link::effective_bandwidth(double bytes) const {
  const double t = message_seconds(bytes);
  return t > 0 ? bytes / t : 0.0;
}

void PeerMatrix::reset(int64_t units) {
  units_ = units;
  words_ = static_cast<size_t>((units + 63) / 64);
  bits_.assign(static_cast<size_t>(units) * words_, 0);
}

void PeerMatrix::merge(const PeerMatrix& other) {
  for (size_t i = 0; i < bits_.size(); ++i) bits_[i] |= other.bits_[i];
}

PeerMatrix PeerMatrix::transposed() const {
  PeerMatrix t(units_);
  for (int64_t from = 0; from < units_; ++from) {
    for (int64_t to = 0; to < units_; ++to) {
      if (has(from, to)) t.add(to, from);
    }
  }
  return t;
}

bool PeerMatrix::empty() const {
  return std::all_of(bits_.begin(), bits_.end(), [](uint64_t w) { return w == 0; });
}

void PeerMatrix::counts(std::vector<int64_t>& sends, std::vector<int64_t>& receives) const {
  sends.assign(static_cast<size_t>(units_), 0);
  receives.assign(static_cast<size_t>(units_), 0);
  for (int64_t from = 0; from < units_; ++from) {
    for (size_t w = 0; w < words_; ++w) {
      uint64_t word = bits_[static_cast<size_t>(from) * words_ + w];
      sends[static_cast<size_t>(from)] += std::popcount(word);
      while (word != 0) {
        const int b = std::countr_zero(word);
        ++receives[w * 64 + static_cast<size_t>(b)];
        word &= word - 1;
      }
    }
  }
}

void add_plan_peers(const DocumentIndex& index, const std::vector<TaskPlacement>& tasks,
                    const std::vector<int64_t>* unit_of, PeerMatrix& dispatch, PeerMatrix& queries) {
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
}

double all_to_all_unit_seconds(const Link& link, double sent, double recv, int64_t sends, int64_t receives) {
  const double out = static_cast<double>(sends) * link.latency + std::max(sent, 0.0) / link.bytes_per_second;
  const double in = static_cast<double>(receives) * link.latency + std::max(recv, 0.0) / link.bytes_per_second;
  return std::max(out, in);
}

double all_to_all_seconds(const Link& link, int64_t n, const std::vector<double>& bytes,
                          std::vector<double>* unit_seconds) {
  const auto N = static_cast<size_t>(n);
  std::vector<double> sent(N, 0.0), recv(N, 0.0);
  std::vector<int64_t> sends(N, 0), receives(N, 0);
  for (size_t i = 0; i < N; ++i) {
    for (size_t j = 0; j < N; ++j) {
      const double b = bytes[i * N + j];
      if (i == j || !(b > 0)) continue;
      sent[i] += b;
      recv[j] += b;
      ++sends[i];
      ++receives[j];
    }
  }
  double worst = 0;
  if (unit_seconds != nullptr) unit_seconds->assign(N, 0.0);
  for (size_t i = 0; i < N; ++i) {
    const double t = all_to_all_unit_seconds(link, sent[i], recv[i], sends[i], receives[i]);
    if (unit_seconds != nullptr) (*unit_seconds)[i] = t;
    worst = std::max(worst, t);
  }
  return worst;
}

double ring_seconds(const Link& link, int64_t ring, double sent, double recv) {
  const double b = std::max(sent, recv);
  if (ring <= 1 || !(b > 0)) return 0.0;
  return static_cast<double>(ring - 1) * link.latency + b / link.bytes_per_second;
}

double ring_all_reduce_seconds(const Link& link, int64_t n, double data, double* moved) {
  const auto nn = static_cast<double>(n);
  const double m = n > 1 && data > 0 ? 2.0 * (nn - 1.0) / nn * data : 0.0;
  if (moved != nullptr) *moved = m;
  if (!(m > 0)) return 0.0;
  return 2.0 * (nn - 1.0) * link.latency + m / link.bytes_per_second;
}

}  // namespace distca::sim::detail
