// The link model of one exchange (include/distca/plan/link_model.h).
#include "distca/plan/link_model.h"

#include <algorithm>

#include "distca/core/check.h"
#include "distca/plan/topology.h"

namespace distca {

ExchangeLinks::ExchangeLinks(int64_t ranks, const std::vector<int64_t>& hosts, const LinkRates& rates)
    : hosts_(!hosts.empty()),
      rates_(rates),
      out_free_(static_cast<size_t>(std::max<int64_t>(ranks, 0)), {0.0, 0.0}),
      in_free_(out_free_) {
  DISTCA_CHECK(ranks >= 1);
  DISTCA_CHECK(hosts.empty() || static_cast<int64_t>(hosts.size()) == ranks);
  DISTCA_CHECK(rates.inter_host_bytes_per_second > 0 && rates.message_seconds >= 0);
  DISTCA_CHECK(hosts.empty() || rates.intra_host_bytes_per_second > 0);
  // Canonical ids lie in [0, ranks): they index the host's class-1 directions.
  if (hosts_) host_ = canonical_hosts(hosts);
  endpoint_.resize(static_cast<size_t>(ranks));
  for (size_t r = 0; r < endpoint_.size(); ++r) endpoint_[r] = hosts_ ? static_cast<size_t>(host_[r]) : r;
}

ExchangeTimes ExchangeLinks::post(const std::vector<double>& posted, std::vector<PairMessage> messages, bool free) {
  const size_t n = endpoint_.size();
  DISTCA_CHECK(posted.size() == n);
  for (const PairMessage& m : messages) {
    DISTCA_CHECK(m.from >= 0 && m.from < ranks() && m.to >= 0 && m.to < ranks());
  }
  // Sorted by pair, then each pair's entries summed in that order: the sums (and so the
  // times) do not depend on the order the caller listed them in.
  std::stable_sort(messages.begin(), messages.end(), [](const PairMessage& a, const PairMessage& b) {
    return a.from != b.from ? a.from < b.from : a.to < b.to;
  });
  const std::array<double, 2> rate = {hosts_ ? rates_.intra_host_bytes_per_second : rates_.inter_host_bytes_per_second,
                                      rates_.inter_host_bytes_per_second};
  ExchangeTimes t{posted, std::vector<double>(n, 0.0), *std::max_element(posted.begin(), posted.end())};
  size_t k = 0;
  for (size_t s = 0; s < n; ++s) {
    for (size_t p = 0; p < n; ++p) {
      double bytes = 0;
      for (; k < messages.size() && static_cast<size_t>(messages[k].from) == s &&
             static_cast<size_t>(messages[k].to) <= p;
           ++k) {
        if (static_cast<size_t>(messages[k].to) == p) bytes += messages[k].bytes;
      }
      if (p == s) continue;
      DISTCA_CHECK_MSG(bytes >= 0, "an exchange's pair sums to negative bytes");
      t.moved[s] += bytes;
      t.moved[p] += bytes;
      const size_t c = !hosts_ || host_[s] != host_[p] ? 1 : 0;
      double& out = out_free_[c == 1 ? endpoint_[s] : s][c];
      double& in = in_free_[c == 1 ? endpoint_[p] : p][c];
      const double start = std::max({posted[s], posted[p], out, in});
      const double busy = free ? 0.0 : bytes / rate[c];
      // A message without bytes queues behind what its directions carry but holds neither:
      // the sender's next message does not wait for this one's receiver.
      if (busy > 0) out = in = start + busy;
      const double end = start + busy + rates_.message_seconds;
      t.done[s] = std::max(t.done[s], end);
      t.done[p] = std::max(t.done[p], end);
    }
    // Entries of s to itself (or past the last rank) are no message.
    while (k < messages.size() && static_cast<size_t>(messages[k].from) == s) ++k;
  }
  return t;
}

double charge_transfer_cpu(std::vector<CpuDraw>& draws, double t, double seconds) {
  std::erase_if(draws, [t](const CpuDraw& w) { return w.end <= t; });
  double extra = 0;
  for (const CpuDraw& w : draws) {
    const double overlap = std::min(w.end, t + seconds) - std::max(w.start, t);
    if (overlap > 0) extra += w.cpu * overlap / (w.end - w.start);
  }
  return seconds + extra;
}

void ExchangeLinks::hold_until(double t) {
  for (auto* dirs : {&out_free_, &in_free_}) {
    for (std::array<double, 2>& d : *dirs) {
      for (double& f : d) f = std::max(f, t);
    }
  }
}

}  // namespace distca
