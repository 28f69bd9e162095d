// Backend `nccl`: one process per rank and GPU, data moved by NCCL between device buffers.
// Built only with -DDISTCA_CUDA=ON (target distca_comm_nccl). Not yet run on a GPU: see
// docs/runtime.md, "NCCL backend", for what has and has not been checked.
//
// Bootstrap: the NCCL communicator is made from an existing Communicator (normally the mpi
// backend; any backend works, the tests use local ranks): rank 0's ncclUniqueId is broadcast
// over it (share_unique_id), and every rank first agrees that it found its device
// (agree_ready), so one rank's failure is reported on all. The bootstrap must outlive the
// NCCL communicator; it also carries the count checks and p2p headers (below), barrier(), and
// fail() (mpi: abort_job ends the job).
//
// Buffers: any pointer the CUDA driver knows (cudaPointerGetAttributes): device or managed
// memory is handed to NCCL directly; host memory (pageable or pinned) is staged through a
// device copy, so the base class's barrier/broadcast/all_gather/all_reduce_sum work on host
// spans as they do on the other backends (and give the same bits, being the same code). The
// data path of the runtime uses device buffers.
//
// All-to-all-v: plan_all_to_all_v's calls, grouped in one ncclGroupStart/ncclGroupEnd on the
// communicator's own stream (cudaStreamNonBlocking), the self block a cudaMemcpyAsync on that
// stream. Before the group, the stream waits on an event recorded on the input stream
// (set_input_stream; default: the legacy default stream), so kernels that packed the send
// buffer finish first; after it, a completion event is recorded. test() queries the event;
// wait() polls it (bounded_wait). A consumer stream can wait for an exchange on the device
// with stream_wait(), without blocking the host: that is how ping-pong overlaps the transfer
// of one nano-batch with the kernels of the other on the GPU.
//
// Count check (NcclOptions::verify, default on): each exchange also starts a bootstrap
// all-to-all of its per-peer byte counts; wait() finishes it first, so a count mismatch is
// an invalid_argument naming both ranks (NCCL would hang or corrupt), and the NCCL
// communicators are aborted (their stream may be stuck on the mismatched transfer). The check
// costs one small bootstrap exchange per exchange; it never holds the device back.
//
// Point-to-point: on a second NCCL communicator and stream, so p2p traffic never queues
// behind (or deadlocks with) all-to-all-v exchanges on the device. NCCL has no tags and
// pairs messages per peer in issue order; ncclSend blocks its stream until the receive is
// posted, so start_send/start_recv only QUEUE the call: the queue is issued as one NCCL group
// at the first test()/wait() of any p2p exchange (or flush_p2p()). "Start every receive and
// send, then wait" is therefore deadlock-free as the interface promises. Narrower than the
// interface: (1) both sides must issue one pair's messages in the same order, whatever their
// tags (checked with verify: a p2p header over the bootstrap, tags 2t and 2t+1, detects both
// an order and a size mismatch); (2) tags must be below kNcclP2pTagLimit; (3) at most
// nccl::kMaxGroupCalls calls queued; (4) NCCL does not promise that two communicators'
// operations progress concurrently on one GPU, so a program whose p2p transfer and exchange
// each need the other to progress first could hang (bounded by the timeout); whether the
// runtime's patterns are safe has not been checked on GPUs.
//
// Deterministic all-reduce: the contract of Communicator::all_reduce_sum (rank-order sum in
// the element's type) is kept by the same algorithm: reduce-scatter by all_to_all_v, the
// owner sums its slice's n contributions in rank order, all-gather by all_to_all_v. Host
// spans run the base class code; all_reduce_sum_device runs it on device memory, the sum
// a kernel that adds the n rows in rank order per element (no FMA: only additions), so it
// gives the same bits as the host (NCCL's own ncclAllReduce is not used: its ring/tree order
// depends on the rank count and topology).
//
// Timeouts (NcclOptions::timeout_s, the analogue of --mpi-timeout): every wait is bounded;
// a wait that sees no completion for timeout_s calls ncclCommAbort on both communicators
// and returns internal("no progress for T s (nccl timeout): ..."); the communicator is then
// unusable (every later call fails naming the first error); the caller fails the job as the
// failure contract says. Initialisation (ncclCommInitRankConfig, non-blocking) is bounded too.
//
// Errors: every CUDA and NCCL call is checked; a failure becomes Status::internal("CALL (rank
// R, nccl): MESSAGE") with cudaGetErrorString / ncclGetErrorString and ncclGetLastError.
// Asynchronous NCCL errors (ncclCommGetAsyncError) are checked by every test() and wait().
//
// Thread safety: as the interface (one thread per communicator). Lifetime: every exchange is
// completed before the communicator is destroyed; destroying an unfinished one fails the job
// (fail()).
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <span>

#include "distca/comm/communicator.h"
#include "distca/comm_nccl/nccl_logic.h"

namespace distca::comm {

struct NcclOptions {
  // CUDA device of this rank; -1: bootstrap.rank() % cudaGetDeviceCount (one GPU per local
  // rank when ranks are placed in order).
  int device = -1;
  // Bound of every wait, seconds (0: none). Must exceed the longest compute between two
  // matching exchanges, as --mpi-timeout.
  double timeout_s = 300;
  // Count checks and p2p headers over the bootstrap (see above).
  bool verify = true;
  // Pause between polls of a blocking wait.
  int poll_interval_us = 20;
};

class NcclCommunicator : public Communicator {
 public:
  // The stream the all-to-all-v exchanges run on (owned by the communicator).
  virtual cudaStream_t stream() const = 0;
  virtual int device() const = 0;
  // Later exchanges wait (on the device) for the work queued on `s` before their start.
  // Default: the legacy default stream (0). `s` must outlive its use.
  virtual void set_input_stream(cudaStream_t s) = 0;
  // Makes `consumer` wait on the device for `ex` (an exchange of this communicator) to
  // complete; the host does not block. ex must still be wait()ed before it is destroyed.
  // Errors: ex is not an exchange of this communicator, a CUDA error.
  virtual Status stream_wait(Exchange& ex, cudaStream_t consumer) = 0;
  // Issues the queued point-to-point calls (see above) now.
  virtual Status flush_p2p() = 0;
  // Communicator::all_reduce_sum's contract over device memory: data: (len) on the device,
  // the same len on every rank. Blocking; the result is in place when it returns.
  virtual Status all_reduce_sum_device(std::span<float> data) = 0;
  virtual Status all_reduce_sum_device(std::span<double> data) = 0;
};

// Creates this rank's NCCL communicator over `bootstrap` (collective on it). Errors: no CUDA
// device or a CUDA/NCCL failure on any rank (every rank returns "nccl: rank R: CAUSE"), bad
// options (invalid_argument, before any collective).
Result<std::unique_ptr<NcclCommunicator>> make_nccl_communicator(Communicator& bootstrap,
                                                                 const NcclOptions& options = {});

// How many CUDA devices this process sees; 0 without a driver or a device (never an error):
// the test programs use it to skip.
int cuda_device_count();

}  // namespace distca::comm
