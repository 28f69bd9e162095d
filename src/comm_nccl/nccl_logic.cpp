// Host-side logic of the NCCL backend (include/distca/comm_nccl/nccl_logic.h).
#include "distca/comm_nccl/nccl_logic.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace distca::comm::nccl {

Result<std::vector<P2pOp>> plan_all_to_all_v(const AllToAllV& a, int rank, int n) {
  DISTCA_RETURN_IF_ERROR(validate_all_to_all_v(a, n));
  if (rank < 0 || rank >= n) {
    return Status::invalid_argument("all_to_all_v: rank " + std::to_string(rank) + " is not in a group of " +
                                    std::to_string(n));
  }
  const auto me = static_cast<std::size_t>(rank);
  if (a.send_counts[me] != a.recv_counts[me]) {
    return Status::invalid_argument("all_to_all_v: rank " + std::to_string(rank) + " sends itself " +
                                    std::to_string(a.send_counts[me]) + " bytes but expects " +
                                    std::to_string(a.recv_counts[me]));
  }
  std::vector<P2pOp> ops;
  if (a.send_counts[me] > 0) {
    ops.push_back({P2pOp::Kind::kSelfCopy, rank, a.send_displs[me], a.recv_displs[me], a.send_counts[me]});
  }
  for (int p = 0; p < n; ++p) {
    const auto up = static_cast<std::size_t>(p);
    if (p != rank && a.recv_counts[up] > 0) ops.push_back({P2pOp::Kind::kRecv, p, 0, a.recv_displs[up], a.recv_counts[up]});
  }
  for (int p = 0; p < n; ++p) {
    const auto up = static_cast<std::size_t>(p);
    if (p != rank && a.send_counts[up] > 0) ops.push_back({P2pOp::Kind::kSend, p, a.send_displs[up], 0, a.send_counts[up]});
  }
  const std::size_t calls = ops.size() - (a.send_counts[me] > 0 ? 1 : 0);
  if (calls > kMaxGroupCalls) {
    return Status::invalid_argument("all_to_all_v: rank " + std::to_string(rank) + " needs " + std::to_string(calls) +
                                    " NCCL sends and receives in one group, over NCCL's limit of " +
                                    std::to_string(kMaxGroupCalls));
  }
  return ops;
}

std::size_t extent(std::span<const std::size_t> counts, std::span<const std::size_t> displs) {
  std::size_t end = 0;
  for (std::size_t p = 0; p < counts.size() && p < displs.size(); ++p) {
    if (counts[p] > 0) end = std::max(end, displs[p] + counts[p]);
  }
  return end;
}

Status check_counts(int rank, std::span<const std::size_t> recv_counts, std::span<const uint64_t> peers_send_counts) {
  for (std::size_t p = 0; p < recv_counts.size() && p < peers_send_counts.size(); ++p) {
    if (static_cast<int>(p) == rank) continue;  // the self block is checked by plan_all_to_all_v
    if (peers_send_counts[p] != recv_counts[p]) {
      return Status::invalid_argument("all_to_all_v: rank " + std::to_string(p) + " sends " +
                                      std::to_string(peers_send_counts[p]) + " bytes to rank " +
                                      std::to_string(rank) + ", which expects " + std::to_string(recv_counts[p]));
    }
  }
  return Status::ok_status();
}

Result<std::unique_ptr<CountCheck>> CountCheck::start(Communicator& bootstrap, const AllToAllV& a) {
  const int n = bootstrap.size();
  DISTCA_RETURN_IF_ERROR(validate_all_to_all_v(a, n));
  std::unique_ptr<CountCheck> c(new CountCheck());
  const auto un = static_cast<std::size_t>(n);
  c->rank_ = bootstrap.rank();
  c->mine_.assign(a.send_counts.begin(), a.send_counts.end());
  c->theirs_.assign(un, 0);
  c->recv_counts_.assign(a.recv_counts.begin(), a.recv_counts.end());
  // One uint64 to and from every peer (self included: harmless and keeps the layout dense).
  std::vector<std::size_t> counts(un, sizeof(uint64_t)), displs(un);
  for (std::size_t p = 0; p < un; ++p) displs[p] = p * sizeof(uint64_t);
  AllToAllV x;
  x.send = reinterpret_cast<const std::byte*>(c->mine_.data());
  x.send_counts = counts;
  x.send_displs = displs;
  x.recv = reinterpret_cast<std::byte*>(c->theirs_.data());
  x.recv_counts = counts;
  x.recv_displs = displs;
  x.label = "nccl count check";
  auto h = bootstrap.start_all_to_all_v(x);
  if (!h.ok()) return h.status().with_context("nccl count check");
  c->handle_ = std::move(h).value();
  return c;
}

Status CountCheck::finish() {
  if (finished_) return result_;
  finished_ = true;
  result_ = handle_->wait().with_context("nccl count check");
  handle_.reset();
  if (result_.ok()) result_ = check_counts(rank_, recv_counts_, theirs_);
  return result_;
}

Status check_p2p_headers(int rank, bool is_send, int peer, const P2pHeader& mine, const P2pHeader& theirs) {
  const P2pHeader& snd = is_send ? mine : theirs;
  const P2pHeader& rcv = is_send ? theirs : mine;
  const int src = is_send ? rank : peer, dst = is_send ? peer : rank;
  if (snd.seq != rcv.seq) {
    return Status::invalid_argument("p2p (nccl): rank " + std::to_string(src) + "'s message #" +
                                    std::to_string(snd.seq) + " to rank " + std::to_string(dst) + " (tag " +
                                    std::to_string(snd.tag) + ") meets rank " + std::to_string(dst) +
                                    "'s receive #" + std::to_string(rcv.seq) +
                                    ": the nccl backend pairs point-to-point messages per peer in issue order, "
                                    "so both sides must issue them in the same order");
  }
  if (snd.bytes != rcv.bytes) {
    return Status::invalid_argument("p2p: rank " + std::to_string(src) + " sends " + std::to_string(snd.bytes) +
                                    " bytes to rank " + std::to_string(dst) + " (tag " + std::to_string(snd.tag) +
                                    "), which expects " + std::to_string(rcv.bytes));
  }
  return Status::ok_status();
}

Result<std::unique_ptr<P2pHeaderCheck>> P2pHeaderCheck::start(Communicator& bootstrap, bool is_send, int peer,
                                                               int tag, const P2pHeader& mine) {
  if (tag < 0 || tag >= kNcclP2pTagLimit) {
    return Status::invalid_argument(std::string(is_send ? "start_send" : "start_recv") + " (rank " +
                                    std::to_string(bootstrap.rank()) + "): tag " + std::to_string(tag) +
                                    " is outside [0, " + std::to_string(kNcclP2pTagLimit) +
                                    ") (the nccl backend's p2p tag range)");
  }
  std::unique_ptr<P2pHeaderCheck> c(new P2pHeaderCheck());
  c->rank_ = bootstrap.rank();
  c->is_send_ = is_send;
  c->peer_ = peer;
  c->mine_ = mine;
  const int out_tag = is_send ? 2 * tag : 2 * tag + 1, in_tag = is_send ? 2 * tag + 1 : 2 * tag;
  auto r = bootstrap.start_recv_values(std::span<P2pHeader>(&c->theirs_, 1), peer, in_tag, "nccl p2p header");
  if (!r.ok()) return r.status().with_context("nccl p2p header");
  c->recv_ = std::move(r).value();
  auto s = bootstrap.start_send_values(std::span<const P2pHeader>(&c->mine_, 1), peer, out_tag, "nccl p2p header");
  if (!s.ok()) {
    // The posted receive stays in flight; the caller fails the group (the contract's rule).
    (void)c->recv_.release();  // abandoned by the failure contract: the group must be failed
    return s.status().with_context("nccl p2p header");
  }
  c->send_ = std::move(s).value();
  return c;
}

Status P2pHeaderCheck::finish() {
  if (finished_) return result_;
  finished_ = true;
  Status a = recv_->wait(), b = send_->wait();
  recv_.reset();
  send_.reset();
  result_ = !a.ok() ? a.with_context("nccl p2p header") : !b.ok() ? b.with_context("nccl p2p header") : Status{};
  if (result_.ok()) result_ = check_p2p_headers(rank_, is_send_, peer_, mine_, theirs_);
  return result_;
}

Result<UniqueIdBytes> share_unique_id(Communicator& bootstrap, const std::function<Result<UniqueIdBytes>()>& make_id) {
  // Wire: 1 flag byte (1: id follows), the id, and on failure the cause (truncated).
  constexpr std::size_t kCause = 256;
  std::array<std::byte, 1 + sizeof(UniqueIdBytes) + kCause> msg{};
  if (bootstrap.rank() == 0) {
    Result<UniqueIdBytes> id = make_id();
    if (id.ok()) {
      msg[0] = std::byte{1};
      std::memcpy(msg.data() + 1, id.value().data(), sizeof(UniqueIdBytes));
    } else {
      const std::string& m = id.status().message();
      std::memcpy(msg.data() + 1 + sizeof(UniqueIdBytes), m.data(), std::min(m.size(), kCause - 1));
    }
  }
  DISTCA_RETURN_IF_ERROR(bootstrap.broadcast(msg, 0).with_context("nccl unique id"));
  if (msg[0] != std::byte{1}) {
    const char* cause = reinterpret_cast<const char*>(msg.data() + 1 + sizeof(UniqueIdBytes));
    return Status::internal("nccl: rank 0 could not create the unique id: " + std::string(cause, strnlen(cause, kCause)));
  }
  UniqueIdBytes out;
  std::memcpy(out.data(), msg.data() + 1, sizeof(UniqueIdBytes));
  return out;
}

Status agree_ready(Communicator& bootstrap, const Status& mine) {
  constexpr std::size_t kCause = 240;
  struct Ready {
    char ok = 0;
    char cause[kCause] = {};
  };
  Ready r;
  r.ok = mine.ok() ? 1 : 0;
  if (!mine.ok()) std::snprintf(r.cause, kCause, "%s", mine.message().c_str());
  DISTCA_ASSIGN_OR_RETURN(auto all, bootstrap.all_gather_value(r));
  for (std::size_t p = 0; p < all.size(); ++p) {
    if (all[p].ok == 0) {
      return Status::internal("nccl: rank " + std::to_string(p) + ": " + std::string(all[p].cause, strnlen(all[p].cause, kCause)));
    }
  }
  return Status::ok_status();
}

Status bounded_wait(const std::function<Result<bool>()>& poll, double timeout_s, const std::function<double()>& now_s,
                    const std::function<void()>& pause, const std::string& what) {
  const double start = now_s();
  for (;;) {
    const bool expired = timeout_s > 0 && now_s() - start >= timeout_s;
    Result<bool> r = poll();  // one last look after expiry: completion wins over a late timeout
    if (!r.ok()) return r.status();
    if (r.value()) return Status::ok_status();
    if (expired) {
      char secs[32];
      std::snprintf(secs, sizeof(secs), "%g", timeout_s);
      return Status::internal("no progress for " + std::string(secs) + " s (nccl timeout): " + what);
    }
    pause();
  }
}

}  // namespace distca::comm::nccl
