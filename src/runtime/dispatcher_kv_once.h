// K/V sent once per layer per server across a nano-batch pair (plan/kv_once.h) as the two
// dispatchers of the pair run it. Each dispatcher's K|V exchange carries its nano-batch's part
// of the wire (with the wire's own relays on multi-host plans) into a wire receive buffer;
// from it the dispatcher fills its plan's kKv receive buffer (`own`), and the giver (the first
// dispatch of the direction) leaves it in the pair's stash, from which the taker copies the
// rows its plan needs that the giver received (`given`), then drops it. Both then hold their
// kKv receive buffers exactly as their plans lay them out.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "dispatcher_relay.h"
#include "distca/plan/nano_plan.h"
#include "distca/plan/plan.h"

namespace distca::runtime::detail {

// The giver's wire receive buffers by (layer, direction: 0 forward, 1 backward), from the
// giver's serve to the taker's. Used by the pair's dispatchers on their rank's thread only.
struct KvStash {
  std::map<std::pair<int, int>, std::vector<float>> rows;
};

// One dispatcher's K/V wire in one direction.
struct KvWireSide {
  bool on = false;             // false: the plan's kKv as it is (and its relays)
  bool giver = false;          // keeps its wire receive buffer for the taker
  Exchange wire;               // this rank's K|V exchange as it travels (rows)
  KvRelayLayout relay;         // the wire's relays (`on` false: none)
  std::vector<RowCopy> own;    // wire receive buffer -> the plan's kKv receive buffer
  std::vector<RowCopy> given;  // the giver's wire receive buffer -> the plan's (taker only)
};

struct KvOnce {
  std::array<KvWireSide, 2> side;  // [forward, backward]
  std::shared_ptr<KvStash> stash;  // shared by the pair
};

// The KvOnce of ping's and pong's dispatchers of `plans` on `rank`, sharing one stash. With
// `backward` false the backward sides are off (servers that keep their forward state send no
// K/V in backward).
std::array<std::shared_ptr<const KvOnce>, 2> make_kv_once(const NanoPlans& plans, int rank, bool backward);

}  // namespace distca::runtime::detail
