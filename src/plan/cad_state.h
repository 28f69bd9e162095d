// Shared state of the communication-aware schedulers (cad.cpp, cad_symmetric.cpp): the rows
// still at home (segments), the chunks moved away, server loads, and the exact forward byte
// count, updated incrementally with every move (traffic.h gives the rules; the tests check the
// incremental count against compute_traffic).
//
// A segment is a maximal run [a, b) of query rows of one piece still served at home; a chunk
// is a run [x, y) served elsewhere. Moves only take rows from segments, so nothing travels
// twice, and the pieces' rows are always exactly covered by segments plus chunks.
#pragma once

#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "distca/cost/analytic.h"
#include "distca/cost/cost_model.h"
#include "distca/data/batch.h"
#include "distca/core/status.h"
#include "distca/plan/schedule.h"

namespace distca::cad_internal {

// Task cost of one document: causal pairs (exact integers held in doubles) or the cost
// model's figure, times the document's weight (ScheduleOptions::doc_weights; x * 1.0 == x, so
// weight 1 costs exactly the unweighted figure).
class Work {
 public:
  explicit Work(const AttentionCostModel* model, double weight = 1.0) : model_(model), weight_(weight) {}
  // Costs are exact integers (unweighted pairs).
  bool is_pairs() const { return model_ == nullptr && weight_ == 1.0; }
  double operator()(int64_t x, int64_t y) const {
    if (x >= y) return 0.0;
    return weight_ * (model_ ? model_->task_cost(y - x, y) : static_cast<double>(causal_pairs(x, y)));
  }
  // The largest x in [lo, y) with (*this)(x, y) >= w, or lo when even [lo, y) costs less.
  // Assumes the cost grows with q_len at fixed kv_len (true of pairs and of measured tables).
  int64_t start_for(int64_t lo, int64_t y, double w) const;

 private:
  const AttentionCostModel* model_;
  double weight_;
};

// 24 bytes: the planner keeps one per piece, and at ~10^5 pieces its memory traffic is most of
// the plan time.
struct Seg {
  int64_t a = 0, b = 0;  // alive while a < b (a segment that moves away whole is emptied)
  int32_t doc = 0;       // document slot
  int32_t rank = 0;      // home = server
  bool alive() const { return a < b; }
};

struct Chunk {
  int64_t doc = 0;  // slot
  int64_t x = 0, y = 0;
  int64_t home = 0, server = 0;
};

// Rows [begin, end) of a document held by `rank` (one per piece).
struct Run {
  int64_t begin = 0, end = 0, rank = 0;
};

// A byte figure and its price under the options' HostTopology (equal without one).
struct Priced {
  int64_t bytes = 0;
  int64_t cost = 0;
};

class State {
 public:
  // Checks the batch (what Batch::validate checks, in the one pass the planner needs anyway)
  // and the options the communication-aware schedulers use; the message names the rank,
  // document or flag. Must succeed before anything else is called. May be called again on the
  // same object: it starts afresh but keeps the arrays' capacity, so a planner that reuses one
  // State per thread touches no fresh memory from one batch to the next (at ~10^5 pieces the
  // page faults of fresh arrays cost about as much as the planning itself).
  Status init(const Batch& batch, const ScheduleOptions& options);

  // Back to the colocated start init() built (every move undone), in time linear in what the
  // moves touched plus servers (no batch checks, no allocation): a planner can try several
  // move sequences on one batch. The state equals a fresh init() of the same batch.
  void restart();

  // The cost of document slot d's tasks.
  Work work(int64_t d) const {
    return weight_.empty() ? work_ : Work(model_, weight_[static_cast<size_t>(d)]);
  }
  // Every load is an exact integer (unweighted pairs): the planner may round its targets.
  bool integral() const { return work_.is_pairs() && weight_.empty(); }
  int64_t ranks() const { return ranks_; }
  int64_t s_q() const { return s_q_; }
  int64_t s_kv() const { return s_kv_; }
  int64_t num_pieces() const { return static_cast<int64_t>(runs_.size()); }
  int64_t doc_len(int64_t d) const { return doc_len_[static_cast<size_t>(d)]; }
  // The batch's id of document slot d.
  int64_t doc_id(int64_t d) const { return doc_id_.empty() ? d : doc_id_[static_cast<size_t>(d)]; }
  // Rows of [begin, end) of document slot d that `rank` does not hold.
  int64_t rows_not_held(int64_t d, int64_t begin, int64_t end, int64_t rank) const;
  // Rows of [begin, end) of document slot d held by ranks off host h.
  int64_t rows_off_host(int64_t d, int64_t begin, int64_t end, int64_t h) const;
  // End of the context of document slot d on the servers of host h: the largest q_end of the
  // document's tasks there (0 if none), segment `skip_seg` left out.
  int64_t host_need(int64_t d, int64_t h, int64_t skip_seg = -1) const;
  // A multi-host topology is set (HostTopology::multi_host): prices differ from 1.
  bool priced() const { return !host_.empty(); }
  // Host of rank r. Precondition: priced().
  int64_t host_of(int64_t r) const { return host_[static_cast<size_t>(r)]; }
  bool same_host(int64_t a, int64_t b) const {
    return host_.empty() || host_[static_cast<size_t>(a)] == host_[static_cast<size_t>(b)];
  }

  double load(int64_t r) const { return load_[static_cast<size_t>(r)]; }
  double total() const { return total_; }
  double mean() const { return total_ / static_cast<double>(ranks_); }
  // (load, rank) of every server, ascending.
  const std::set<std::pair<double, int64_t>>& by_load() const { return by_load_; }

  const Seg& seg(int64_t id) const { return segs_[static_cast<size_t>(id)]; }
  // Changes whenever a move takes rows from rank r's segments (so callers can cache what they
  // derive from rank_segs(r)).
  int64_t rank_version(int64_t r) const { return rank_version_[static_cast<size_t>(r)]; }
  // Alive segments of rank r (compacted on access), in creation order.
  const std::vector<int32_t>& rank_segs(int64_t r);
  // Alive segments of document slot d, most recent first.
  void doc_segs(int64_t d, std::vector<int64_t>* out) const;
  // Document slots with context on server s (its own pieces, then chunks it received; a slot
  // may repeat).
  const std::vector<int32_t>& server_docs(int64_t s) const { return server_docs_[static_cast<size_t>(s)]; }
  // Servers that hold context of document slot d (need > 0), ascending, without duplicates.
  void context_servers(int64_t d, std::vector<int64_t>* out) const;

  // End of the context of document slot d present on server s: the largest q_end of the
  // document's tasks there (0 if none). `skip_seg` is ignored in the maximum.
  int64_t need(int64_t d, int64_t s, int64_t skip_seg = -1) const;
  // Exact change of forward bytes, and of their price, if rows [x, y) of segment `id` move to
  // server `dest`. Priced as the runtime sends with a topology (plan/topology_relay.h): every
  // message at 1 inside a host and inter_host_price between hosts, a K/V row crossing to a
  // host once (a relay there forwards it to the host's other servers that need it).
  Priced delta_bytes(int64_t id, int64_t dest, int64_t x, int64_t y) const;
  // Change of the home's load (<= 0) and of the destination's (>= 0) for that move.
  double home_loss(int64_t id, int64_t x, int64_t y) const;
  double dest_gain(int64_t d, int64_t x, int64_t y) const { return work(d)(x, y); }

  // Moves rows [x, y) of segment `id` to `dest` (dest != home). Preconditions: a <= x < y <= b.
  // What stays at home keeps the id: [a, x) if x > a, else [y, b) (a second id when both stay).
  void move(int64_t id, int64_t dest, int64_t x, int64_t y);

  int64_t bytes() const { return bytes_.bytes; }
  int64_t bytes_start() const { return bytes_start_.bytes; }
  // The forward bytes priced by the topology (== bytes() without one).
  int64_t cost() const { return bytes_.cost; }
  int64_t moves() const { return moves_; }
  // The schedule, server by server: the server's segments at home (creation order), then the
  // chunks it received (in the order they were moved).
  std::vector<TaskPlacement> tasks() const;

 private:
  void reset();  // empties everything, keeping capacity
  void set_load(int64_t r, double v);
  int64_t new_seg(int64_t doc, int64_t a, int64_t b, int64_t rank);
  // Rows [begin, end) of document slot d lie inside one piece held by `rank`.
  bool same_piece(int64_t d, int64_t rank, int64_t begin, int64_t end) const;
  // Checks that the pieces of every document tile it; the message names the document.
  Status check_tiling() const;
  // The bytes of the colocated start (init, after the pieces are read).
  Priced colocated_bytes() const;
  // Change of the K/V rows crossing into the hosts of the home and of `dest` (each row once
  // per host) if rows [x, y) of segment `id` move to `dest`. Precondition: priced().
  int64_t crossing_change(int64_t id, int64_t dest, int64_t x, int64_t y) const;
  // After init has read the pieces: the totals, the load order, the colocated bytes, and the
  // start restart() returns to.
  void record_start();

  Work work_{nullptr};                           // unweighted
  const AttentionCostModel* model_ = nullptr;
  std::vector<double> weight_;                   // [slot]; empty when no document is weighted
  int64_t ranks_ = 0;
  int64_t s_q_ = 0, s_kv_ = 0;
  // Per-document and per-piece arrays use 32-bit indices: at ~10^5 pieces the planner's time
  // is mostly memory traffic (page faults and cache misses), so smaller is faster.
  std::vector<int64_t> doc_id_;                  // [slot]; empty when slot == id (the packer's
                                                 // numbering: ids 0, 1, ... in order of appearance)
  std::vector<int64_t> doc_len_;                 // [slot]
  std::vector<Run> runs_;                        // [piece] = the piece's original segment: the
                                                 // document's runs are its segments with ids
                                                 // < num_pieces() (seg_next_ links them)
  std::vector<double> load_;                     // [ranks]
  std::vector<int64_t> rank_version_;            // [ranks] moves taken from the rank's segments
  double total_ = 0;
  std::set<std::pair<double, int64_t>> by_load_;  // (load, rank)
  std::vector<Seg> segs_;
  std::vector<int32_t> seg_next_;                 // [seg] next segment of the same document
                                                  // (newest first: pieces in reverse batch order
                                                  // after the segments moves created)
  std::vector<int32_t> doc_seg_head_;             // [slot] first segment (-1: none)
  std::vector<Chunk> chunks_;
  std::vector<int32_t> chunk_next_;               // [chunk] next chunk of the same document
  std::vector<int32_t> doc_chunk_head_;           // [slot] first chunk (-1: none)
  std::vector<std::vector<int32_t>> rank_segs_;    // [ranks] segment ids (may hold dead ones)
  std::vector<std::vector<int32_t>> server_docs_;  // [ranks] document slots with context
  std::vector<int32_t> host_;                // [ranks] host ids; empty unless multi-host
  int64_t inter_price_ = 1;
  Priced bytes_, bytes_start_;
  int64_t moves_ = 0;
  std::vector<double> load_start_;           // [ranks] loads of the colocated start
  double total_start_ = 0;
  std::vector<int32_t> server_docs_start_;   // [ranks] sizes of server_docs_ at the start
};

}  // namespace distca::cad_internal
