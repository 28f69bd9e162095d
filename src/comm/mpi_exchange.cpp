// The mpi backend's exchanges and progress thread (mpi_exchange.h).
#include "mpi_exchange.h"

#include <pthread.h>

#include <algorithm>
#include <cstdio>

#include "distca/comm/mpi.h"
#include "wait.h"

namespace distca::comm::mpi_detail {

namespace {

std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(buf, static_cast<std::size_t>(len));
}

}  // namespace

Status mpi_check(int code, const char* call, int rank) {
  if (code == MPI_SUCCESS) return Status::ok_status();
  return Status::internal(std::string(call) + " (rank " + std::to_string(rank) +
                          "): " + mpi_error_string(code));
}

namespace {

std::string p2p_mismatch(int src, int dst, int tag, uint64_t sent, uint64_t expected) {
  return "p2p: rank " + std::to_string(src) + " sends " + std::to_string(sent) +
         " bytes to rank " + std::to_string(dst) + " (tag " + std::to_string(tag) +
         "), which expects " + std::to_string(expected);
}

// The outcome of a point-to-point exchange whose requests have all completed: a size
// mismatch first (it explains a truncation), then the first request error.
Status p2p_result(const ExchangeState& st) {
  const P2pState& p = *st.p2p;
  if (p.theirs_known && p.theirs != p.mine) {
    const int src = p.is_send ? st.rank : p.peer;
    const int dst = p.is_send ? p.peer : st.rank;
    return Status::invalid_argument(p.is_send ? p2p_mismatch(src, dst, p.tag, p.mine, p.theirs)
                                              : p2p_mismatch(src, dst, p.tag, p.theirs, p.mine));
  }
  return p.error;
}

// The exchange has waited timeout_s with nothing completing: name the ranks it still waits
// for (their data has not arrived; or, when every receive is in, the ranks that have not
// taken this rank's data) and end the job. The requests stay pending, so no Status could
// leave the group usable; MPI_Abort is the only safe exit.
[[noreturn]] void abort_stalled(const ExchangeState& st) {
  std::vector<int> recv, send;  // peers, each once (a p2p exchange has several requests per peer)
  for (std::size_t i = 0; i < st.requests.size(); ++i) {
    if (st.requests[i] == MPI_REQUEST_NULL) continue;
    std::vector<int>& list = i < st.n_recv ? recv : send;
    if (std::find(list.begin(), list.end(), st.peer[i]) == list.end()) list.push_back(st.peer[i]);
  }
  auto join = [](const std::vector<int>& ranks) {
    std::string out;
    for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
    return out;
  };
  char secs[32];
  std::snprintf(secs, sizeof(secs), "%g", st.timeout_s);
  std::string who = !recv.empty() ? "no data from rank(s) " + join(recv) : "rank(s) " + join(send) + " took no data";
  if (st.p2p) who += std::string(" for the p2p ") + (st.p2p->is_send ? "send" : "receive") + " with tag " + std::to_string(st.p2p->tag);
  abort_job(st.rank, "no progress for " + std::string(secs) + " s (--mpi-timeout): " + who +
                         " (stopped, hung or far behind)");
}

}  // namespace

std::atomic<bool> g_aborting{false};

// Cancels the requests of `st` still pending and completes them, so that none still reads or
// writes the caller's buffers once the exchange reports `error` (the caller frees them while
// it unwinds). A receive cancels at once; a send MPI does not cancel (OpenMPI's, once
// matched) completes when its receiver takes it. If some request is still live after
// kSettleSeconds the job ends with `error` here: freeing a buffer under a live request
// corrupts memory, and an error already makes the group unusable (Communicator::fail).
constexpr double kSettleSeconds = 5;

Status settle(ExchangeState& st, const Status& error) {
  for (MPI_Request& r : st.requests) {
    if (r != MPI_REQUEST_NULL) (void)MPI_Cancel(&r);
  }
  const auto start = Clock::now();
  for (;;) {
    bool live = false;
    for (MPI_Request& r : st.requests) {
      if (r == MPI_REQUEST_NULL) continue;
      int flag = 0;
      // A request that completes with an error may stay allocated (drive); free it.
      if (MPI_Test(&r, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS && r != MPI_REQUEST_NULL) {
        (void)MPI_Request_free(&r);
        r = MPI_REQUEST_NULL;
      }
      live = live || r != MPI_REQUEST_NULL;
    }
    if (!live) break;
    if (std::chrono::duration<double>(Clock::now() - start).count() > kSettleSeconds) {
      abort_job(st.rank, error.message() + " (its pending transfers could not be cancelled)");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  st.remaining = 0;
  return error;
}


namespace {

// MPI_Testsome rounds over st's pending requests; checks every receive got exactly the bytes it
// expected. Returns nullopt while incomplete. An error may leave requests pending (drive
// settles them).
std::optional<Status> drive_rounds(ExchangeState& st, Drive how) {
  std::optional<BlockingWait> waiting;
  if (how == Drive::kBlock) {
    st.last_progress = Clock::now();
    waiting.emplace(st.wait);
  }
  const int count = static_cast<int>(st.requests.size());
  std::vector<int> indices(st.requests.size());
  std::vector<MPI_Status> statuses(st.requests.size());
  // Blocking is a test loop, not MPI_Waitall: OpenMPI 4.1.4's MPI_Waitall was seen to spin
  // forever on a receive that completed with MPI_ERR_TRUNCATE (a count mismatch), and a test
  // loop can give up after the timeout.
  while (st.remaining > 0) {
    int outcount = 0;
    const int rc = MPI_Testsome(count, st.requests.data(), &outcount, indices.data(), statuses.data());
    if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) return mpi_check(rc, "MPI_Testsome", st.rank);
    if (outcount == MPI_UNDEFINED) outcount = 0;
    for (int j = 0; j < outcount; ++j) {
      const auto i = static_cast<std::size_t>(indices[static_cast<std::size_t>(j)]);
      const MPI_Status& status = statuses[static_cast<std::size_t>(j)];
      const std::string where = i < st.n_recv ? "receive from rank " + std::to_string(st.peer[i])
                                              : "send to rank " + std::to_string(st.peer[i]);
      if (rc == MPI_ERR_IN_STATUS && status.MPI_ERROR != MPI_SUCCESS) {
        Status err = mpi_check(status.MPI_ERROR, "MPI_Testsome", st.rank)
                         .with_context((st.p2p ? "p2p " : "all_to_all_v ") + where);
        if (!st.p2p) return err;
        // A p2p exchange keeps going until every request is complete: its small header/ack
        // buffers live in st, and the mismatch (reported by p2p_result) explains the error.
        // OpenMPI may leave a request that failed allocated; free it so no later round
        // reports it again.
        if (st.requests[i] != MPI_REQUEST_NULL) {
          DISTCA_RETURN_IF_ERROR(mpi_check(MPI_Request_free(&st.requests[i]), "MPI_Request_free", st.rank));
        }
        if (st.p2p->error.ok()) st.p2p->error = err;
        --st.remaining;
        continue;
      }
      --st.remaining;
      if (i >= st.n_recv) continue;
      int got = 0;
      DISTCA_RETURN_IF_ERROR(mpi_check(MPI_Get_count(&status, MPI_BYTE, &got), "MPI_Get_count", st.rank));
      if (st.p2p) {
        P2pState& p = *st.p2p;
        if (i == 0) {
          p.theirs_known = got == static_cast<int>(sizeof(uint64_t));
        } else if (got != st.recv_expected[i] && p.error.ok()) {
          p.error = Status::internal("p2p: rank " + std::to_string(p.peer) + " sent " + std::to_string(got) +
                                     " bytes to rank " + std::to_string(st.rank) + ", which expects " +
                                     std::to_string(st.recv_expected[i]));
        }
        continue;
      }
      if (got != st.recv_expected[i]) {
        return Status::internal("all_to_all_v: rank " + std::to_string(st.peer[i]) + " sent " +
                                std::to_string(got) + " bytes to rank " + std::to_string(st.rank) +
                                ", which expects " + std::to_string(st.recv_expected[i]));
      }
    }
    if (st.remaining == 0) break;
    if (how != Drive::kTest && st.timeout_s > 0) {
      const auto now = Clock::now();
      if (outcount > 0) {
        st.last_progress = now;
      } else if (std::chrono::duration<double>(now - st.last_progress).count() > st.timeout_s) {
        abort_stalled(st);
      }
    }
    if (how != Drive::kBlock) return std::nullopt;
    if (outcount == 0) {
      waiting->idle();
    } else {
      waiting->progressed();
    }
  }
  if (st.trace) {
    st.trace->record({st.trace_name, "comm", 0, st.rank, st.start_us, st.trace->now_us()});
  }
  return st.p2p ? p2p_result(st) : Status::ok_status();
}

}  // namespace

// drive_rounds, and on an error no request left in flight (settle).
std::optional<Status> drive(ExchangeState& st, Drive how) {
  std::optional<Status> result = drive_rounds(st, how);
  if (result && !result->ok()) return settle(st, *result);
  return result;
}

ProgressEngine::ProgressEngine(int poll_interval_us, int max_poll_interval_us, WaitPolicy wait)
    : poll_interval_(poll_interval_us),
      max_poll_interval_(std::max(poll_interval_us, max_poll_interval_us)),
      wait_(wait),
      thread_([this] { loop(); }) {}

ProgressEngine::~ProgressEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ProgressEngine::add(std::shared_ptr<ExchangeState> st) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    active_.push_back(std::move(st));
    ++events_;
  }
  cv_.notify_all();
}

bool ProgressEngine::is_done(const ExchangeState& st) {
  std::lock_guard<std::mutex> lock(mu_);
  return st.done;
}

Status ProgressEngine::wait(const ExchangeState& st) {
  std::unique_lock<std::mutex> lock(mu_);
  if (st.done) return st.status;
  owner_driving_ = true;
  cv_.wait(lock, [&] { return !in_round_; });
  BlockingWait waiting(wait_);
  auto pending = [](const std::vector<std::shared_ptr<ExchangeState>>& batch) {
    std::size_t n = 0;
    for (const auto& a : batch) n += a->remaining;
    return n;
  };
  while (!st.done) {
    std::vector<std::shared_ptr<ExchangeState>> batch = active_;
    lock.unlock();
    const std::size_t before = pending(batch);
    auto finished = drive_batch(batch);
    if (finished.empty() && pending(batch) == before) {
      waiting.idle();
    } else {
      waiting.progressed();
    }
    lock.lock();
    complete(finished);
  }
  owner_driving_ = false;
  cv_.notify_all();  // the thread takes over the exchanges still in flight
  return st.status;
}

ProgressEngine::Finished ProgressEngine::drive_batch(const std::vector<std::shared_ptr<ExchangeState>>& batch) {
  Finished finished;
  for (const auto& st : batch) {
    if (auto result = drive(*st, Drive::kProgress)) finished.emplace_back(st.get(), *result);
  }
  return finished;
}

void ProgressEngine::complete(const Finished& finished) {
  for (const auto& [st, status] : finished) {
    st->status = status;
    st->done = true;
    std::erase_if(active_, [&](const auto& a) { return a.get() == st; });
  }
}

void ProgressEngine::loop() {
  pthread_setname_np(pthread_self(), "distca-progress");  // scripts/thread-cpu.py finds it
  std::unique_lock<std::mutex> lock(mu_);
  std::chrono::microseconds pause = poll_interval_;
  uint64_t seen = events_;  // events_ when the previous pause was chosen
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || (!active_.empty() && !owner_driving_); });
    if (active_.empty()) return;  // stop_ with nothing in flight
    if (owner_driving_) {          // stop_ while the owner drives: impossible by contract
      cv_.wait(lock, [&] { return !owner_driving_; });
      continue;
    }
    if (g_aborting.load()) {
      cv_.wait_for(lock, std::chrono::milliseconds(100));
      continue;
    }
    std::vector<std::shared_ptr<ExchangeState>> batch = active_;
    in_round_ = true;
    lock.unlock();
    rounds_.fetch_add(1, std::memory_order_relaxed);
    const Finished finished = drive_batch(batch);
    lock.lock();
    in_round_ = false;
    complete(finished);
    if (owner_driving_ || !finished.empty()) cv_.notify_all();
    if (active_.empty()) continue;
    // A completion, or an exchange added since the previous round, restarts the ramp.
    pause = !finished.empty() || events_ != seen ? poll_interval_ : std::min(2 * pause, max_poll_interval_);
    seen = events_;
    if (pause.count() == 0) continue;
    const uint64_t before = events_;
    cv_.wait_for(lock, pause, [&] { return stop_ || owner_driving_ || events_ != before; });
  }
}

}  // namespace distca::comm::mpi_detail
