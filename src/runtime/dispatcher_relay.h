// One rank's part of a plan's K/V relays (plan/topology_relay.h) as the dispatcher runs them:
// two all-to-all-v's in place of the plan's kKv. The first carries the plan's kKv rows except
// the relayed ones; the second, between the ranks of each host, carries the relayed rows from
// their relays. Each rank then holds its kKv receive buffer exactly as the plan lays it out.
#pragma once

#include <cstdint>
#include <vector>

#include "distca/plan/plan.h"

namespace distca::runtime::detail {

// Rows [from, from + rows) of one buffer copied to [to, to + rows) of another.
struct RowCopy {
  int64_t from = 0, to = 0, rows = 0;
};

struct KvRelayLayout {
  bool on = false;  // the plan relays somewhere: every rank runs both exchanges (collectives)
  Exchange first, second;  // counts and displacements (rows) of the two exchanges
  std::vector<RowCopy> pack_first;     // plan kKv send buffer -> first send buffer
  std::vector<RowCopy> unpack_first;   // first receive buffer -> plan kKv receive buffer
  std::vector<RowCopy> pack_second;    // plan kKv receive buffer (as relay) -> second send buffer
  std::vector<RowCopy> unpack_second;  // second receive buffer -> plan kKv receive buffer
};

// `rank`'s layout of the relays of plan (under plan.hosts).
KvRelayLayout make_kv_relay_layout(const Plan& plan, int rank);
// The same for the K/V layout `kv` ([ranks], as it travels: plan/kv_once.h's wire) in place of
// the plan's kKv; `plan` gives the tasks and the hosts (kv_relay's overload).
KvRelayLayout make_kv_relay_layout(const Plan& plan, const std::vector<const Exchange*>& kv, int rank);

// Applies `copies` of rows of `row_floats` floats.
void copy_rows(const std::vector<RowCopy>& copies, const float* from, float* to, int64_t row_floats);

}  // namespace distca::runtime::detail
