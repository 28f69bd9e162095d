// Data-loader re-packing: the baselines' layouts of a step's documents over the ranks, the one
// function the trainer runs (`distca train --mode wlb|percp`) and the simulator models (the
// `wlb` scheduler is the colocated schedule of wlb_repack's batch).
//
// A re-pack moves whole documents (or head-tail shards of them) between ranks before the step;
// every document of the input appears in the output with the same id and length, its pieces
// keep their positions, and the colocated schedule of the output serves each piece where it is
// held, with the K/V of the document's other pieces fetched from their holders (the dispatcher
// returns dK/dV to them in backward: the all-gather / reduce-scatter of per-document context
// parallelism, restricted to the causal prefix each piece reads).
//
// Work of a piece [a, a + n) of a document: linear_per_token x n + task_cost(n, a + n) (the
// cost model's attention time, causal pairs when cost is nullptr). A rank's work is the sum
// over its pieces; the balance objective is the largest rank's work.
//
// Head-tail sharding of the rows [a, b) of a document (n = b - a) over C ranks with shares n_i
// (sum n_i = n): rank i holds the head chunk of floor(n_i / 2) rows and the tail chunk of the
// rest, the heads laid from a forwards in rank order and the tails from b backwards in rank
// order ([h_0][h_1]..[h_{C-1}][t_{C-1}]..[t_1][t_0]); empty chunks are dropped. With equal
// shares every rank holds (nearly) the same causal pairs of the document.
//
// wlb_repack (WLB-LLM's variable-length chunking with per-document context parallelism):
//   cap   K = chunking_rank_cap(T, R, cap) tokens per rank (T the batch's tokens);
//   order documents by length, longest first (ties: lower id first);
//   shard with cp > 1, a document longer than the threshold (cp_shard_threshold) is sharded
//         head-tail over one CP group (ranks gC .. gC+C-1), shares n_i = floor(L/C), the
//         first L mod C ranks one more: the group whose largest rank work after adding the
//         shards is least (then the lowest group) among those where every rank has room;
//   place otherwise (or when no group has room), the whole document on the rank with the least
//         work (then the lowest rank) among those with room >= L;
//   split if no rank has room, the document is cut front to back: the first piece goes to the
//         rank with the most room (ties: least work, then lowest rank), as long as that room,
//         and the rest continues the same way;
//   keep  if the result's objective is larger than the input's (in-order packing) and the
//         input holds the cap (always so for full ranks), the input is returned unchanged: the
//         chunking never balances worse than the loader's packing.
//   The output's tokens_per_rank is max(input's, K); each rank's pieces are in placement order.
//   Deferred execution (WLB-LLM's outlier delay across steps) is not modelled: it changes which
//   documents a step trains on.
//
// percp_repack (THD-style per-document context parallelism at a fixed degree C): the input's
// ranks form groups of C consecutive ranks; each group's tokens (its ranks' pieces in order,
// consecutive pieces of one document merged into one part) are re-laid part by part, each part
// sharded head-tail over the group with shares floor(n/C) and the n mod C extra rows going to
// the group's ranks holding the fewest tokens so far (ties: lowest rank), so every rank ends
// within one token of the group's mean (exactly its input tokens when the group's ranks were
// full). A document crossing a group boundary is sharded within each group it was packed in.
//
// Determinism: pure functions of their arguments. Thread safety: reentrant.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distca/core/status.h"
#include "distca/cost/cost_model.h"
#include "distca/data/batch.h"
#include "distca/plan/schedule.h"

namespace distca {

struct ChunkingOptions {
  double cap = 1.2;             // tokens per rank at most cap x the mean; finite, >= 1
  int64_t cp = 1;               // CP group size; divides the batch's ranks
  // cp > 1: documents longer than this many tokens are sharded over a group; 0: the default
  // rule (cp_shard_threshold).
  int64_t cp_threshold = 0;
  // The attention kernel's query tile (the default rule's unit); >= 1.
  int64_t tile_rows = 1;
  double linear_per_token = 0;  // the work of one token's linear layers, in the cost's units; >= 0
  const AttentionCostModel* cost = nullptr;  // attention work; nullptr: causal pairs
  // The message names the train flags (--wlb-cap, --cp, --cp-threshold).
  Status validate(int64_t ranks) const;
};

// The wlb scheduler's options (ScheduleOptions: wlb_mem_cap, wlb_cp, wlb_cp_threshold,
// wlb_linear_per_token, align_rows as the tile, cost).
ChunkingOptions wlb_chunking_options(const ScheduleOptions& options);

// max(ceil(total / ranks), floor(cap x total / ranks)): the most tokens wlb_repack puts on a
// rank (so the batch always fits). Preconditions: total >= 0, ranks >= 1, cap >= 1.
int64_t chunking_rank_cap(int64_t total, int64_t ranks, double cap);

// The length above which wlb_repack shards a document over a CP group: cp_threshold when set,
// else the default rule 2 x cp x tile_rows - 1 (WLB-LLM's selector shards a document only when
// per-document sharding pays; here, when each of its 2C chunks still fills at least one
// query tile of the kernel, so sharding adds no tile padding). Meaningless when cp == 1.
int64_t cp_shard_threshold(const ChunkingOptions& options);

// The work of every rank of `batch` (see above). [ranks]
std::vector<double> chunking_rank_work(const Batch& batch, const ChunkingOptions& options);

// Errors: an invalid batch, invalid options.
Result<Batch> wlb_repack(const Batch& batch, const ChunkingOptions& options);
Result<Batch> percp_repack(const Batch& batch, int64_t cp);

// WLB-LLM's chunking across the M micro-batches of a step as well as across the ranks (the
// trainer's --mode wlb under --pp): wlb_repack of the micro-batches laid side by side as M x R
// ranks (micro-batch m's rank r is rank m R + r; CP groups never straddle two micro-batches, as
// cp divides R), its cap the same (every micro-batch holds the same tokens), with one rule
// more: a document cut for want of room is cut within one micro-batch, the one with the most
// room; when none has room for it the micro-batches are re-packed each alone. Result: M
// batches of R ranks, tokens_per_rank the re-pack's; a document of input micro-batch m with id
// i has id micro_doc_id(i, m, M) (so ids stay unique wherever it lands). The objective, the
// largest work of any rank of any micro-batch, is no worse than the input's when the input
// holds the cap (the keep rule over all micro-batches together). Errors: an invalid batch,
// micro-batches with different ranks, a negative document id, invalid options.
Result<std::vector<Batch>> wlb_repack_micro_batches(const std::vector<Batch>& batches, const ChunkingOptions& options);
constexpr int64_t micro_doc_id(int64_t id, int64_t m, int64_t micro_batches) { return id * micro_batches + m; }

// Appends the head-tail shards of rows [begin, end) of document `doc` (length doc_len) to the
// ranks first_rank + i of `out` (shares[i] rows each; their sum is end - begin).
void shard_head_tail(int64_t doc, int64_t begin, int64_t end, int64_t doc_len, int64_t first_rank,
                     const std::vector<int64_t>& shares, Batch& out);

}  // namespace distca
