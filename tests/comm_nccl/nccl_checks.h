// The NCCL backend's checks against its bootstrap communicator (local ranks in the GoogleTest
// program, the mpi backend under mpirun): the same exchanges and reductions on both, compared
// bitwise, and against the independent expectations of comm_test_util.h. Every check returns a
// Status naming what differs; the callers turn it into a test failure or Communicator::fail.
#pragma once

#include <cuda_runtime_api.h>

#include <cstring>
#include <string>
#include <vector>

#include "comm/comm_test_util.h"
#include "distca/comm_nccl/nccl.h"

namespace distca::comm::testing {

#define NCCL_CHECK_OR_RETURN(cond, what)                                                         \
  do {                                                                                           \
    if (!(cond)) return Status::internal(std::string("check failed (rank ") +                    \
                                         std::to_string(nc.rank()) + "): " + (what));             \
  } while (0)
#define NCCL_CUDA_OR_RETURN(call)                                                                \
  do {                                                                                           \
    const cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess) return Status::internal(std::string(#call) + ": " + cudaGetErrorString(e_)); \
  } while (0)

// A device copy of a host vector (freed by the owner).
template <class T>
struct DeviceVec {
  T* p = nullptr;
  std::size_t n = 0;
  ~DeviceVec() {
    if (p) (void)cudaFree(p);
  }
  Status upload(const std::vector<T>& h) {
    n = h.size();
    NCCL_CUDA_OR_RETURN(cudaMalloc(reinterpret_cast<void**>(&p), std::max<std::size_t>(n, 1) * sizeof(T)));
    NCCL_CUDA_OR_RETURN(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    return Status::ok_status();
  }
  Result<std::vector<T>> download() const {
    std::vector<T> h(n);
    NCCL_CUDA_OR_RETURN(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

// Random all-to-all-v layouts with gaps: device buffers, host (staged) buffers, the bootstrap's
// result and the expected bytes all agree; two exchanges in flight complete in reverse order;
// a consumer stream ordered by stream_wait sees the received bytes.
inline Status check_all_to_all_v(Communicator& boot, NcclCommunicator& nc, uint64_t seed) {
  const auto counts = random_counts(seed, nc.size());
  Layout ref = make_layout(counts, nc.rank());
  DISTCA_RETURN_IF_ERROR(boot.all_to_all_v(ref.args()));
  NCCL_CHECK_OR_RETURN(same_bits(ref.recv, ref.expected_recv), "bootstrap exchange");
  // Host spans through the NCCL backend (staged).
  Layout host = make_layout(counts, nc.rank());
  DISTCA_RETURN_IF_ERROR(nc.all_to_all_v(host.args()));
  NCCL_CHECK_OR_RETURN(same_bits(host.recv, ref.recv), "host-staged exchange differs from the bootstrap's");
  // Device buffers, two exchanges in flight, waited in reverse order.
  Layout a = make_layout(counts, nc.rank()), b = make_layout(counts, nc.rank());
  DeviceVec<std::byte> as, ar, bs, br;
  DISTCA_RETURN_IF_ERROR(as.upload(a.send));
  DISTCA_RETURN_IF_ERROR(ar.upload(a.recv));
  DISTCA_RETURN_IF_ERROR(bs.upload(b.send));
  DISTCA_RETURN_IF_ERROR(br.upload(b.recv));
  AllToAllV da = a.args(), db = b.args();
  da.send = as.p, da.recv = ar.p, db.send = bs.p, db.recv = br.p;
  DISTCA_ASSIGN_OR_RETURN(auto xa, nc.start_all_to_all_v(da));
  DISTCA_ASSIGN_OR_RETURN(auto xb, nc.start_all_to_all_v(db));
  // The consumer stream waits for xb on the device; its copy then sees xb's bytes.
  cudaStream_t consumer = nullptr;
  NCCL_CUDA_OR_RETURN(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking));
  std::vector<std::byte> seen(b.recv.size());
  DISTCA_RETURN_IF_ERROR(nc.stream_wait(*xb, consumer));
  NCCL_CUDA_OR_RETURN(cudaMemcpyAsync(seen.data(), br.p, seen.size(), cudaMemcpyDeviceToHost, consumer));
  NCCL_CUDA_OR_RETURN(cudaStreamSynchronize(consumer));
  NCCL_CUDA_OR_RETURN(cudaStreamDestroy(consumer));
  NCCL_CHECK_OR_RETURN(same_bits(seen, ref.recv), "stream_wait: the consumer stream saw the receive buffer early");
  DISTCA_RETURN_IF_ERROR(xb->wait());
  NCCL_CHECK_OR_RETURN(xb->test(), "test() after wait()");
  DISTCA_RETURN_IF_ERROR(xa->wait());
  DISTCA_ASSIGN_OR_RETURN(auto ga, ar.download());
  DISTCA_ASSIGN_OR_RETURN(auto gb, br.download());
  NCCL_CHECK_OR_RETURN(same_bits(ga, ref.recv), "device exchange A differs from the bootstrap's");
  NCCL_CHECK_OR_RETURN(same_bits(gb, ref.recv), "device exchange B differs from the bootstrap's");
  return Status::ok_status();
}

// all_reduce_sum on host spans and all_reduce_sum_device: the bootstrap's bits.
template <class T>
Status check_all_reduce(Communicator& boot, NcclCommunicator& nc, std::size_t len) {
  std::vector<T> ref = rank_input<T>(31, nc.rank(), len);
  std::vector<T> host = ref, dev_in = ref;
  DISTCA_RETURN_IF_ERROR(boot.all_reduce_sum(std::span<T>(ref)));
  DISTCA_RETURN_IF_ERROR(nc.all_reduce_sum(std::span<T>(host)));
  NCCL_CHECK_OR_RETURN(same_bits(host, ref), "all_reduce_sum (host) differs from the bootstrap's, len " + std::to_string(len));
  DeviceVec<T> d;
  DISTCA_RETURN_IF_ERROR(d.upload(dev_in));
  DISTCA_RETURN_IF_ERROR(nc.all_reduce_sum_device(std::span<T>(d.p, len)));
  DISTCA_ASSIGN_OR_RETURN(auto got, d.download());
  NCCL_CHECK_OR_RETURN(same_bits(got, ref), "all_reduce_sum_device differs from the bootstrap's, len " + std::to_string(len));
  return Status::ok_status();
}

// A ring of device p2p messages (two tags, both directions), all started, then waited.
inline Status check_p2p(NcclCommunicator& nc) {
  const int n = nc.size(), me = nc.rank(), next = (me + 1) % n, prev = (me + n - 1) % n;
  constexpr std::size_t kBytes = 4099;
  std::vector<std::unique_ptr<DeviceVec<std::byte>>> bufs;
  std::vector<std::unique_ptr<Exchange>> ex;
  std::vector<std::pair<int, int>> recv_from;  // (peer, tag) per receive buffer, in bufs order
  // Same issue order on both sides of each pair: receives from prev then next, sends to next then prev.
  for (auto [peer, tag] : {std::pair{prev, 1}, std::pair{next, 2}}) {
    bufs.push_back(std::make_unique<DeviceVec<std::byte>>());
    DISTCA_RETURN_IF_ERROR(bufs.back()->upload(std::vector<std::byte>(kBytes, kUntouched)));
    DISTCA_ASSIGN_OR_RETURN(auto r, nc.start_recv(std::span<std::byte>(bufs.back()->p, kBytes), peer, tag));
    ex.push_back(std::move(r));
    recv_from.emplace_back(peer, tag);
  }
  std::vector<std::unique_ptr<DeviceVec<std::byte>>> sends;
  for (auto [peer, tag] : {std::pair{next, 1}, std::pair{prev, 2}}) {
    sends.push_back(std::make_unique<DeviceVec<std::byte>>());
    DISTCA_RETURN_IF_ERROR(sends.back()->upload(p2p_message(me, peer, tag, 0, kBytes)));
    DISTCA_ASSIGN_OR_RETURN(auto s, nc.start_send(std::span<const std::byte>(sends.back()->p, kBytes), peer, tag));
    ex.push_back(std::move(s));
  }
  for (auto& e : ex) DISTCA_RETURN_IF_ERROR(e->wait());
  for (std::size_t i = 0; i < recv_from.size(); ++i) {
    DISTCA_ASSIGN_OR_RETURN(auto got, bufs[i]->download());
    const auto [peer, tag] = recv_from[i];
    NCCL_CHECK_OR_RETURN(same_bits(got, p2p_message(peer, me, tag, 0, kBytes)),
                         "p2p from rank " + std::to_string(peer) + " tag " + std::to_string(tag));
  }
  return Status::ok_status();
}

inline Status check_collectives(NcclCommunicator& nc) {
  DISTCA_RETURN_IF_ERROR(nc.barrier());
  DISTCA_ASSIGN_OR_RETURN(auto ranks, nc.all_gather_value(nc.rank() * 3 + 1));
  for (int p = 0; p < nc.size(); ++p) NCCL_CHECK_OR_RETURN(ranks[static_cast<std::size_t>(p)] == p * 3 + 1, "all_gather");
  std::vector<double> v(5, nc.rank() == 0 ? 2.5 : -1.0);
  DISTCA_RETURN_IF_ERROR(nc.broadcast(std::as_writable_bytes(std::span<double>(v)), 0));
  for (double x : v) NCCL_CHECK_OR_RETURN(x == 2.5, "broadcast");
  return Status::ok_status();
}

// Everything above, in one order every rank follows.
inline Status check_nccl(Communicator& boot, NcclCommunicator& nc) {
  DISTCA_RETURN_IF_ERROR(check_collectives(nc).with_context("collectives"));
  for (uint64_t seed : {1u, 2u, 3u}) DISTCA_RETURN_IF_ERROR(check_all_to_all_v(boot, nc, seed).with_context("all_to_all_v"));
  for (std::size_t len : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{100003}}) {
    DISTCA_RETURN_IF_ERROR(check_all_reduce<float>(boot, nc, len).with_context("all_reduce float"));
    DISTCA_RETURN_IF_ERROR(check_all_reduce<double>(boot, nc, len).with_context("all_reduce double"));
  }
  return check_p2p(nc).with_context("p2p");
}

}  // namespace distca::comm::testing
