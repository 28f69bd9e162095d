// Which host each rank runs on, and what the planner charges for a byte by the link it
// crosses (docs/scheduler.md, "Topology-aware placement").
//
// A byte between two ranks of one host costs 1; a byte between hosts costs inter_host_price.
// The `cad` planner minimises these priced bytes (at the same balance band), so with a
// topology it prefers moves inside a host. No topology (host empty), or every rank on one
// host, prices every byte at 1: the plans are bit for bit those without the option.
//
// Sources (docs/scheduler.md): an explicit map or ranks-per-host count (flags), or, under
// mpirun, the communicator's shared-memory split (comm/communicator.h host_ids). An explicit
// one wins.
//
// Thread safety: plain values; the functions are pure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distca/core/status.h"

namespace distca {

inline constexpr int64_t kMaxInterHostPrice = 1 << 16;
// The default price of an inter-host byte: a host's shared memory or NVLink moves about an
// order of magnitude more per second than its NIC.
inline constexpr int64_t kDefaultInterHostPrice = 8;

struct HostTopology {
  // [ranks] host of every rank (any non-negative ids; equal ids share a host), or empty.
  std::vector<int64_t> host;
  int64_t inter_host_price = kDefaultInterHostPrice;  // in [1, kMaxInterHostPrice]
  bool empty() const { return host.empty(); }
  // Two or more distinct hosts: only then does a price differ from 1.
  bool multi_host() const;
  // Both ranks on the same host (always true without a topology). Precondition: a, b < ranks.
  bool same_host(int64_t a, int64_t b) const {
    return host.empty() || host[static_cast<size_t>(a)] == host[static_cast<size_t>(b)];
  }
  // The price of one byte from a to b: 1 on a host, inter_host_price between hosts.
  int64_t price(int64_t a, int64_t b) const { return same_host(a, b) ? 1 : inter_host_price; }
  // Hosts of `ranks` ranks: empty, or ranks entries in [0, ranks), and the price's range; the
  // message names --host-map and --inter-host-price.
  Status validate(int64_t ranks) const;
  bool operator==(const HostTopology&) const = default;
};

// Ranks [h*n, (h+1)*n) on host h (mpirun's default by-slot placement). n >= 1 divides ranks;
// the message names --ranks-per-host.
Result<HostTopology> topology_ranks_per_host(int64_t ranks, int64_t n);
// "0,0,1,1": rank i on the host of the i-th entry (a comma-separated list of ranks integers
// in [0, ranks)); the message names --host-map.
Result<HostTopology> parse_host_map(const std::string& text, int64_t ranks);
// The topology of the flags --ranks-per-host N (0: not given), --host-map TEXT (empty: not
// given) and --inter-host-price P (0: not given, kDefaultInterHostPrice) for `ranks` ranks:
// empty when neither N nor TEXT is given. Refuses N and TEXT together, and P without either.
Result<HostTopology> topology_from_flags(int64_t ranks_per_host, const std::string& host_map,
                                         int64_t inter_host_price, int64_t ranks);
// Host ids renumbered 0, 1, ... in order of first appearance (what host_ids-like sources give
// differs only in naming, and the plan JSON prints this form).
std::vector<int64_t> canonical_hosts(const std::vector<int64_t>& host);

}  // namespace distca
