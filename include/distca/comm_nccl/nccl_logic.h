// The host-side logic of the NCCL backend (nccl.h) that needs neither CUDA nor NCCL, so it is
// built and tested in every configuration (DISTCA_CUDA=OFF included):
//   - plan_all_to_all_v: which ncclSend / ncclRecv calls (and which self copy) one rank's
//     all-to-all-v becomes;
//   - the count check: every rank tells each peer, over the bootstrap communicator, how many
//     bytes it sends it, so a mismatch is a Status naming both ranks and both sizes instead
//     of an NCCL hang (NCCL's own p2p calls cannot detect one);
//   - the p2p headers: NCCL has no tags and pairs sends and receives per peer in issue order,
//     so each p2p message also sends a small header over the bootstrap (matched by tag there),
//     which detects a size mismatch and a pair issued in a different order on the two sides;
//   - share_unique_id: rank 0's ncclUniqueId broadcast over the bootstrap communicator, with a
//     failure on rank 0 reported on every rank (no rank left waiting);
//   - bounded_wait: the poll loop that bounds every wait of the backend by a timeout.
//
// Thread safety: free functions on caller-owned values; the CountCheck / P2pHeaderCheck
// objects belong to the thread of the rank that made them (like their Exchange handles).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "distca/comm/communicator.h"
#include "distca/core/status.h"

namespace distca::comm::nccl {

// One call of an all-to-all-v on the NCCL side. Offsets index the AllToAllV's send (kSend,
// and src_offset of kSelfCopy) and recv (kRecv, dst_offset of kSelfCopy) buffers.
struct P2pOp {
  enum class Kind { kSend, kRecv, kSelfCopy };
  Kind kind = Kind::kSend;
  int peer = 0;             // the rank itself for kSelfCopy
  std::size_t src_offset = 0;  // kSend, kSelfCopy
  std::size_t dst_offset = 0;  // kRecv, kSelfCopy
  std::size_t bytes = 0;
  bool operator==(const P2pOp&) const = default;
};

// The calls of `a` on rank `rank` of a group of n: validate_all_to_all_v first, then the self
// block (kSelfCopy; invalid_argument when send_counts[rank] != recv_counts[rank]), then the
// receives in ascending peer order, then the sends in ascending peer order. Zero-byte blocks
// make no call (NCCL would move nothing; the count check detects a mismatch instead). The
// NCCL backend issues them inside one ncclGroupStart/ncclGroupEnd, so their order is not a
// correctness matter; it is fixed so the plan is a deterministic function of its input.
// NCCL takes at most kMaxGroupCalls calls per group, and splitting one exchange into several
// groups could deadlock (a peer's matching call may sit in another group), so more sends and
// receives than that are refused (invalid_argument naming the count).
inline constexpr std::size_t kMaxGroupCalls = 2048;
Result<std::vector<P2pOp>> plan_all_to_all_v(const AllToAllV& a, int rank, int n);

// Bytes a buffer must span to hold every block of `counts` at `displs` (max displ + count over
// non-empty blocks; 0 when every count is 0). The staging size of a host buffer.
std::size_t extent(std::span<const std::size_t> counts, std::span<const std::size_t> displs);

// The mismatch message shared with the mpi backend's wording:
// "all_to_all_v: rank P sends N bytes to rank R, which expects M".
Status check_counts(int rank, std::span<const std::size_t> recv_counts,
                    std::span<const uint64_t> peers_send_counts);

// One exchange's count check in flight on the bootstrap communicator: started with the NCCL
// group (so it never delays the device), finished in the exchange's wait().
class CountCheck {
 public:
  // Starts the bootstrap exchange of send_counts (one uint64 to every peer). Collective on the
  // bootstrap: every rank starts its k-th count check in the same order.
  static Result<std::unique_ptr<CountCheck>> start(Communicator& bootstrap, const AllToAllV& a);
  // Waits for the bootstrap exchange and compares (check_counts). Idempotent.
  Status finish();

 private:
  CountCheck() = default;
  int rank_ = 0;
  std::vector<uint64_t> mine_;    // (n) what this rank sends to each peer
  std::vector<uint64_t> theirs_;  // (n) what each peer says it sends here
  std::vector<std::size_t> recv_counts_;  // (n) what this rank expects
  std::unique_ptr<Exchange> handle_;
  bool finished_ = false;
  Status result_;
};

// What each side of a p2p message tells the other (over the bootstrap, same caller tag).
struct P2pHeader {
  uint64_t bytes = 0;  // the side's byte count
  uint64_t seq = 0;    // the message's issue index among this pair's messages in its direction
  uint64_t tag = 0;    // the caller's tag
};

// Compares the two headers of one p2p message as seen from rank `rank` (`is_send`: this side
// sends to `peer`). Errors: invalid_argument with the mpi backend's size wording ("p2p: rank A
// sends N bytes to rank B (tag t), which expects M"), or, when the pair issued its messages in
// another order on the two sides, "p2p (nccl): rank A's message #k to rank B (tag t) meets
// rank B's receive #j: the nccl backend pairs point-to-point messages per peer in issue
// order, so both sides must issue them in the same order".
Status check_p2p_headers(int rank, bool is_send, int peer, const P2pHeader& mine, const P2pHeader& theirs);

// Bootstrap tags of a p2p header: the NCCL backend uses 2t (sender's header) and 2t + 1
// (receiver's header) on the bootstrap communicator, so caller tags must be below
// kNcclP2pTagLimit.
inline constexpr int kNcclP2pTagLimit = kP2pTagLimit / 2;

// One p2p message's header exchange in flight on the bootstrap communicator.
class P2pHeaderCheck {
 public:
  // Posts this side's header (send: tag 2t; receive: tag 2t + 1) and the receive of the
  // other side's. Errors: tag >= kNcclP2pTagLimit, a bootstrap start error.
  static Result<std::unique_ptr<P2pHeaderCheck>> start(Communicator& bootstrap, bool is_send, int peer,
                                                       int tag, const P2pHeader& mine);
  // Waits for both bootstrap messages and compares (check_p2p_headers). Idempotent.
  Status finish();

 private:
  P2pHeaderCheck() = default;
  int rank_ = 0;
  bool is_send_ = false;
  int peer_ = 0;
  P2pHeader mine_, theirs_;
  std::unique_ptr<Exchange> send_, recv_;
  bool finished_ = false;
  Status result_;
};

// The ncclUniqueId's bytes (NCCL_UNIQUE_ID_BYTES == 128; nccl.cpp checks it statically).
using UniqueIdBytes = std::array<std::byte, 128>;

// Rank 0 calls make_id; the result (or its failure) is broadcast over `bootstrap`, so every
// rank returns the same id or the same error "nccl: rank 0 could not create the unique id:
// CAUSE". Collective on the bootstrap.
Result<UniqueIdBytes> share_unique_id(Communicator& bootstrap,
                                      const std::function<Result<UniqueIdBytes>()>& make_id);

// Every rank says whether it is ready (ok) or why not; every rank returns OK only when all
// are, else the first failing rank's cause as "nccl: rank R: CAUSE" (the same on every rank,
// so no rank goes on to a collective the others skip). Collective on the bootstrap.
Status agree_ready(Communicator& bootstrap, const Status& mine);

// The wait loop of the backend. poll() returns true when done, false while pending, or an
// error (returned at once). Between polls, pause() (e.g. a short sleep). Once now_s() - start
// >= timeout_s (timeout_s > 0) without completion, returns
// internal("no progress for T s (nccl timeout): WHAT") after one last poll; the caller then
// aborts the NCCL communicator (its stream may be stuck). timeout_s == 0: no bound.
Status bounded_wait(const std::function<Result<bool>()>& poll, double timeout_s,
                    const std::function<double()>& now_s, const std::function<void()>& pause,
                    const std::string& what);

}  // namespace distca::comm::nccl
