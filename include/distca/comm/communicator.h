// Communicator: the one interface every distributed part of distca talks through.
//
// A Communicator is one rank's endpoint in a group of size() ranks. Backends:
//   - local (local.h): N ranks as threads of one process sharing memory; the embedded default
//     of `distca train` and the test double.
//   - mpi (mpi.h): one OpenMPI process per rank, on one machine or many.
// Both run the same reduction code (all_reduce_sum below), so the same inputs give the same
// bits on every rank and on either backend.
//
// Collective contract (NCCL/MPI style): every rank of the group calls the same collectives in
// the same order, with matching sizes (what rank p sends to rank q is exactly what q expects
// from p). A mismatch is reported as a non-OK Status on at least one rank (local: on all).
//
// Failure contract: any non-OK Status from a collective means the group is unusable; the
// caller passes it to fail() (or returns it from the function run by run_local), which ends
// the whole job. No rank is left blocked: local wakes every waiting rank with an error naming
// the failed rank; mpi prints "distca: rank R failed: CAUSE" and calls MPI_Abort, after which
// mpirun kills every rank and exits non-zero. See docs/runtime.md, "Communicator".
//
// Point-to-point contract (start_send / start_recv, for pipeline stages): independent of the
// collective sequence. The k-th send from rank A to rank B with tag t matches the k-th receive
// on B from A with tag t (FIFO per (source, destination, tag)); messages of different tags or
// peers are unordered with respect to each other. A rank may have sends and receives in flight
// while it runs collectives and all-to-all-v exchanges, in any interleaving that is
// deadlock-free as a program (a send completes once its receive is posted - never later than
// the peer's start_recv plus its progress - so "start every receive and send, then wait" is
// always safe, self-sends included). Failures follow the failure contract below: a failed rank
// makes every pending or later p2p wait on the group return an error naming it (local), or
// ends the job (mpi, where a silent peer is bounded by MpiOptions::timeout_s).
//
// Thread safety: a Communicator and its Exchange handles belong to the thread that runs its
// rank; calls on them must not overlap. Several exchanges may be in flight at once and be
// completed in any order. Distinct ranks' Communicators (local backend) are used
// concurrently, each from its own thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "distca/core/status.h"

namespace distca::comm {

// Describes one all-to-all-v over raw bytes, from the calling rank's point of view. With
// n = size() ranks:
//   send:          the send buffer; block for peer p is send[send_displs[p] .. + send_counts[p])
//   send_counts:   (n) bytes this rank sends to peer p (self included)
//   send_displs:   (n) byte offset of peer p's block in `send`
//   recv:          the receive buffer; block from peer p lands in
//                  recv[recv_displs[p] .. + recv_counts[p])
//   recv_counts:   (n) bytes this rank receives from peer p; must equal what p sends here
//   recv_displs:   (n) byte offset of peer p's block in `recv`
// Send blocks may overlap each other (they are only read); receive blocks must not overlap
// each other nor any send block. Zero counts are allowed (the pointer may then be null).
struct AllToAllV {
  const std::byte* send = nullptr;
  std::span<const std::size_t> send_counts;
  std::span<const std::size_t> send_displs;
  std::byte* recv = nullptr;
  std::span<const std::size_t> recv_counts;
  std::span<const std::size_t> recv_displs;
  // Optional name of the exchange in a backend's own trace (MpiOptions::trace: the transfer's
  // event is called "<label> transfer" instead of "all_to_all_v"); read at start only.
  const char* label = nullptr;
};

// Checks the shapes of `a` for a group of n ranks (span lengths == n); says which field is
// wrong. Backends call it first; exposed for callers that want to validate early.
Status validate_all_to_all_v(const AllToAllV& a, int n);

// A non-blocking exchange in flight. Until wait() returns (or test() returns true) the send
// buffer must not be modified and the receive buffer must not be read; the count and
// displacement arrays are copied at start and may be freed right away.
//
// Progress: the backend moves data while the caller computes (mpi: a progress thread, or
// test() polling when MPI lacks MPI_THREAD_MULTIPLE; local: peers pull from posted buffers).
// Destroying a handle that was never completed fails the job (local: the group fails with
// "rank R failed: dropped an unfinished exchange", replaced by the rank's own error if it
// reports one; mpi: abort_job): waiting there could hang and freeing the buffers under a live
// transfer is undefined. So on an error, call fail(cause) before unwinding past an exchange.
class Exchange {
 public:
  virtual ~Exchange() = default;
  // Blocks until this rank's part is complete: all blocks received and every peer done with
  // this rank's send buffer. Idempotent: later calls return the first result.
  virtual Status wait() = 0;
  // Non-blocking: true once wait() would return at once. Errors surface from wait().
  virtual bool test() = 0;
};

// Tags of point-to-point messages: 0 <= tag < kP2pTagLimit. Chosen by the caller (a pipeline
// might use one tag per kind of tensor); both backends keep them apart from the collectives'
// own traffic (see start_send).
inline constexpr int kP2pTagLimit = 1 << 20;

// Checks one point-to-point call's arguments for rank `rank` of a group of n: peer in
// [0, n), tag in [0, kP2pTagLimit), a non-null buffer when bytes > 0. `call` names it in the
// message ("start_send"). Backends call it first.
Status validate_p2p(const char* call, const void* data, std::size_t bytes, int peer, int tag,
                    int rank, int n);

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Short backend name ("local", "mpi") for logs.
  virtual std::string backend() const = 0;

  // Returns once every rank has entered barrier().
  virtual Status barrier() = 0;

  // Blocking all-to-all-v (layout: AllToAllV). Equivalent to start + wait.
  virtual Status all_to_all_v(const AllToAllV& a) = 0;
  // Non-blocking all-to-all-v; every rank starts its k-th exchange in the same order.
  virtual Result<std::unique_ptr<Exchange>> start_all_to_all_v(const AllToAllV& a) = 0;

  // Non-blocking send of `data` (bytes) to rank `peer` with `tag` (0 <= tag < kP2pTagLimit);
  // peer == rank() is allowed. `data` must stay unchanged until the returned Exchange's
  // wait() returns or test() is true. Matching (point-to-point contract above): the k-th send
  // from A to B with tag t pairs with the k-th receive on B from A with tag t; the sizes must
  // be equal: a mismatch makes both sides' wait() return invalid_argument
  // "p2p: rank A sends N bytes to rank B (tag t), which expects M" - never a hang nor a
  // silent truncation (the receive buffer's contents are then unspecified). `label`
  // (optional, read at start only) names the transfer in a backend's trace (MpiOptions::trace:
  // "<label> transfer"; default "p2p send" / "p2p recv").
  // Errors at start: validate_p2p (local: also fails the group, as the peer would wait
  // forever), a group that has failed (local), a message over MPI's int count (mpi).
  // Tag space: local matches on (source, destination, tag) in its own table; mpi sends p2p
  // traffic on a second private duplicate of MPI_COMM_WORLD, so p2p tags can never meet the
  // sequence-number tags of all-to-all-v exchanges (mpi.h).
  virtual Result<std::unique_ptr<Exchange>> start_send(std::span<const std::byte> data, int peer,
                                                       int tag, const char* label = nullptr) = 0;
  // Non-blocking receive of exactly data.size() bytes from rank `peer` with `tag` into `data`,
  // which must not be read until wait() returns or test() is true. Same rules as start_send.
  virtual Result<std::unique_ptr<Exchange>> start_recv(std::span<std::byte> data, int peer,
                                                       int tag, const char* label = nullptr) = 0;

  // Typed point-to-point conveniences: data: (len) elements of T.
  template <class T>
  Result<std::unique_ptr<Exchange>> start_send_values(std::span<const T> data, int peer, int tag,
                                                      const char* label = nullptr) {
    static_assert(std::is_trivially_copyable_v<T>);
    return start_send(std::as_bytes(data), peer, tag, label);
  }
  template <class T>
  Result<std::unique_ptr<Exchange>> start_recv_values(std::span<T> data, int peer, int tag,
                                                      const char* label = nullptr) {
    static_assert(std::is_trivially_copyable_v<T>);
    return start_recv(std::as_writable_bytes(data), peer, tag, label);
  }

  // data: (bytes) on every rank; on return every rank holds root's bytes. Same size on all.
  virtual Status broadcast(std::span<std::byte> data, int root);

  // send: (k bytes) per rank, the same k on every rank; recv: (size() * k bytes), rank-major:
  // rank p's contribution lands in recv[p*k .. (p+1)*k).
  virtual Status all_gather(std::span<const std::byte> send, std::span<std::byte> recv);

  // Variable all-gather. counts: (size()) bytes of every rank's block, the same array on every
  // rank; send: (counts[rank()] bytes); recv: (sum of counts bytes), rank-major: rank p's block
  // lands in recv[displ(p) .. + counts[p]) with displ(p) = counts[0] + ... + counts[p-1]
  // (all_gather_displs). A copy: no arithmetic. Errors: a counts array of the wrong length, a
  // send or recv of the wrong size (checked on the calling rank before anything moves).
  Status all_gather_v(std::span<const std::byte> send, std::span<const std::size_t> counts,
                      std::span<std::byte> recv);

  // Deterministic reduce-scatter, the inverse layout of all_gather_v. counts: (size()) elements
  // of every rank's block, the same on every rank; data: (sum of counts) floats on every rank,
  // block p at all_gather_displs(counts)[p]; out: (counts[rank()]). On return out[i] =
  // ((d_0 + d_1) + d_2) + ... + d_{n-1}, d_p being element i of block rank() of rank p's data,
  // added in rank order in float, so the bits do not depend on the backend or on timing. Each
  // rank sends sum(counts) - counts[rank()] elements. Errors as for all_gather_v.
  Status reduce_scatter_sum(std::span<const float> data, std::span<const std::size_t> counts,
                            std::span<float> out);

  // Deterministic in-place sum over ranks: data: (len), the same len on every rank. On return
  // every element equals ((x_0 + x_1) + x_2) + ... + x_{n-1}, added in rank order in the
  // element's own type, so every rank - and either backend - gets identical bits.
  // Algorithm: reduce-scatter by slices (all_to_all_v), rank-order sum of each slice by its
  // owner, all-gather of the slices (all_to_all_v): 2 (n-1)/n len elements sent per rank.
  Status all_reduce_sum(std::span<float> data);
  Status all_reduce_sum(std::span<double> data);

  // Typed conveniences over the byte calls above.
  template <class T>
  Result<std::vector<T>> all_gather_value(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>);
    std::vector<T> out(static_cast<std::size_t>(size()));
    Status st = all_gather(std::as_bytes(std::span<const T>(&value, 1)),
                           std::as_writable_bytes(std::span<T>(out)));
    if (!st.ok()) return st;
    return out;
  }

  // Collective: a host id per rank ([size()]): ranks with the same id share a machine's memory
  // (the planner's topology, plan/topology.h). mpi: MPI's shared-memory split
  // (MPI_Comm_split_type MPI_COMM_TYPE_SHARED), the id being the lowest rank of the split, so
  // ids lie in [0, size()). This default (local, groups): every rank on host 0.
  virtual Result<std::vector<int64_t>> host_ids();

  // Progress hint around a blocking collective built from non-blocking calls (a group's
  // all_to_all_v: start every receive and send, then wait for each): every exchange this
  // thread starts between begin_blocking() and the matching end_blocking() is waited for
  // before end_blocking(), so a backend may leave its progress to those waits instead of a
  // background engine. Pairs nest. Default: nothing (local). mpi in kThread mode: such
  // exchanges are never handed to the progress thread; their wait() drives them (an
  // exchange left unwaited past end_blocking() progresses only in its test()/wait()).
  virtual void begin_blocking() {}
  virtual void end_blocking() {}

  // Ends the job because of `cause` (a failure on this rank). mpi: prints
  // "distca: rank R failed: CAUSE" to stderr once and calls MPI_Abort (never returns). local:
  // marks the group failed so every rank blocked in a collective returns an error naming this
  // rank; the caller then returns the error from its rank function.
  virtual void fail(const Status& cause) = 0;
};

// The block offsets of all_gather_v and reduce_scatter_sum: (counts.size()) exclusive prefix
// sums of counts.
std::vector<std::size_t> all_gather_displs(std::span<const std::size_t> counts);

// The reference the deterministic all-reduce must match bit for bit: contributions[p] is
// rank p's (len) input; returns the element-wise sum in rank order 0..n-1.
template <class T>
std::vector<T> serial_rank_order_sum(const std::vector<std::vector<T>>& contributions) {
  if (contributions.empty()) return {};
  std::vector<T> acc = contributions[0];
  for (std::size_t p = 1; p < contributions.size(); ++p) {
    DISTCA_CHECK(contributions[p].size() == acc.size());
    for (std::size_t i = 0; i < acc.size(); ++i) acc[i] += contributions[p][i];
  }
  return acc;
}

}  // namespace distca::comm
