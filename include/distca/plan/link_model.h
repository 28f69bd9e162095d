// The link model of one exchange between ranks: what the ping-pong timeline
// (plan/pingpong_model.h) and the simulator's CAD exchanges (src/sim/cad.cpp) both price an
// exchange with, so the two give the same times for the same messages
// (docs/simulation-model.md, "Communication"; docs/scheduler.md, "Choosing the tolerance").
//
// The model: every rank has an outgoing and an incoming direction per link class (between
// hosts, or inside a host), each carrying one message at a time in the order posted (tbf's
// queue on each end of a host's link; both directions carry at once). Between hosts the
// directions are the HOST's: its ranks share its one link (a NIC, tbf on the host's end), so
// two ranks of a host sending across wait for each other; inside a host (or without hosts)
// each rank has its own. An exchange is posted by every rank at its own time; every ordered
// pair (s, p) of ranks exchanges one message, empty or not (the runtime's all-to-all-v sends
// one to every peer, so an exchange also waits for peers that send it nothing), taken in
// (s, p) order. The message from s to p starts once both have posted (MPI's rendezvous moves a
// large message only after the receive is matched) and both directions are free, holds them
// for bytes / the class's rate, and ends message_seconds after that (a message's fixed cost,
// the link fit's intercept, does not hold the link). A message without bytes holds neither
// direction (it queues behind what they carry, but the sender's next message does not wait
// for its receiver). The exchange completes on a rank when every message it sends or
// receives has.
//
// Cost: O(ranks^2 + messages log messages) per exchange (every pair is a message).
// Determinism: a pure function of the posts and messages in order. Thread safety: an object
// per timeline; no shared state.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace distca {

struct LinkRates {
  double inter_host_bytes_per_second = 0;  // between hosts (every byte without hosts); > 0
  double intra_host_bytes_per_second = 0;  // inside a host; > 0 when there are hosts
  double message_seconds = 0;              // fixed seconds per message, >= 0
};

// Bytes from one rank to another in one exchange. A pair may appear several times (its
// entries add up; an entry may be negative, e.g. bytes a relay takes over, as long as the
// pair's sum is >= 0); from == to is no message (ignored).
struct PairMessage {
  int64_t from = 0, to = 0;
  double bytes = 0;
};

struct ExchangeTimes {
  std::vector<double> done;  // [rank] when the exchange completes on the rank
  std::vector<double> moved;  // [rank] bytes the rank sends plus receives (each pair's sum)
  double all_posted = 0;     // the latest post: before it a rank waits for its peers to post
};

// A transfer a rank takes part in, as the CPU it takes from the rank's compute (a hardware
// profile's links.comm_cpu: seconds per byte sent or received while computing): its window
// on the link and that rate x the rank's bytes in it.
struct CpuDraw {
  double start = 0, end = 0;  // end > start
  double cpu = 0;             // seconds
};
// A compute of `seconds` starting at `t` on a rank with `draws` in flight: `seconds` plus each
// draw's CPU spread evenly over its window, the share of the window [t, t + seconds] overlaps.
// Drops the draws that ended by `t` (what fell in a wait is not charged: a waiting rank's CPU
// is free, and the link fits were measured with the ranks waiting). A rank's computes do not
// overlap, so a draw is charged at most its CPU in all. The ping-pong timeline
// (plan/pingpong_model.h) and the simulator's CAD engine both charge compute so.
double charge_transfer_cpu(std::vector<CpuDraw>& draws, double t, double seconds);

class ExchangeLinks {
 public:
  // `hosts`: [ranks] host of every rank (any non-negative ids; equal ids share a host), or
  // empty: no hosts (every byte crosses an inter-host link of its own per rank).
  // Preconditions (checked): ranks >= 1; hosts empty or of size ranks; rates positive where
  // used, message_seconds >= 0.
  ExchangeLinks(int64_t ranks, const std::vector<int64_t>& hosts, const LinkRates& rates);

  // Every rank r posts the exchange `messages` at posted[r]; returns when it completes on
  // each. free: every message carries no bytes (signal mode: the messages and their order
  // stay). Precondition (checked): posted has ranks entries, every rank in [0, ranks), every
  // pair's bytes >= 0.
  ExchangeTimes post(const std::vector<double>& posted, std::vector<PairMessage> messages, bool free = false);

  // Every direction busy until at least t (a transfer outside the model, e.g. a pipeline
  // stage's activations, holds the links).
  void hold_until(double t);

  int64_t ranks() const { return static_cast<int64_t>(endpoint_.size()); }

 private:
  bool hosts_ = false;
  std::vector<int64_t> host_;  // [rank] canonical host id (empty without hosts)
  LinkRates rates_;
  // [rank][class]: the direction is free from; class 1 at index endpoint_[rank].
  std::vector<std::array<double, 2>> out_free_, in_free_;
  std::vector<std::size_t> endpoint_;  // [rank] the index of its host's class-1 directions
};

}  // namespace distca
