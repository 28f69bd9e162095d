// Backend `nccl` (include/distca/comm_nccl/nccl.h): NCCL communicators, streams, events and
// host staging. The host-side rules (call plan, count checks, headers, bounded waits) live in
// nccl_logic.cpp, where they are tested without a GPU.
#include "distca/comm_nccl/nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "rank_order_sum.h"

namespace distca::comm {
namespace {

using nccl::P2pOp;
// The longest a destructor waits for ncclCommFinalize before aborting instead.
constexpr double kFinalizeLimitS = 5.0;
static_assert(sizeof(ncclUniqueId) == sizeof(nccl::UniqueIdBytes), "ncclUniqueId size changed");

Status cuda_status(cudaError_t e, const char* call, int rank) {
  if (e == cudaSuccess) return Status::ok_status();
  return Status::internal(std::string(call) + " (rank " + std::to_string(rank) + ", nccl): " + cudaGetErrorName(e) +
                          ": " + cudaGetErrorString(e));
}

Status nccl_status(ncclResult_t r, const char* call, int rank, ncclComm_t comm) {
  if (r == ncclSuccess || r == ncclInProgress) return Status::ok_status();
  std::string m = std::string(call) + " (rank " + std::to_string(rank) + ", nccl): " + ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') m += std::string(" (") + last + ")";
  return Status::internal(m);
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Reusable pinned host buffers for staging host spans (cudaFreeHost may synchronise the
// device, which could stall a rank behind an exchange still waiting for a peer; so buffers
// go back to the pool and are freed only with the communicator).
class PinnedPool {
 public:
  ~PinnedPool() {
    for (auto& [bytes, p] : free_) (void)cudaFreeHost(p);
  }
  Result<std::byte*> get(std::size_t bytes, int rank) {
    auto it = free_.lower_bound(bytes);
    if (it != free_.end()) {
      std::byte* p = it->second;
      sizes_[p] = it->first;
      free_.erase(it);
      return p;
    }
    const std::size_t size = std::max<std::size_t>(bytes, 4096);
    void* p = nullptr;
    DISTCA_RETURN_IF_ERROR(cuda_status(cudaMallocHost(&p, size), "cudaMallocHost", rank));
    sizes_[static_cast<std::byte*>(p)] = size;
    return static_cast<std::byte*>(p);
  }
  void put(std::byte* p) {
    if (p == nullptr) return;
    auto it = sizes_.find(p);
    if (it == sizes_.end()) return;
    free_.emplace(it->second, p);
    sizes_.erase(it);
  }

 private:
  std::multimap<std::size_t, std::byte*> free_;  // bytes -> buffer
  std::map<std::byte*, std::size_t> sizes_;       // buffers in use
};

// One exchange's device work and host bookkeeping. The device writes the staged receive into
// pinned_recv; completion copies its blocks to the caller's host buffer.
struct Transfer {
  std::string what;  // names the exchange in errors
  bool p2p = false;
  bool issued = false;  // device work enqueued and `done` recorded (p2p: at flush)
  cudaEvent_t in = nullptr, done = nullptr;
  std::byte* pinned_send = nullptr;  // host send data copied here at start (staging)
  std::byte* pinned_recv = nullptr;  // staged receive, written by the device
  std::size_t send_extent = 0, recv_extent = 0;
  std::byte* host_recv = nullptr;    // the caller's host receive buffer (staging)
  std::vector<std::pair<std::size_t, std::size_t>> recv_blocks;  // (offset, bytes) to copy back
  // p2p, until flush:
  bool is_send = false;
  int peer = 0;
  const std::byte* send_ptr = nullptr;  // device pointer, or null when staged
  std::byte* recv_ptr = nullptr;        // device pointer, or null when staged
  std::size_t bytes = 0;
  std::unique_ptr<nccl::CountCheck> counts;
  std::unique_ptr<nccl::P2pHeaderCheck> header;
};

class NcclCommImpl;

class NcclExchange final : public Exchange {
 public:
  NcclExchange(NcclCommImpl* owner, std::shared_ptr<Transfer> t) : owner_(owner), t_(std::move(t)) {}
  ~NcclExchange() override;
  Status wait() override;
  bool test() override;
  const std::shared_ptr<Transfer>& transfer() const { return t_; }
  NcclCommImpl* owner() const { return owner_; }

 private:
  NcclCommImpl* owner_;
  std::shared_ptr<Transfer> t_;
  bool completed_ = false;
  Status result_;
  friend class NcclCommImpl;
};

class NcclCommImpl final : public NcclCommunicator {
 public:
  NcclCommImpl(Communicator& boot, const NcclOptions& o) : boot_(boot), opt_(o), rank_(boot.rank()), size_(boot.size()) {}

  ~NcclCommImpl() override {
    // Non-blocking communicators: finalize, then destroy. Every exchange is complete by
    // contract, so finalize has nothing to flush and settles at once; one that does not within
    // kFinalizeLimitS (a peer gone, a stuck stream) is aborted instead, so the destructor never
    // waits out the whole timeout. Nothing to report to from a destructor.
    for (ncclComm_t* c : {&comm_, &p2p_comm_}) {
      if (*c == nullptr) continue;
      const bool finalized = nccl_status(ncclCommFinalize(*c), "ncclCommFinalize", rank_, *c).ok() &&
                             settle(*c, "ncclCommFinalize", std::min(opt_.timeout_s, kFinalizeLimitS)).ok();
      (void)(finalized ? ncclCommDestroy(*c) : ncclCommAbort(*c));
      *c = nullptr;
    }
    for (cudaStream_t s : {stream_, p2p_stream_}) {
      if (s != nullptr) (void)cudaStreamDestroy(s);
    }
  }

  // Device, streams, the two NCCL communicators; every step agreed on by all ranks. When any
  // rank fails, every rank aborts the communicators it has created (or is creating): a
  // finalize would wait for peers that never join.
  Status init() {
    Status st = init_all();
    if (!st.ok()) abort_comms();
    return st;
  }

  Status init_all() {
    Status mine = [&]() -> Status {
      const int count = cuda_device_count();
      if (count == 0) return Status::internal("no CUDA device (cudaGetDeviceCount found none)");
      device_ = opt_.device >= 0 ? opt_.device : rank_ % count;
      if (device_ >= count) {
        return Status::invalid_argument("device " + std::to_string(device_) + " does not exist (" +
                                        std::to_string(count) + " visible)");
      }
      DISTCA_RETURN_IF_ERROR(cuda_status(cudaSetDevice(device_), "cudaSetDevice", rank_));
      DISTCA_RETURN_IF_ERROR(cuda_status(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", rank_));
      return cuda_status(cudaStreamCreateWithFlags(&p2p_stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", rank_);
    }();
    DISTCA_RETURN_IF_ERROR(nccl::agree_ready(boot_, mine));
    for (ncclComm_t* c : {&comm_, &p2p_comm_}) {
      auto make_id = [&]() -> Result<nccl::UniqueIdBytes> {
        ncclUniqueId id;
        DISTCA_RETURN_IF_ERROR(nccl_status(ncclGetUniqueId(&id), "ncclGetUniqueId", rank_, nullptr));
        nccl::UniqueIdBytes b;
        std::memcpy(b.data(), &id, sizeof(id));
        return b;
      };
      DISTCA_ASSIGN_OR_RETURN(auto bytes, nccl::share_unique_id(boot_, make_id));
      ncclUniqueId id;
      std::memcpy(&id, bytes.data(), sizeof(id));
      // Non-blocking: initialisation and every later call can be bounded and aborted.
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      Status st = nccl_status(ncclCommInitRankConfig(c, size_, id, rank_, &config), "ncclCommInitRankConfig", rank_, nullptr);
      if (st.ok()) st = settle(*c, "ncclCommInitRankConfig");
      DISTCA_RETURN_IF_ERROR(nccl::agree_ready(boot_, st));
    }
    return Status::ok_status();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  cudaStream_t stream() const override { return stream_; }
  int device() const override { return device_; }
  void set_input_stream(cudaStream_t s) override { input_ = s; }

  // A host-level barrier: every rank has entered it (device work is not ordered by it).
  Status barrier() override {
    DISTCA_RETURN_IF_ERROR(usable());
    return boot_.barrier().with_context("nccl barrier");
  }

  Status all_to_all_v(const AllToAllV& a) override {
    DISTCA_ASSIGN_OR_RETURN(auto ex, start_all_to_all_v(a));
    return ex->wait();
  }

  Result<std::unique_ptr<Exchange>> start_all_to_all_v(const AllToAllV& a) override {
    DISTCA_RETURN_IF_ERROR(usable());
    DISTCA_ASSIGN_OR_RETURN(auto ops, nccl::plan_all_to_all_v(a, rank_, size_));
    auto t = std::make_shared<Transfer>();
    t->what = (a.label ? std::string(a.label) : std::string("all_to_all_v")) + " #" + std::to_string(seq_++) +
              " (rank " + std::to_string(rank_) + ")";
    if (opt_.verify && size_ > 1) {
      DISTCA_ASSIGN_OR_RETURN(t->counts, nccl::CountCheck::start(boot_, a));
    }
    Status st = enqueue_all_to_all_v(a, ops, *t);
    if (!st.ok()) return fail_comms(st);
    return std::unique_ptr<Exchange>(std::make_unique<NcclExchange>(this, std::move(t)));
  }

  Result<std::unique_ptr<Exchange>> start_send(std::span<const std::byte> data, int peer, int tag,
                                               const char* label) override {
    return start_p2p(true, data.data(), nullptr, data.size(), peer, tag, label);
  }
  Result<std::unique_ptr<Exchange>> start_recv(std::span<std::byte> data, int peer, int tag,
                                               const char* label) override {
    return start_p2p(false, nullptr, data.data(), data.size(), peer, tag, label);
  }

  Status flush_p2p() override {
    if (queue_.empty()) return Status::ok_status();
    DISTCA_RETURN_IF_ERROR(usable());
    std::vector<std::shared_ptr<Transfer>> q = std::move(queue_);
    queue_.clear();
    Status st = issue_p2p(q);
    if (!st.ok()) return fail_comms(st);
    return st;
  }

  Status stream_wait(Exchange& ex, cudaStream_t consumer) override {
    auto* e = dynamic_cast<NcclExchange*>(&ex);
    if (e == nullptr || e->owner() != this) {
      return Status::invalid_argument("stream_wait: the exchange does not belong to this nccl communicator");
    }
    if (e->completed_) return e->result_;
    if (e->transfer()->p2p) DISTCA_RETURN_IF_ERROR(flush_p2p());
    return cuda_status(cudaStreamWaitEvent(consumer, e->transfer()->done, 0), "cudaStreamWaitEvent", rank_);
  }

  Status all_reduce_sum_device(std::span<float> data) override { return reduce_device(data); }
  Status all_reduce_sum_device(std::span<double> data) override { return reduce_device(data); }

  void fail(const Status& cause) override {
    abort_comms();
    if (failed_.ok()) failed_ = cause;
    boot_.fail(cause);
  }

  // --- used by NcclExchange ---

  // One look at a transfer: an asynchronous NCCL error, then its completion event.
  Result<bool> poll(Transfer& t) {
    if (t.p2p && !t.issued) DISTCA_RETURN_IF_ERROR(flush_p2p());
    DISTCA_RETURN_IF_ERROR(usable());
    ncclComm_t c = t.p2p ? p2p_comm_ : comm_;
    ncclResult_t async = ncclSuccess;
    DISTCA_RETURN_IF_ERROR(nccl_status(ncclCommGetAsyncError(c, &async), "ncclCommGetAsyncError", rank_, c));
    DISTCA_RETURN_IF_ERROR(nccl_status(async, ("NCCL asynchronous error in " + t.what).c_str(), rank_, c));
    const cudaError_t e = cudaEventQuery(t.done);
    if (e == cudaErrorNotReady) return false;
    DISTCA_RETURN_IF_ERROR(cuda_status(e, "cudaEventQuery", rank_));
    return true;
  }

  Status wait_transfer(Transfer& t) {
    // The checks first: a mismatch would leave the device stuck, and they name both sides.
    if (t.counts) DISTCA_RETURN_IF_ERROR(failed_after(t.counts->finish(), t));
    if (t.header) DISTCA_RETURN_IF_ERROR(failed_after(t.header->finish(), t));
    Status st = nccl::bounded_wait([&] { return poll(t); }, opt_.timeout_s, now_s,
                                   [&] { std::this_thread::sleep_for(std::chrono::microseconds(opt_.poll_interval_us)); },
                                   t.what + " did not complete");
    if (!st.ok()) return fail_comms(st);
    return complete(t);
  }

  // Non-blocking: true once wait_transfer would return at once; *out then holds its result.
  bool test_transfer(Transfer& t, Status* out) {
    Result<bool> r = poll(t);
    if (!r.ok()) {
      *out = fail_comms(r.status());
      return true;
    }
    if (!r.value()) return false;
    // The device part is done; the bootstrap checks finish at once or soon (their peers
    // posted them with the same exchange).
    *out = wait_transfer(t);
    return true;
  }

  // A dropped unfinished exchange ends the job (the interface's lifetime rule).
  void dropped(const Transfer& t) {
    fail(Status::internal("rank " + std::to_string(rank_) + " dropped an unfinished exchange (" + t.what + ")"));
  }

 private:
  Status usable() const {
    if (failed_.ok()) return failed_;
    return Status::internal("nccl communicator (rank " + std::to_string(rank_) + ") is unusable after: " + failed_.message());
  }

  // Aborts both NCCL communicators (their streams may be stuck) and records the first cause.
  Status fail_comms(const Status& cause) {
    abort_comms();
    if (failed_.ok()) failed_ = cause;
    return cause;
  }
  Status failed_after(const Status& st, const Transfer& t) {
    if (st.ok()) return st;
    return fail_comms(st.with_context(t.what));
  }
  void abort_comms() {
    for (ncclComm_t* c : {&comm_, &p2p_comm_}) {
      if (*c != nullptr) (void)ncclCommAbort(*c);
      *c = nullptr;
    }
  }

  // Waits until a non-blocking NCCL call on `c` has finished (ncclInProgress no more), at most
  // limit_s (the communicator's timeout unless given).
  Status settle(ncclComm_t c, const char* call, double limit_s = -1) {
    return nccl::bounded_wait(
        [&]() -> Result<bool> {
          ncclResult_t async = ncclSuccess;
          DISTCA_RETURN_IF_ERROR(nccl_status(ncclCommGetAsyncError(c, &async), "ncclCommGetAsyncError", rank_, c));
          if (async == ncclInProgress) return false;
          DISTCA_RETURN_IF_ERROR(nccl_status(async, call, rank_, c));
          return true;
        },
        limit_s >= 0 ? limit_s : opt_.timeout_s, now_s,
        [&] { std::this_thread::sleep_for(std::chrono::microseconds(opt_.poll_interval_us)); },
        std::string(call) + " (rank " + std::to_string(rank_) + ") did not finish");
  }

  Result<bool> is_device(const void* p) {
    if (p == nullptr) return true;  // nothing to stage
    cudaPointerAttributes attr{};
    DISTCA_RETURN_IF_ERROR(cuda_status(cudaPointerGetAttributes(&attr, p), "cudaPointerGetAttributes", rank_));
    return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
  }

  Status create_events(Transfer& t, cudaStream_t s) {
    DISTCA_RETURN_IF_ERROR(cuda_status(cudaEventCreateWithFlags(&t.in, cudaEventDisableTiming), "cudaEventCreateWithFlags", rank_));
    DISTCA_RETURN_IF_ERROR(cuda_status(cudaEventCreateWithFlags(&t.done, cudaEventDisableTiming), "cudaEventCreateWithFlags", rank_));
    DISTCA_RETURN_IF_ERROR(cuda_status(cudaEventRecord(t.in, input_), "cudaEventRecord", rank_));
    return s ? cuda_status(cudaStreamWaitEvent(s, t.in, 0), "cudaStreamWaitEvent", rank_) : Status::ok_status();
  }

  // Copies the host send data of [0, extent) into a pinned buffer now (the caller may reuse
  // nothing before completion anyway, but pageable memory cannot be copied asynchronously).
  Status stage_send(Transfer& t, const std::byte* host, std::size_t extent) {
    t.send_extent = extent;
    if (extent == 0) return Status::ok_status();
    DISTCA_ASSIGN_OR_RETURN(t.pinned_send, pool_.get(extent, rank_));
    std::memcpy(t.pinned_send, host, extent);
    return Status::ok_status();
  }

  // Device scratch of `bytes` on `s` (stream-ordered; freed by free_on after its last use).
  Result<std::byte*> scratch(std::size_t bytes, cudaStream_t s) {
    void* p = nullptr;
    DISTCA_RETURN_IF_ERROR(cuda_status(cudaMallocAsync(&p, std::max<std::size_t>(bytes, 1), s), "cudaMallocAsync", rank_));
    return static_cast<std::byte*>(p);
  }
  Status free_on(std::byte* p, cudaStream_t s) {
    return p ? cuda_status(cudaFreeAsync(p, s), "cudaFreeAsync", rank_) : Status::ok_status();
  }

  Status enqueue_all_to_all_v(const AllToAllV& a, const std::vector<P2pOp>& ops, Transfer& t) {
    DISTCA_RETURN_IF_ERROR(create_events(t, stream_));
    DISTCA_ASSIGN_OR_RETURN(bool send_dev, is_device(a.send));
    DISTCA_ASSIGN_OR_RETURN(bool recv_dev, is_device(a.recv));
    const std::byte* send = a.send;
    std::byte* recv = a.recv;
    std::byte *dsend = nullptr, *drecv = nullptr;
    if (!send_dev) {
      DISTCA_RETURN_IF_ERROR(stage_send(t, a.send, nccl::extent(a.send_counts, a.send_displs)));
      if (t.send_extent > 0) {
        DISTCA_ASSIGN_OR_RETURN(dsend, scratch(t.send_extent, stream_));
        DISTCA_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(dsend, t.pinned_send, t.send_extent, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync", rank_));
      }
      send = dsend;
    }
    if (!recv_dev) {
      t.recv_extent = nccl::extent(a.recv_counts, a.recv_displs);
      t.host_recv = a.recv;
      for (std::size_t p = 0; p < a.recv_counts.size(); ++p) {
        if (a.recv_counts[p] > 0) t.recv_blocks.emplace_back(a.recv_displs[p], a.recv_counts[p]);
      }
      if (t.recv_extent > 0) {
        DISTCA_ASSIGN_OR_RETURN(t.pinned_recv, pool_.get(t.recv_extent, rank_));
        DISTCA_ASSIGN_OR_RETURN(drecv, scratch(t.recv_extent, stream_));
      }
      recv = drecv;
    }
    bool group_open = false;
    for (const P2pOp& op : ops) {
      if (op.kind == P2pOp::Kind::kSelfCopy) {
        DISTCA_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(recv + op.dst_offset, send + op.src_offset, op.bytes, cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync", rank_));
        continue;
      }
      if (!group_open) {
        DISTCA_RETURN_IF_ERROR(nccl_status(ncclGroupStart(), "ncclGroupStart", rank_, comm_));
        group_open = true;
      }
      const ncclResult_t r = op.kind == P2pOp::Kind::kSend
                                 ? ncclSend(send + op.src_offset, op.bytes, ncclUint8, op.peer, comm_, stream_)
                                 : ncclRecv(recv + op.dst_offset, op.bytes, ncclUint8, op.peer, comm_, stream_);
      Status st = nccl_status(r, op.kind == P2pOp::Kind::kSend ? "ncclSend" : "ncclRecv", rank_, comm_);
      if (!st.ok()) {
        (void)ncclGroupEnd();
        return st;
      }
    }
    if (group_open) {
      DISTCA_RETURN_IF_ERROR(nccl_status(ncclGroupEnd(), "ncclGroupEnd", rank_, comm_));
      DISTCA_RETURN_IF_ERROR(settle(comm_, "ncclGroupEnd"));
    }
    if (drecv) {
      DISTCA_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(t.pinned_recv, drecv, t.recv_extent, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync", rank_));
    }
    DISTCA_RETURN_IF_ERROR(free_on(dsend, stream_));
    DISTCA_RETURN_IF_ERROR(free_on(drecv, stream_));
    DISTCA_RETURN_IF_ERROR(cuda_status(cudaEventRecord(t.done, stream_), "cudaEventRecord", rank_));
    t.issued = true;
    return Status::ok_status();
  }

  Result<std::unique_ptr<Exchange>> start_p2p(bool is_send, const std::byte* send, std::byte* recv, std::size_t bytes,
                                              int peer, int tag, const char* label) {
    const char* call = is_send ? "start_send" : "start_recv";
    DISTCA_RETURN_IF_ERROR(validate_p2p(call, is_send ? static_cast<const void*>(send) : recv, bytes, peer, tag, rank_, size_));
    DISTCA_RETURN_IF_ERROR(usable());
    if (queue_.size() >= nccl::kMaxGroupCalls) {  // flushed as one group: NCCL's limit
      return Status::invalid_argument(std::string(call) + " (rank " + std::to_string(rank_) + "): " +
                                      std::to_string(queue_.size()) +
                                      " point-to-point calls queued, NCCL's group limit; wait for some first");
    }
    auto t = std::make_shared<Transfer>();
    t->p2p = true;
    t->is_send = is_send;
    t->peer = peer;
    t->bytes = bytes;
    t->what = (label ? std::string(label) : std::string(is_send ? "p2p send" : "p2p recv")) + " (rank " +
              std::to_string(rank_) + (is_send ? " to " : " from ") + std::to_string(peer) + ", tag " +
              std::to_string(tag) + ")";
    uint64_t& seq = (is_send ? send_seq_ : recv_seq_)[peer];
    if (opt_.verify) {
      DISTCA_ASSIGN_OR_RETURN(t->header, nccl::P2pHeaderCheck::start(boot_, is_send, peer, tag,
                                                                     {bytes, seq, static_cast<uint64_t>(tag)}));
    }
    ++seq;
    Status st = [&]() -> Status {
      DISTCA_RETURN_IF_ERROR(create_events(*t, nullptr));  // the p2p stream waits at flush
      DISTCA_ASSIGN_OR_RETURN(bool dev, is_device(is_send ? static_cast<const void*>(send) : recv));
      if (is_send) {
        if (dev) t->send_ptr = send;
        else DISTCA_RETURN_IF_ERROR(stage_send(*t, send, bytes));
      } else if (dev) {
        t->recv_ptr = recv;
      } else {
        t->host_recv = recv;
        t->recv_extent = bytes;
        if (bytes > 0) {
          t->recv_blocks.emplace_back(0, bytes);
          DISTCA_ASSIGN_OR_RETURN(t->pinned_recv, pool_.get(bytes, rank_));
        }
      }
      return Status::ok_status();
    }();
    if (!st.ok()) return fail_comms(st);
    queue_.push_back(t);
    return std::unique_ptr<Exchange>(std::make_unique<NcclExchange>(this, std::move(t)));
  }

  // The queued p2p calls as one group on the p2p stream, after each one's input event.
  Status issue_p2p(const std::vector<std::shared_ptr<Transfer>>& q) {
    std::vector<std::byte*> scratch_bufs;
    std::vector<std::byte*> dev_recv(q.size(), nullptr);
    std::vector<const std::byte*> dev_send(q.size(), nullptr);
    for (std::size_t i = 0; i < q.size(); ++i) {
      Transfer& t = *q[i];
      DISTCA_RETURN_IF_ERROR(cuda_status(cudaStreamWaitEvent(p2p_stream_, t.in, 0), "cudaStreamWaitEvent", rank_));
      dev_send[i] = t.send_ptr;
      dev_recv[i] = t.recv_ptr;
      if (t.is_send && t.send_ptr == nullptr && t.bytes > 0) {
        DISTCA_ASSIGN_OR_RETURN(std::byte * d, scratch(t.bytes, p2p_stream_));
        scratch_bufs.push_back(d);
        DISTCA_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(d, t.pinned_send, t.bytes, cudaMemcpyHostToDevice, p2p_stream_), "cudaMemcpyAsync", rank_));
        dev_send[i] = d;
      }
      if (!t.is_send && t.recv_ptr == nullptr && t.bytes > 0) {
        DISTCA_ASSIGN_OR_RETURN(std::byte * d, scratch(t.bytes, p2p_stream_));
        scratch_bufs.push_back(d);
        dev_recv[i] = d;
      }
    }
    DISTCA_RETURN_IF_ERROR(nccl_status(ncclGroupStart(), "ncclGroupStart", rank_, p2p_comm_));
    for (std::size_t i = 0; i < q.size(); ++i) {
      const Transfer& t = *q[i];
      if (t.bytes == 0) continue;  // nothing moves; the header check covers the pairing
      const ncclResult_t r = t.is_send ? ncclSend(dev_send[i], t.bytes, ncclUint8, t.peer, p2p_comm_, p2p_stream_)
                                       : ncclRecv(dev_recv[i], t.bytes, ncclUint8, t.peer, p2p_comm_, p2p_stream_);
      Status st = nccl_status(r, t.is_send ? "ncclSend" : "ncclRecv", rank_, p2p_comm_);
      if (!st.ok()) {
        (void)ncclGroupEnd();
        return st;
      }
    }
    DISTCA_RETURN_IF_ERROR(nccl_status(ncclGroupEnd(), "ncclGroupEnd", rank_, p2p_comm_));
    DISTCA_RETURN_IF_ERROR(settle(p2p_comm_, "ncclGroupEnd"));
    for (std::size_t i = 0; i < q.size(); ++i) {
      Transfer& t = *q[i];
      if (!t.is_send && t.recv_ptr == nullptr && t.bytes > 0) {
        DISTCA_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(t.pinned_recv, dev_recv[i], t.bytes, cudaMemcpyDeviceToHost, p2p_stream_), "cudaMemcpyAsync", rank_));
      }
    }
    for (std::byte* d : scratch_bufs) DISTCA_RETURN_IF_ERROR(free_on(d, p2p_stream_));
    for (const auto& t : q) {
      DISTCA_RETURN_IF_ERROR(cuda_status(cudaEventRecord(t->done, p2p_stream_), "cudaEventRecord", rank_));
      t->issued = true;
    }
    return Status::ok_status();
  }

  // The device work is done: deliver staged receives, return buffers, drop the events.
  Status complete(Transfer& t) {
    for (const auto& [off, bytes] : t.recv_blocks) std::memcpy(t.host_recv + off, t.pinned_recv + off, bytes);
    pool_.put(t.pinned_send);
    pool_.put(t.pinned_recv);
    t.pinned_send = t.pinned_recv = nullptr;
    for (cudaEvent_t* e : {&t.in, &t.done}) {
      if (*e) (void)cudaEventDestroy(*e);
      *e = nullptr;
    }
    return Status::ok_status();
  }

  // Communicator::all_reduce_sum's algorithm on device memory (see nccl.h).
  template <class T>
  Status reduce_device(std::span<T> data) {
    const auto n = static_cast<std::size_t>(size_), me = static_cast<std::size_t>(rank_);
    const std::size_t len = data.size();
    auto begin = [&](std::size_t p) { return len * p / n; };
    const std::size_t m = begin(me + 1) - begin(me);
    std::vector<std::size_t> sc(n), sd(n), rc(n), rd(n), zeros(n, 0);
    for (std::size_t p = 0; p < n; ++p) {
      sd[p] = begin(p) * sizeof(T);
      sc[p] = (begin(p + 1) - begin(p)) * sizeof(T);
      rc[p] = m * sizeof(T);
      rd[p] = p * m * sizeof(T);
    }
    DISTCA_ASSIGN_OR_RETURN(std::byte * gathered, scratch(n * m * sizeof(T) + m * sizeof(T), stream_));
    T* rows = reinterpret_cast<T*>(gathered);
    T* acc = rows + n * m;
    AllToAllV a{reinterpret_cast<const std::byte*>(data.data()), sc, sd, gathered, rc, rd, "all_reduce_sum_device"};
    Status st = all_to_all_v(a);
    if (st.ok()) {
      st = cuda_status(nccl::launch_rank_order_sum(rows, static_cast<int64_t>(n), static_cast<int64_t>(m), acc, stream_),
                       "rank_order_sum launch", rank_);
    }
    if (st.ok()) {  // same stream: the gather runs after the sum
      AllToAllV b{reinterpret_cast<const std::byte*>(acc), rc, zeros, reinterpret_cast<std::byte*>(data.data()), sc, sd,
                  "all_reduce_sum_device"};
      st = all_to_all_v(b);
    }
    if (comm_ != nullptr) {  // after an abort the scratch is leaked: the device may still use it
      Status f = free_on(gathered, stream_);
      if (st.ok()) st = f;
    }
    return st.with_context("all_reduce_sum_device");
  }

  Communicator& boot_;
  const NcclOptions opt_;
  const int rank_, size_;
  int device_ = -1;
  ncclComm_t comm_ = nullptr, p2p_comm_ = nullptr;
  cudaStream_t stream_ = nullptr, p2p_stream_ = nullptr;
  cudaStream_t input_ = nullptr;  // legacy default stream
  Status failed_;
  uint64_t seq_ = 0;
  std::map<int, uint64_t> send_seq_, recv_seq_;  // per peer: p2p messages issued so far
  std::vector<std::shared_ptr<Transfer>> queue_;  // p2p calls not yet issued
  PinnedPool pool_;
};

NcclExchange::~NcclExchange() {
  if (!completed_) owner_->dropped(*t_);
}

Status NcclExchange::wait() {
  if (completed_) return result_;
  result_ = owner_->wait_transfer(*t_);
  completed_ = true;
  return result_;
}

bool NcclExchange::test() {
  if (completed_) return true;
  Status st;
  if (!owner_->test_transfer(*t_, &st)) return false;
  result_ = st;
  completed_ = true;
  return true;
}

}  // namespace

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clears the sticky "no driver" error for later calls
    return 0;
  }
  return count;
}

Result<std::unique_ptr<NcclCommunicator>> make_nccl_communicator(Communicator& bootstrap, const NcclOptions& options) {
  if (!(options.timeout_s >= 0) || !std::isfinite(options.timeout_s)) {
    return Status::invalid_argument("nccl: timeout_s must be finite and >= 0 (got " + std::to_string(options.timeout_s) + ")");
  }
  if (options.poll_interval_us < 0) {
    return Status::invalid_argument("nccl: poll_interval_us must be >= 0 (got " + std::to_string(options.poll_interval_us) + ")");
  }
  if (options.device < -1) {
    return Status::invalid_argument("nccl: device must be >= 0, or -1 for rank % devices (got " + std::to_string(options.device) + ")");
  }
  auto c = std::make_unique<NcclCommImpl>(bootstrap, options);
  DISTCA_RETURN_IF_ERROR(c->init());
  return std::unique_ptr<NcclCommunicator>(std::move(c));
}

}  // namespace distca::comm
