// The simulator's network model: what one exchange between units costs. Every engine's
// communication time comes from these functions (docs/simulation-model.md, "Communication",
// has the formulas and the source of every parameter).
//
// The model, per message (Hockney's latency + size; nccl-tests' PERFORMANCE.md: "time is
// roughly overhead + size / bw"):
//   one message of s bytes between two units costs  lat + s / B
// with B the unit's bandwidth (its G GPUs each move 1/G of the bytes over their own NIC, so
// B = G x the per-GPU figure) and lat the per-message latency. The effective (algorithm)
// bandwidth of a message is then s / (lat + s / B) = B s / (s + s_half) with the
// half-bandwidth size s_half = lat B: small messages run below link bandwidth.
// Contention: the messages a unit sends share its NICs (their bytes add up and their latencies
// are paid one after another), likewise the messages it receives (incast: k senders to one
// receiver cost that receiver k latencies and the sum of their bytes); the NICs are full
// duplex, so sending and receiving overlap (the slower side counts).
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "distca/plan/doc_index.h"
#include "distca/plan/schedule.h"

namespace distca::sim::detail {

// One class of link between units.
struct Link {
  double bytes_per_second = 0;  // B, per unit (G x per GPU); > 0
  double latency = 0;           // seconds per message; >= 0
  // lat + bytes / B; 0 for bytes <= 0 (no message).
  double message_seconds(double bytes) const { return bytes > 0 ? latency + bytes / bytes_per_second : 0.0; }
  // bytes / message_seconds(bytes) = B s / (s + s_half); 0 for bytes <= 0.
  double effective_bandwidth(double bytes) const;
  double half_bandwidth_bytes() const { return latency * bytes_per_second; }
};

// Which units send bytes to which in one exchange: the (from, to) pairs, kept sparse (plans
// average about one message per unit, so a dense units x units matrix would be mostly zeros:
// 2 MiB at 4096 units). Pairs are stored sorted by (from, to) and deduplicated once
// normalize() ran, so every unit's peers are one sorted run; the order is a function of the
// set only (deterministic). A unit's bytes to itself are no message (from == to is dropped).
// Thread safety: a plain value.
class PeerLists {
 public:
  PeerLists() = default;
  explicit PeerLists(int64_t units) { reset(units); }
  // No pairs over `units` units (0 <= units < 2^32); frees the storage.
  void reset(int64_t units);
  int64_t units() const { return units_; }
  // Adds from -> to (ignored when from == to); the lists are then unnormalized until
  // normalize(). Precondition (checked): 0 <= from, to < units().
  void add(int64_t from, int64_t to);
  // Sorts and deduplicates the pairs (a no-op when already normalized).
  void normalize();
  bool normalized() const { return normalized_; }
  // this |= other (a normalized union). Preconditions (checked): other.units() == units(),
  // both normalized.
  void merge(const PeerLists& other);
  // to -> from for every from -> to (the reverse exchange of the same pairs), normalized.
  // Precondition (checked): normalized.
  PeerLists transposed() const;
  // Precondition (checked): normalized; 0 <= from, to < units().
  bool has(int64_t from, int64_t to) const;
  bool empty() const { return pairs_.empty(); }
  // Distinct pairs (messages). Precondition: normalized.
  int64_t size() const { return static_cast<int64_t>(pairs_.size()); }
  // Messages each unit sends (peers it sends to) and receives (peers it receives from), added
  // to sends / receives ([units] each, checked). Precondition (checked): normalized.
  void add_counts(std::vector<int64_t>& sends, std::vector<int64_t>& receives) const;
  // The same into fresh [units] vectors.
  void counts(std::vector<int64_t>& sends, std::vector<int64_t>& receives) const;
  // No pairs, keeping the storage (a scratch list reused per slot).
  void clear() {
    pairs_.clear();
    normalized_ = true;
  }

 private:
  static uint64_t pack(int64_t from, int64_t to) {
    return (static_cast<uint64_t>(from) << 32) | static_cast<uint64_t>(to);
  }
  int64_t units_ = 0;
  std::vector<uint64_t> pairs_;  // from << 32 | to
  bool normalized_ = true;
};

// The message pairs of a plan's forward exchanges, by traffic.h's byte rules (a pair is marked
// exactly where those rules move bytes): `queries` gets home -> server for every task served
// away from home (Q out; O + LSE, dO and dQ follow the same pairs, either way); `dispatch` gets
// those and holder -> server for every context row [0, q_end) of a task held by a rank other
// than its server (K/V; dK/dV go back the same pairs reversed). Ranks are mapped to units by
// unit_of (rank r is unit unit_of[r]; nullptr: rank r is unit r). Both lists come back
// normalized. Preconditions: the tasks index documents of `index`; every unit < both lists'
// units() (checked).
void add_plan_peers(const DocumentIndex& index, const std::vector<TaskPlacement>& tasks,
                    const std::vector<int64_t>* unit_of, PeerLists& dispatch, PeerLists& queries);

// NCCL's all-to-all is grouped send/recv, one message per peer pair that exchanges bytes (NCCL
// user guide, "Point-to-point communication"). A unit's part: its sends and its receives each
// cost (messages x lat + bytes / B); the part is the slower side; a unit with no message
// takes no part (0). Signal mode's 1-byte messages are messages with 0 bytes here.
// Precondition: sends > 0 where sent > 0, receives > 0 where recv > 0 (callers check it where
// counts and bytes come from different books: messages_cover_bytes).
double all_to_all_unit_seconds(const Link& link, double sent, double recv, int64_t sends, int64_t receives);

// all_to_all_unit_seconds' precondition: every side that moves bytes has a message.
inline bool messages_cover_bytes(double sent, double recv, int64_t sends, int64_t receives) {
  return (sends > 0 || !(sent > 0)) && (receives > 0 || !(recv > 0));
}

// A ring all-reduce of `data` bytes per unit over n units (reduce-scatter then all-gather:
// 2 (n - 1) steps): 2 (n - 1) lat + moved / B with moved = 2 (n - 1) / n data, the bytes each
// unit sends (= receives); *moved gets them (if not null). 0 when n <= 1 or data <= 0.
double ring_all_reduce_seconds(const Link& link, int64_t n, double data, double* moved = nullptr);

// One point-to-point transfer (a PP activation or gradient between stages): one message.
inline double p2p_seconds(const Link& link, double bytes) { return link.message_seconds(bytes); }

}  // namespace distca::sim::detail
