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

// Which units send bytes to which in one exchange: a units x units bit matrix (from, to); the
// diagonal is never set (a unit's bytes to itself are no message).
class PeerMatrix {
 public:
  PeerMatrix() = default;
  explicit PeerMatrix(int64_t units) { reset(units); }
  // units x units, all clear.
  void reset(int64_t units);
  int64_t units() const { return units_; }
  // Marks from -> to (ignored when from == to). Precondition: 0 <= from, to < units().
  void add(int64_t from, int64_t to) {
    if (from != to) bits_[index(from, to)] |= bit(to);
  }
  bool has(int64_t from, int64_t to) const { return (bits_[index(from, to)] & bit(to)) != 0; }
  // this |= other; other |= this is the same set. Precondition: other.units() == units().
  void merge(const PeerMatrix& other);
  // to -> from for every from -> to (the reverse exchange of the same pairs).
  PeerMatrix transposed() const;
  bool empty() const;
  // Messages each unit sends (peers it sends to) and receives (peers it receives from). [units]
  void counts(std::vector<int64_t>& sends, std::vector<int64_t>& receives) const;

 private:
  size_t index(int64_t from, int64_t to) const {
    return static_cast<size_t>(from) * words_ + static_cast<size_t>(to >> 6);
  }
  static uint64_t bit(int64_t to) { return uint64_t{1} << (to & 63); }
  int64_t units_ = 0;
  size_t words_ = 0;  // per row
  std::vector<uint64_t> bits_;
};

// The message pairs of a plan's forward exchanges, by traffic.h's byte rules (a pair is marked
// exactly where those rules move bytes): `queries` gets home -> server for every task served
// away from home (Q out; O + LSE, dO and dQ follow the same pairs, either way); `dispatch` gets
// those and holder -> server for every context row [0, q_end) of a task held by a rank other
// than its server (K/V; dK/dV go back the same pairs reversed). Ranks are mapped to units by
// unit_of (rank r is unit unit_of[r]; nullptr: rank r is unit r). Preconditions: the tasks
// index documents of `index`; every unit < both matrices' units().
void add_plan_peers(const DocumentIndex& index, const std::vector<TaskPlacement>& tasks,
                    const std::vector<int64_t>* unit_of, PeerMatrix& dispatch, PeerMatrix& queries);

// NCCL's all-to-all is grouped send/recv, one message per peer pair that exchanges bytes (NCCL
// user guide, "Point-to-point communication"). A unit's part: its sends and its receives each
// cost (messages x lat + bytes / B); the part is the slower side; a unit with no message
// takes no part (0). Signal mode's 1-byte messages are messages with 0 bytes here.
// Precondition: sends > 0 where sent > 0, receives > 0 where recv > 0.
double all_to_all_unit_seconds(const Link& link, double sent, double recv, int64_t sends, int64_t receives);

// The all-to-all of a peer byte matrix: bytes[i * n + j] is what unit i sends unit j (the
// diagonal is ignored; entries > 0 are messages). Returns the collective's duration, the
// slowest unit's part; unit_seconds (if not null) gets every unit's part. [n * n] in, [n] out.
double all_to_all_seconds(const Link& link, int64_t n, const std::vector<double>& bytes,
                          std::vector<double>* unit_seconds = nullptr);

// A ring all-gather or reduce-scatter over `ring` units (NCCL's ring: ring - 1 steps, one
// message per step and GPU, each unit's bytes pass its NIC once): (ring - 1) lat + max(sent,
// recv) / B, where sent / recv are the unit's bytes over the whole collective (the group's
// duration is the max over its units). 0 when ring <= 1 or no bytes move.
double ring_seconds(const Link& link, int64_t ring, double sent, double recv);

// A ring all-reduce of `data` bytes per unit over n units (reduce-scatter then all-gather:
// 2 (n - 1) steps): 2 (n - 1) lat + moved / B with moved = 2 (n - 1) / n data, the bytes each
// unit sends (= receives); *moved gets them (if not null). 0 when n <= 1 or data <= 0.
double ring_all_reduce_seconds(const Link& link, int64_t n, double data, double* moved = nullptr);

// One point-to-point transfer (a PP activation or gradient between stages): one message.
inline double p2p_seconds(const Link& link, double bytes) { return link.message_seconds(bytes); }

}  // namespace distca::sim::detail
