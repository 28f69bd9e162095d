// Backend `local` (local.h): one Group shared by n rank threads; see the header for the
// pull-based exchange protocol and the failure semantics.
#include "distca/comm/local.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace distca::comm {
namespace {

// What a sender posts for one exchange: its buffer and layout (counts copied, so the
// caller's arrays may die right after start).
struct Post {
  const std::byte* send = nullptr;
  std::vector<std::size_t> send_counts;  // (n) bytes to peer p
  std::vector<std::size_t> send_displs;  // (n) offset of peer p's block
};

// Rendezvous of the k-th exchange of every rank.
struct Slot {
  explicit Slot(int n)
      : posted(static_cast<std::size_t>(n)),
        consumed(static_cast<std::size_t>(n), 0),
        readers(static_cast<std::size_t>(n), 0) {}
  std::vector<std::optional<Post>> posted;  // (n) by sender
  std::vector<int> consumed;                // (n) by sender: receivers done copying its block
  std::vector<int> readers;                 // (n) by sender: copies from it in progress
  int finished = 0;                         // ranks whose wait() returned OK
};

// One point-to-point message: the k-th send and the k-th receive of one channel (source,
// destination, tag). Whichever side posts second copies (outside the lock, `copying` set),
// so a message is complete as soon as both sides have started: no side's wait depends on
// the other side calling wait, which keeps every program that is deadlock-free under MPI
// deadlock-free here. Guarded by the group's mutex.
struct P2pMessage {
  const std::byte* send = nullptr;
  std::size_t send_size = 0;
  bool send_posted = false;
  std::byte* recv = nullptr;
  std::size_t recv_size = 0;
  bool recv_posted = false;
  bool copying = false;
  bool done = false;            // matched and copied, or matched with a size mismatch (error)
  std::optional<Status> error;  // the mismatch, reported on both sides
};

std::string p2p_mismatch(int src, int dst, int tag, std::size_t sent, std::size_t expected) {
  return "p2p: rank " + std::to_string(src) + " sends " + std::to_string(sent) +
         " bytes to rank " + std::to_string(dst) + " (tag " + std::to_string(tag) +
         "), which expects " + std::to_string(expected);
}

class Group {
 public:
  explicit Group(int n) : n_(n), exited_(static_cast<std::size_t>(n), false) {}

  int n() const { return n_; }

  // Records the first failure and wakes every waiter. Later failures are dropped: the first
  // one is the cause, the rest are its consequences.
  void fail(int rank, const std::string& cause) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_locked(rank, cause);
  }

  // A rank dropped an unfinished exchange (its function returned or threw before wait()):
  // peers must not keep reading its buffer, so the group fails now. The cause is provisional:
  // if the same rank reports its real error right after (run_local does), that one is kept.
  void abandon(int rank, Slot& slot) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!failed_) {
      fail_locked(rank, "dropped an unfinished exchange");
      provisional_ = true;
    }
    cv_.wait(lock, [&] { return slot.readers[static_cast<std::size_t>(rank)] == 0; });
  }

  // Same for a point-to-point message: a peer may be copying into or out of its buffer.
  void abandon(int rank, P2pMessage& msg) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!failed_) {
      fail_locked(rank, "dropped an unfinished exchange");
      provisional_ = true;
    }
    cv_.wait(lock, [&] { return !msg.copying; });
  }

  // Posts rank me's side of its next message on channel (src, dst, tag) - me is src for a
  // send, dst for a receive - and matches it with the other side's oldest unmatched post.
  // The channel's queue holds unmatched posts of one side only (a post of the other side
  // would have matched the oldest), so FIFO matching is "pop the front".
  Result<std::shared_ptr<P2pMessage>> post_p2p(int me, bool is_send, const std::byte* send,
                                               std::byte* recv, std::size_t bytes, int peer,
                                               int tag) {
    std::unique_lock<std::mutex> lock(mu_);
    if (failed_) return failure_status_locked();
    const int src = is_send ? me : peer;
    const int dst = is_send ? peer : me;
    const std::tuple<int, int, int> key{src, dst, tag};
    auto& queue = channels_[key];
    std::shared_ptr<P2pMessage> msg;
    const bool matches = !queue.empty() && (is_send ? !queue.front()->send_posted
                                                    : !queue.front()->recv_posted);
    if (matches) {
      msg = queue.front();
      queue.pop_front();
    } else {
      msg = std::make_shared<P2pMessage>();
      queue.push_back(msg);
    }
    if (queue.empty()) channels_.erase(key);
    if (is_send) {
      msg->send = send;
      msg->send_size = bytes;
      msg->send_posted = true;
    } else {
      msg->recv = recv;
      msg->recv_size = bytes;
      msg->recv_posted = true;
    }
    if (!matches) return msg;
    if (msg->send_size != msg->recv_size) {
      msg->error = Status::invalid_argument(
          p2p_mismatch(src, dst, tag, msg->send_size, msg->recv_size));
    } else if (msg->send_size > 0) {
      msg->copying = true;
      lock.unlock();
      std::memcpy(msg->recv, msg->send, msg->send_size);
      lock.lock();
      msg->copying = false;
    }
    msg->done = true;
    cv_.notify_all();
    return msg;
  }

  // Completion of rank me's side of `msg` (peer: the other side). Returns nullopt when
  // `blocking` is false and the message is not complete yet. A failed group wins over a
  // completed message: every pending or later wait reports the failure.
  std::optional<Status> wait_p2p(int me, bool is_send, int peer, int tag, P2pMessage& msg,
                                 bool blocking) {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (failed_) {
        // The peer may be copying into or out of our buffer, which the caller may free as
        // soon as we return.
        cv_.wait(lock, [&] { return !msg.copying; });
        return failure_status_locked();
      }
      if (msg.done) return msg.error ? *msg.error : Status::ok_status();
      if (exited_[static_cast<std::size_t>(peer)]) {
        fail_locked(peer, "returned while rank " + std::to_string(me) + " waited for it in " +
                              (is_send ? "a p2p send" : "a p2p receive") + " (tag " +
                              std::to_string(tag) + ")");
        continue;
      }
      if (!blocking) return std::nullopt;
      cv_.wait(lock);
    }
  }

  // Rank `rank` returned OK from its function: peers still waiting for it can never finish.
  void mark_exited(int rank) {
    std::lock_guard<std::mutex> lock(mu_);
    exited_[static_cast<std::size_t>(rank)] = true;
    cv_.notify_all();
  }

  std::optional<Status> failure() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_) return std::nullopt;
    return failure_status_locked();
  }

  Status barrier(int rank) {
    std::unique_lock<std::mutex> lock(mu_);
    if (failed_) return failure_status_locked();
    const uint64_t gen = barrier_gen_;
    if (++barrier_arrived_ == n_) {
      barrier_arrived_ = 0;
      ++barrier_gen_;
      cv_.notify_all();
      return Status::ok_status();
    }
    for (;;) {
      if (barrier_gen_ != gen) return Status::ok_status();
      if (failed_) return failure_status_locked();
      // A rank that returned can never arrive (it cannot have left mid-barrier).
      for (int p = 0; p < n_; ++p) {
        if (exited_[static_cast<std::size_t>(p)]) {
          fail_locked(p, "returned while rank " + std::to_string(rank) +
                             " waited for it in barrier");
          return failure_status_locked();
        }
      }
      cv_.wait(lock);
    }
  }

  // Posts this rank's side of its exchange number `seq`; returns the slot.
  std::shared_ptr<Slot> post(int rank, uint64_t seq, Post p) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& slot = slots_[seq];
    if (!slot) slot = std::make_shared<Slot>(n_);
    slot->posted[static_cast<std::size_t>(rank)] = std::move(p);
    cv_.notify_all();
    return slot;
  }

  // Drives this rank's part of exchange `seq`: copies every posted block addressed to it that
  // it has not copied yet, then checks whether every peer has consumed its own block.
  // Returns nullopt when `blocking` is false and the exchange is not complete yet.
  std::optional<Status> progress(int me, uint64_t seq, Slot& slot, std::byte* recv,
                                 const std::vector<std::size_t>& recv_counts,
                                 const std::vector<std::size_t>& recv_displs,
                                 std::vector<bool>& copied, bool blocking) {
    const auto ume = static_cast<std::size_t>(me);
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (failed_) {
        // Peers may still be copying out of our send buffer: the caller may free it as soon
        // as we return, so wait for those copies (they are short and start no more).
        cv_.wait(lock, [&] { return slot.readers[ume] == 0; });
        return failure_status_locked();
      }
      bool progressed = false;
      for (int p = 0; p < n_ && !failed_; ++p) {
        const auto up = static_cast<std::size_t>(p);
        if (copied[up]) continue;
        if (!slot.posted[up]) {
          if (exited_[up]) {
            fail_locked(p, "returned while rank " + std::to_string(me) +
                               " waited for it in all_to_all_v");
          }
          continue;
        }
        const Post& post = *slot.posted[up];
        const std::size_t count = post.send_counts[ume];
        if (count != recv_counts[up]) {
          fail_locked(me, "all_to_all_v: rank " + std::to_string(p) + " sends " +
                              std::to_string(count) + " bytes to rank " + std::to_string(me) +
                              ", which expects " + std::to_string(recv_counts[up]));
          break;
        }
        if (count > 0) {
          const std::byte* src = post.send + post.send_displs[ume];
          ++slot.readers[up];
          lock.unlock();
          std::memcpy(recv + recv_displs[up], src, count);
          lock.lock();
          --slot.readers[up];
        }
        ++slot.consumed[up];
        copied[up] = true;
        progressed = true;
      }
      if (progressed) cv_.notify_all();
      if (failed_) continue;
      bool all_copied = true;
      for (bool c : copied) all_copied = all_copied && c;
      if (all_copied && slot.consumed[ume] == n_) {
        if (++slot.finished == n_) slots_.erase(seq);
        return Status::ok_status();
      }
      if (!blocking) return std::nullopt;
      // A copy released the lock, so a peer may have posted behind the scan (and notified
      // while nobody waited): scan again before sleeping, or that wakeup is lost.
      if (progressed) continue;
      cv_.wait(lock);
    }
  }

 private:
  void fail_locked(int rank, const std::string& cause) {
    if (!failed_ || (provisional_ && rank == failed_rank_)) {
      failed_ = true;
      provisional_ = false;
      failed_rank_ = rank;
      cause_ = cause;
    }
    cv_.notify_all();
  }
  Status failure_status_locked() const {
    return Status::internal("rank " + std::to_string(failed_rank_) + " failed: " + cause_);
  }

  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool failed_ = false;
  bool provisional_ = false;  // cause_ came from abandon() and may be replaced (see there)
  int failed_rank_ = -1;
  std::string cause_;
  std::vector<bool> exited_;  // (n)
  int barrier_arrived_ = 0;
  uint64_t barrier_gen_ = 0;
  std::map<uint64_t, std::shared_ptr<Slot>> slots_;  // exchanges in flight, by sequence
  // Unmatched point-to-point posts by (source, destination, tag), oldest first.
  std::map<std::tuple<int, int, int>, std::deque<std::shared_ptr<P2pMessage>>> channels_;
};

class LocalExchange : public Exchange {
 public:
  LocalExchange(Group& group, int rank, uint64_t seq, std::shared_ptr<Slot> slot,
                std::byte* recv, std::vector<std::size_t> recv_counts,
                std::vector<std::size_t> recv_displs)
      : group_(group),
        rank_(rank),
        seq_(seq),
        slot_(std::move(slot)),
        recv_(recv),
        recv_counts_(std::move(recv_counts)),
        recv_displs_(std::move(recv_displs)),
        copied_(recv_counts_.size(), false) {}

  // Waiting here could hang (the peers may be blocked elsewhere, waiting for this rank), so
  // an unfinished exchange fails the group instead; see Group::abandon.
  ~LocalExchange() override {
    if (!result_) group_.abandon(rank_, *slot_);
  }

  Status wait() override {
    if (!result_) {
      result_ = group_.progress(rank_, seq_, *slot_, recv_, recv_counts_, recv_displs_,
                                copied_, /*blocking=*/true);
    }
    return *result_;
  }

  bool test() override {
    if (!result_) {
      result_ = group_.progress(rank_, seq_, *slot_, recv_, recv_counts_, recv_displs_,
                                copied_, /*blocking=*/false);
    }
    return result_.has_value();
  }

 private:
  Group& group_;
  const int rank_;
  const uint64_t seq_;
  std::shared_ptr<Slot> slot_;
  std::byte* recv_;
  std::vector<std::size_t> recv_counts_;  // (n)
  std::vector<std::size_t> recv_displs_;  // (n)
  std::vector<bool> copied_;              // (n) blocks from peer p already copied
  std::optional<Status> result_;
};

// One side of one point-to-point message.
class LocalP2p : public Exchange {
 public:
  LocalP2p(Group& group, int rank, bool is_send, int peer, int tag,
           std::shared_ptr<P2pMessage> msg)
      : group_(group), rank_(rank), is_send_(is_send), peer_(peer), tag_(tag),
        msg_(std::move(msg)) {}

  ~LocalP2p() override {
    if (!result_) group_.abandon(rank_, *msg_);
  }

  Status wait() override {
    if (!result_) result_ = group_.wait_p2p(rank_, is_send_, peer_, tag_, *msg_, true);
    return *result_;
  }

  bool test() override {
    if (!result_) result_ = group_.wait_p2p(rank_, is_send_, peer_, tag_, *msg_, false);
    return result_.has_value();
  }

 private:
  Group& group_;
  const int rank_;
  const bool is_send_;
  const int peer_;
  const int tag_;
  std::shared_ptr<P2pMessage> msg_;
  std::optional<Status> result_;
};

class LocalCommunicator : public Communicator {
 public:
  LocalCommunicator(Group& group, int rank) : group_(group), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_.n(); }
  std::string backend() const override { return "local"; }

  Status barrier() override { return group_.barrier(rank_); }

  Status all_to_all_v(const AllToAllV& a) override {
    DISTCA_ASSIGN_OR_RETURN(auto ex, start_all_to_all_v(a));
    return ex->wait();
  }

  Result<std::unique_ptr<Exchange>> start_all_to_all_v(const AllToAllV& a) override {
    if (auto f = group_.failure()) return *f;
    Status valid = validate_all_to_all_v(a, group_.n());
    if (!valid.ok()) {
      // Peers would wait forever for this rank's post: the group cannot continue.
      group_.fail(rank_, valid.message());
      return valid;
    }
    Post post;
    post.send = a.send;
    post.send_counts.assign(a.send_counts.begin(), a.send_counts.end());
    post.send_displs.assign(a.send_displs.begin(), a.send_displs.end());
    const uint64_t seq = next_seq_++;
    auto slot = group_.post(rank_, seq, std::move(post));
    return std::unique_ptr<Exchange>(std::make_unique<LocalExchange>(
        group_, rank_, seq, std::move(slot), a.recv,
        std::vector<std::size_t>(a.recv_counts.begin(), a.recv_counts.end()),
        std::vector<std::size_t>(a.recv_displs.begin(), a.recv_displs.end())));
  }

  Result<std::unique_ptr<Exchange>> start_send(std::span<const std::byte> data, int peer,
                                               int tag, const char* /*label*/) override {
    return start_p2p("start_send", true, data.data(), nullptr, data.size(), peer, tag);
  }

  Result<std::unique_ptr<Exchange>> start_recv(std::span<std::byte> data, int peer, int tag,
                                               const char* /*label*/) override {
    return start_p2p("start_recv", false, nullptr, data.data(), data.size(), peer, tag);
  }

  void fail(const Status& cause) override { group_.fail(rank_, cause.message()); }

 private:
  Result<std::unique_ptr<Exchange>> start_p2p(const char* call, bool is_send,
                                              const std::byte* send, std::byte* recv,
                                              std::size_t bytes, int peer, int tag) {
    if (auto f = group_.failure()) return *f;
    Status valid = validate_p2p(call, is_send ? static_cast<const void*>(send) : recv, bytes,
                                peer, tag, rank_, group_.n());
    if (!valid.ok()) {
      // The peer may wait forever for this message: the group cannot continue.
      group_.fail(rank_, valid.message());
      return valid;
    }
    DISTCA_ASSIGN_OR_RETURN(auto msg,
                            group_.post_p2p(rank_, is_send, send, recv, bytes, peer, tag));
    return std::unique_ptr<Exchange>(
        std::make_unique<LocalP2p>(group_, rank_, is_send, peer, tag, std::move(msg)));
  }

  Group& group_;
  const int rank_;
  uint64_t next_seq_ = 0;
};

}  // namespace

Status run_local(int n, const std::function<Status(Communicator&)>& fn) {
  if (n < 1) {
    return Status::invalid_argument("run_local: --ranks must be at least 1 (got " +
                                    std::to_string(n) + ")");
  }
  Group group(n);
  auto body = [&group, &fn](int rank) {
    Status st;
    {
      LocalCommunicator comm(group, rank);
      try {
        st = fn(comm);
      } catch (const std::exception& e) {
        st = Status::internal(std::string("exception: ") + e.what());
      } catch (...) {
        st = Status::internal("unknown exception");
      }
    }
    if (st.ok()) {
      group.mark_exited(rank);
    } else {
      group.fail(rank, st.message());
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
  for (auto& t : threads) t.join();
  if (auto f = group.failure()) return *f;
  return Status::ok_status();
}

}  // namespace distca::comm
