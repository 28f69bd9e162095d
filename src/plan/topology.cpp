// Host topologies of the planner (topology.h).
#include "distca/plan/topology.h"

#include <algorithm>
#include <map>
#include <string>

namespace distca {

bool HostTopology::multi_host() const {
  for (const int64_t h : host) {
    if (h != host.front()) return true;
  }
  return false;
}

Status HostTopology::validate(int64_t ranks) const {
  if (inter_host_price < 1 || inter_host_price > kMaxInterHostPrice) {
    return Status::invalid_argument("--inter-host-price must be in [1, " + std::to_string(kMaxInterHostPrice) +
                                    "] (got " + std::to_string(inter_host_price) + ")");
  }
  if (host.empty()) return Status::ok_status();
  if (static_cast<int64_t>(host.size()) != ranks) {
    return Status::invalid_argument("--host-map: " + std::to_string(host.size()) + " hosts given for " +
                                    std::to_string(ranks) + " ranks");
  }
  for (size_t i = 0; i < host.size(); ++i) {
    if (host[i] < 0 || host[i] >= ranks) {
      return Status::invalid_argument("--host-map: rank " + std::to_string(i) + "'s host " + std::to_string(host[i]) +
                                      " is outside [0, " + std::to_string(ranks) + ")");
    }
  }
  return Status::ok_status();
}

Result<HostTopology> topology_ranks_per_host(int64_t ranks, int64_t n) {
  if (n < 1 || ranks < 1 || ranks % n != 0) {
    return Status::invalid_argument("--ranks-per-host " + std::to_string(n) + " must be >= 1 and divide the " +
                                    std::to_string(ranks) + " ranks");
  }
  HostTopology t;
  for (int64_t r = 0; r < ranks; ++r) t.host.push_back(r / n);
  return t;
}

Result<HostTopology> parse_host_map(const std::string& text, int64_t ranks) {
  HostTopology t;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    bool ok = !item.empty() && item.size() <= 9;
    for (const char c : item) ok = ok && c >= '0' && c <= '9';
    if (!ok) return Status::invalid_argument("--host-map: '" + text + "' must be a comma-separated list of host ids");
    t.host.push_back(std::stoll(item));
    at = comma + 1;
  }
  DISTCA_RETURN_IF_ERROR(t.validate(ranks));
  return t;
}

Result<HostTopology> topology_from_flags(int64_t ranks_per_host, const std::string& host_map,
                                         int64_t inter_host_price, int64_t ranks) {
  if (ranks_per_host != 0 && !host_map.empty()) {
    return Status::invalid_argument("--ranks-per-host and --host-map exclude each other");
  }
  HostTopology t;
  if (ranks_per_host != 0) {
    DISTCA_ASSIGN_OR_RETURN(t, topology_ranks_per_host(ranks, ranks_per_host));
  } else if (!host_map.empty()) {
    DISTCA_ASSIGN_OR_RETURN(t, parse_host_map(host_map, ranks));
  } else if (inter_host_price != 0) {
    return Status::invalid_argument("--inter-host-price needs --ranks-per-host or --host-map");
  }
  if (inter_host_price != 0) t.inter_host_price = inter_host_price;
  DISTCA_RETURN_IF_ERROR(t.validate(ranks));
  return t;
}

std::vector<int64_t> canonical_hosts(const std::vector<int64_t>& host) {
  std::map<int64_t, int64_t> id;
  std::vector<int64_t> out;
  out.reserve(host.size());
  for (const int64_t h : host) out.push_back(id.emplace(h, static_cast<int64_t>(id.size())).first->second);
  return out;
}

}  // namespace distca
