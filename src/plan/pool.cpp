// Pooled batches of pipeline stages (pool.h).
#include "distca/plan/pool.h"

#include <algorithm>
#include <string>

#include "distca/cost/analytic.h"

namespace distca {

namespace {

constexpr int64_t kMaxPooledId = int64_t{1} << 62;

std::string member_where(size_t i) { return "pool: member " + std::to_string(i); }

}  // namespace

PoolOrigin PooledBatch::origin(int64_t doc) const {
  PoolOrigin o;
  o.member = member_of_doc(doc);
  o.stage = stage_of_doc(doc);
  o.doc = original_doc(doc);
  if (o.member >= 0) {
    const PoolMember& m = members[static_cast<size_t>(o.member)];
    o.microbatch = m.microbatch;
    o.backward = m.backward;
  }
  return o;
}

std::vector<DocWeight> PooledBatch::doc_weights() const {
  bool any_forward = false, any_backward = false;
  for (const PoolMember& m : members) (m.backward ? any_backward : any_forward) = true;
  std::vector<DocWeight> out;
  if (!(any_forward && any_backward)) return out;
  for (const auto& pieces : batch.per_rank) {
    for (const Piece& p : pieces) {
      if (p.offset != 0) continue;  // one entry per document: its first piece
      const bool bwd = members[static_cast<size_t>(member_of_doc(p.doc))].backward;
      out.push_back({p.doc, bwd ? kAttentionBackwardFactor : 1.0});
    }
  }
  std::sort(out.begin(), out.end(), [](const DocWeight& a, const DocWeight& b) { return a.doc < b.doc; });
  return out;
}

Result<PooledBatch> pool_batches(std::span<const PoolMember> members, int64_t pp, int64_t dp) {
  if (pp < 1) return Status::invalid_argument("pool: pp must be >= 1 (got " + std::to_string(pp) + ")");
  if (dp < 1) return Status::invalid_argument("pool: dp must be >= 1 (got " + std::to_string(dp) + ")");
  if (members.empty()) return Status::invalid_argument("pool: no members");
  PooledBatch pooled;
  pooled.pp = pp;
  pooled.dp = dp;
  pooled.member_of_stage.assign(static_cast<size_t>(pp), -1);
  for (size_t i = 0; i < members.size(); ++i) {
    const PoolMember& m = members[i];
    if (m.stage < 0 || m.stage >= pp) {
      return Status::invalid_argument(member_where(i) + ": stage " + std::to_string(m.stage) + " is not in [0, " +
                                      std::to_string(pp) + ")");
    }
    int64_t& slot = pooled.member_of_stage[static_cast<size_t>(m.stage)];
    if (slot >= 0) {
      return Status::invalid_argument(member_where(i) + ": stage " + std::to_string(m.stage) +
                                      " already has member " + std::to_string(slot));
    }
    slot = static_cast<int64_t>(i);
    if (m.batch == nullptr) return Status::invalid_argument(member_where(i) + ": no batch");
    if (m.batch->ranks != dp) {
      return Status::invalid_argument(member_where(i) + ": batch has " + std::to_string(m.batch->ranks) +
                                      " ranks, expected dp = " + std::to_string(dp));
    }
    DISTCA_RETURN_IF_ERROR(m.batch->validate().with_context(member_where(i)));
    for (const auto& pieces : m.batch->per_rank) {
      for (const Piece& p : pieces) {
        if (p.doc < 0 || p.doc >= kMaxPooledId / pp) {
          return Status::invalid_argument(member_where(i) + ": document id " + std::to_string(p.doc) +
                                          " is outside [0, 2^62 / pp)");
        }
      }
    }
    PoolMember kept = m;
    kept.batch = nullptr;
    pooled.members.push_back(kept);
  }

  const int64_t units = pp * dp;
  pooled.rank_of_unit.assign(static_cast<size_t>(units), -1);
  for (int64_t u = 0; u < units; ++u) {
    pooled.rank_of_unit[static_cast<size_t>(u)] = static_cast<int64_t>(pooled.unit_of.size());
    pooled.unit_of.push_back(u);
  }
  Batch& b = pooled.batch;
  b.ranks = static_cast<int64_t>(pooled.unit_of.size());
  b.tokens_per_rank = 1;
  b.per_rank.assign(pooled.unit_of.size(), {});
  for (const PoolMember& m : members) {
    b.tokens_per_rank = std::max(b.tokens_per_rank, m.batch->tokens_per_rank);
    for (int64_t r = 0; r < dp; ++r) {
      auto& dst = b.per_rank[static_cast<size_t>(pooled.rank_of(m.stage, r))];
      for (Piece piece : m.batch->per_rank[static_cast<size_t>(r)]) {
        piece.doc = pooled.pooled_doc(m.stage, piece.doc);
        dst.push_back(piece);
      }
    }
  }
  return pooled;
}

Result<PooledBatch> pool_tick(const Tick& tick, std::span<const Batch> micro_batches, int64_t pp, int64_t dp) {
  std::vector<PoolMember> members;
  members.reserve(tick.ops.size());
  for (const PipeOp& op : tick.ops) {
    if (op.microbatch < 0 || op.microbatch >= static_cast<int64_t>(micro_batches.size())) {
      return Status::invalid_argument("pool: micro-batch " + std::to_string(op.microbatch) + " of stage " +
                                      std::to_string(op.stage) + " is not one of the " +
                                      std::to_string(micro_batches.size()) + " given");
    }
    members.push_back({op.stage, op.microbatch, op.backward, &micro_batches[static_cast<size_t>(op.microbatch)]});
  }
  return pool_batches(members, pp, dp);
}

}  // namespace distca
