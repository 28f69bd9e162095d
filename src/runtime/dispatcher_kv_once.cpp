// K/V once per server across a nano-batch pair, the dispatchers' layouts (dispatcher_kv_once.h).
#include "dispatcher_kv_once.h"

#include <tuple>

#include "distca/core/check.h"
#include "distca/plan/kv_once.h"

namespace distca::runtime::detail {
namespace {

// (holder, document, first row) -> (row in the receive buffer, end) of every received block.
using BlockRows = std::map<std::tuple<int64_t, int64_t, int64_t>, std::pair<int64_t, int64_t>>;

BlockRows block_rows(const Exchange& ex) {
  BlockRows out;
  for (const auto& [h, blocks] : ex.recv_blocks.entries()) {
    int64_t w = ex.recv_displs[h];
    for (const RowBlock& b : blocks) {
      out.emplace(std::make_tuple(static_cast<int64_t>(h), b.doc, b.begin), std::make_pair(w, b.end));
      w += b.rows();
    }
  }
  return out;
}

// The copies that fill `plan_kv`'s receive layout from the wire receive buffers: each block
// from `own` where it arrived there, else from `given` (the giver's). A plan block and the
// wire's block of the same piece start together (contexts [0, E) clipped to pieces).
void plan_copies(const Exchange& plan_kv, const BlockRows& own, const BlockRows* given, KvWireSide& side) {
  for (const auto& [h, blocks] : plan_kv.recv_blocks.entries()) {
    int64_t p = plan_kv.recv_displs[h];
    for (const RowBlock& b : blocks) {
      const auto key = std::make_tuple(static_cast<int64_t>(h), b.doc, b.begin);
      auto it = own.find(key);
      std::vector<RowCopy>* to = &side.own;
      if (it == own.end() && given != nullptr) {
        it = given->find(key);
        to = &side.given;
      }
      DISTCA_CHECK_MSG(it != (to == &side.own ? own.end() : given->end()) && it->second.second >= b.end,
                       "kv once: a row of the plan is on neither wire");
      to->push_back({it->second.first, p, b.rows()});
      p += b.rows();
    }
  }
}

}  // namespace

std::array<std::shared_ptr<const KvOnce>, 2> make_kv_once(const NanoPlans& plans, int rank, bool backward) {
  std::array<std::shared_ptr<KvOnce>, 2> out = {std::make_shared<KvOnce>(), std::make_shared<KvOnce>()};
  out[1]->stash = out[0]->stash = std::make_shared<KvStash>();
  const auto r = static_cast<size_t>(rank);
  for (int dir = 0; dir < (backward ? 2 : 1); ++dir) {
    const std::array<std::vector<Exchange>, 2> wire = nano_kv_wire(plans, dir == 1);
    const size_t giver = static_cast<size_t>(kv_wire_giver(dir == 1));
    const BlockRows given = block_rows(wire[giver][r]);
    for (size_t x = 0; x < 2; ++x) {
      KvWireSide& side = out[x]->side[static_cast<size_t>(dir)];
      side.on = true;
      side.giver = x == giver;
      side.wire = wire[x][r];
      std::vector<const Exchange*> all;
      for (const Exchange& e : wire[x]) all.push_back(&e);
      side.relay = make_kv_relay_layout(plans.full, all, rank);
      plan_copies(plans.nano[x].ranks[r].exchange(ExchangeKind::kKv), block_rows(side.wire),
                  side.giver ? nullptr : &given, side);
    }
  }
  return {out[0], out[1]};
}

}  // namespace distca::runtime::detail
