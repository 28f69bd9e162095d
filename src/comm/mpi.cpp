// Backend `mpi` (mpi.h): MPI environment and the communicator (its exchanges and progress
// thread: mpi_exchange.h).
#include "distca/comm/mpi.h"

#include "mpi_exchange.h"
#include "wait.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <pthread.h>
#include <thread>
#include <vector>

namespace distca::comm {
using namespace mpi_detail;

namespace {

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "unknown";
  }
}

// Initialises MPI once per process; finalises when the last holder (the static below and
// every communicator) lets go, which is at process exit.
class MpiEnvironment {
 public:
  static Result<std::shared_ptr<MpiEnvironment>> get(int* argc, char*** argv) {
    static std::mutex mu;
    static std::shared_ptr<MpiEnvironment> env;
    std::lock_guard<std::mutex> lock(mu);
    if (env) return env;
    int initialized = 0;
    DISTCA_RETURN_IF_ERROR(mpi_check(MPI_Initialized(&initialized), "MPI_Initialized", -1));
    int provided = MPI_THREAD_SINGLE;
    bool owns = false;
    if (initialized) {
      DISTCA_RETURN_IF_ERROR(mpi_check(MPI_Query_thread(&provided), "MPI_Query_thread", -1));
    } else {
      DISTCA_RETURN_IF_ERROR(mpi_check(
          MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread", -1));
      owns = true;
    }
    // Errors come back as codes (turned into Status) instead of aborting inside MPI.
    DISTCA_RETURN_IF_ERROR(mpi_check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN),
                                     "MPI_Comm_set_errhandler", -1));
    env = std::shared_ptr<MpiEnvironment>(new MpiEnvironment(provided, owns));
    return env;
  }

  ~MpiEnvironment() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
      int rank = 0;
      (void)MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      // A diagnostic (DISTCA_WAIT_STATS): its failure changes no result, so it is only said.
      if (Status s = write_wait_stats(rank); !s.ok()) std::fprintf(stderr, "distca: warning: %s\n", s.message().c_str());
    }
    if (owns_ && !finalized) MPI_Finalize();
  }

  int provided() const { return provided_; }

 private:
  MpiEnvironment(int provided, bool owns) : provided_(provided), owns_(owns) {}
  int provided_;
  bool owns_;
};

class MpiExchange : public Exchange {
 public:
  MpiExchange(std::shared_ptr<ExchangeState> st, std::shared_ptr<ProgressEngine> engine)
      : st_(std::move(st)), engine_(std::move(engine)) {}

  // Waiting could hang (peers may be blocked elsewhere waiting for this rank) and freeing
  // the buffers under live requests is undefined, so an unfinished exchange ends the job.
  ~MpiExchange() override {
    if (!result_ && !test()) abort_job(st_->rank, "dropped an unfinished exchange");
  }

  Status wait() override {
    if (!result_) {
      if (engine_) {
        result_ = engine_->wait(*st_);
      } else {
        result_ = drive(*st_, Drive::kBlock);
      }
    }
    return *result_;
  }

  bool test() override {
    if (!result_) {
      if (engine_) {
        if (engine_->is_done(*st_)) result_ = engine_->wait(*st_);
      } else {
        result_ = drive(*st_, Drive::kTest);
      }
    }
    return result_.has_value();
  }

 private:
  std::shared_ptr<ExchangeState> st_;
  std::shared_ptr<ProgressEngine> engine_;  // null: test()/wait() drive (kPoll, blocking sections)
  std::optional<Status> result_;
};

// Tags cycle through a range every MPI guarantees (MPI_TAG_UB >= 32767); MPI's in-order
// matching keeps equal tags of far-apart exchanges apart anyway.
constexpr uint64_t kTagRange = 32767;

// Point-to-point messages travel on their own communicator (p2p_comm_), so their tags never
// meet the all-to-all-v sequence tags above. A caller's tag t becomes three MPI tags, one per
// kind of message, each matched FIFO by MPI's non-overtaking rule: the k-th header, payload
// and ack of (peer, t) all belong to the k-th message.
enum P2pKind : int { kP2pHeader = 0, kP2pPayload = 1, kP2pAck = 2, kP2pKinds = 3 };
constexpr int p2p_mpi_tag(int tag, P2pKind kind) { return tag * kP2pKinds + kind; }
constexpr int kP2pMaxMpiTag = p2p_mpi_tag(kP2pTagLimit - 1, kP2pAck);

class MpiCommunicatorImpl : public MpiCommunicator {
 public:
  MpiCommunicatorImpl(std::shared_ptr<MpiEnvironment> env, MPI_Comm comm, MPI_Comm p2p_comm,
                      int tag_ub, int rank, int size, MpiInfo info, int poll_interval_us,
                      int max_poll_interval_us, TraceRecorder* trace, double timeout_s)
      : env_(std::move(env)),
        comm_(comm),
        p2p_comm_(p2p_comm),
        tag_ub_(tag_ub),
        rank_(rank),
        size_(size),
        info_(std::move(info)),
        poll_interval_us_(poll_interval_us),
        max_poll_interval_us_(max_poll_interval_us),
        trace_(trace),
        timeout_s_(timeout_s) {}

  ~MpiCommunicatorImpl() override {
    engine_.reset();  // joins the progress thread (exchanges are done by contract)
    // Nothing to report to from a destructor; a failure here changes no result.
    (void)MPI_Comm_free(&comm_);
    (void)MPI_Comm_free(&p2p_comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  Result<std::vector<int64_t>> host_ids() override {
    // The split is blocking (like the duplicates at create); it runs once, at a run's start.
    MPI_Comm shm = MPI_COMM_NULL;
    DISTCA_RETURN_IF_ERROR(mpi_check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &shm),
                                     "MPI_Comm_split_type", rank_));
    MPI_Group shm_group = MPI_GROUP_NULL, world_group = MPI_GROUP_NULL;
    int first = 0, leader = rank_;
    Status st = mpi_check(MPI_Comm_group(shm, &shm_group), "MPI_Comm_group", rank_);
    if (st.ok()) st = mpi_check(MPI_Comm_group(comm_, &world_group), "MPI_Comm_group", rank_);
    if (st.ok()) {
      st = mpi_check(MPI_Group_translate_ranks(shm_group, 1, &first, world_group, &leader), "MPI_Group_translate_ranks",
                     rank_);
    }
    if (shm_group != MPI_GROUP_NULL) (void)MPI_Group_free(&shm_group);
    if (world_group != MPI_GROUP_NULL) (void)MPI_Group_free(&world_group);
    (void)MPI_Comm_free(&shm);
    DISTCA_RETURN_IF_ERROR(st);
    return all_gather_value(static_cast<int64_t>(leader));
  }
  const MpiInfo& info() const override { return info_; }
  int64_t progress_rounds() const override {
    return engine_ ? engine_->rounds() : 0;
  }

  // A zero-byte message to and from every peer rather than MPI_Barrier: the test loop bounds the
  // wait (timeout) and knows which peers have not arrived.
  Status barrier() override {
    const auto n = static_cast<std::size_t>(size_);
    std::vector<std::size_t> zeros(n, 0);
    return all_to_all_v({nullptr, zeros, zeros, nullptr, zeros, zeros}).with_context("barrier");
  }

  Status all_to_all_v(const AllToAllV& a) override {
    DISTCA_ASSIGN_OR_RETURN(auto st, post(a));
    return drive(*st, Drive::kBlock).value();
  }

  Result<std::unique_ptr<Exchange>> start_all_to_all_v(const AllToAllV& a) override {
    const double start_us = trace_ ? trace_->now_us() : 0.0;
    DISTCA_ASSIGN_OR_RETURN(auto st, post(a));
    st->trace = trace_;
    if (trace_ != nullptr && a.label != nullptr) st->trace_name = std::string(a.label) + " transfer";
    st->start_us = start_us;
    return launch(std::move(st));
  }

  Result<std::unique_ptr<Exchange>> start_send(std::span<const std::byte> data, int peer, int tag,
                                               const char* label) override {
    return start_p2p(true, data.data(), nullptr, data.size(), peer, tag, label);
  }

  Result<std::unique_ptr<Exchange>> start_recv(std::span<std::byte> data, int peer, int tag,
                                               const char* label) override {
    return start_p2p(false, nullptr, data.data(), data.size(), peer, tag, label);
  }

  Status broadcast(std::span<std::byte> data, int root) override {
    if (root < 0 || root >= size_) {
      return Status::invalid_argument("broadcast: root " + std::to_string(root) +
                                      " is not a rank of a group of " + std::to_string(size_));
    }
    // MPI counts are ints: large buffers go in chunks (every rank cuts the same way). Each
    // chunk is an all_to_all_v, so the wait is bounded like every other.
    constexpr std::size_t kChunk = std::size_t{1} << 30;
    for (std::size_t off = 0; off < data.size(); off += kChunk) {
      DISTCA_RETURN_IF_ERROR(Communicator::broadcast(data.subspan(off, std::min(kChunk, data.size() - off)), root));
    }
    return Status::ok_status();
  }

  void begin_blocking() override { ++blocking_depth_; }
  void end_blocking() override {
    DISTCA_CHECK(blocking_depth_ > 0);
    --blocking_depth_;
  }

  void fail(const Status& cause) override { abort_job(rank_, cause.message()); }

 private:
  // Hands an exchange to the progress thread (kThread, outside begin_blocking/end_blocking)
  // and wraps it in its handle; otherwise its test()/wait() drive it.
  std::unique_ptr<Exchange> launch(std::shared_ptr<ExchangeState> st) {
    if (info_.progress == ProgressMode::kThread && blocking_depth_ == 0) {
      if (!engine_) engine_ = std::make_shared<ProgressEngine>(poll_interval_us_, max_poll_interval_us_, info_.wait);
      engine_->add(st);
      return std::make_unique<MpiExchange>(std::move(st), engine_);
    }
    return std::make_unique<MpiExchange>(std::move(st), nullptr);
  }

  // Posts one side of a point-to-point message (request layout: P2pState).
  Result<std::unique_ptr<Exchange>> start_p2p(bool is_send, const std::byte* send, std::byte* recv,
                                              std::size_t bytes, int peer, int tag, const char* label) {
    const char* call = is_send ? "start_send" : "start_recv";
    DISTCA_RETURN_IF_ERROR(validate_p2p(call, is_send ? static_cast<const void*>(send) : recv, bytes,
                                        peer, tag, rank_, size_));
    if (bytes > static_cast<std::size_t>(INT_MAX)) {
      return Status::invalid_argument(std::string(call) + " (rank " + std::to_string(rank_) + "): " +
                                      std::to_string(bytes) + " bytes exceed MPI's int count (" +
                                      std::to_string(INT_MAX) + " bytes)");
    }
    if (tag_ub_ < kP2pMaxMpiTag) {
      return Status::invalid_argument(std::string(call) + ": the MPI library's MPI_TAG_UB (" +
                                      std::to_string(tag_ub_) + ") is below the " +
                                      std::to_string(kP2pMaxMpiTag) + " point-to-point messages need");
    }
    const double start_us = trace_ ? trace_->now_us() : 0.0;
    auto st = std::make_shared<ExchangeState>();
    st->rank = rank_;
    st->timeout_s = timeout_s_;
    st->wait = info_.wait;
    st->last_progress = Clock::now();
    st->trace = trace_;
    st->start_us = start_us;
    st->trace_name = label != nullptr ? std::string(label) + " transfer" : is_send ? "p2p send" : "p2p recv";
    P2pState& p = st->p2p.emplace();
    p.is_send = is_send;
    p.peer = peer;
    p.tag = tag;
    p.mine = bytes;
    const int count = static_cast<int>(bytes);
    constexpr int kMeta = static_cast<int>(sizeof(uint64_t));
    // A request that fails to post leaves the ones before it live, reading or writing the
    // caller's buffer and st's header/ack: settle them before returning the error.
    // `req` by reference: read only after the MPI call (an argument) has written it.
    auto posted = [&](int rc, const char* what, const MPI_Request& req) -> Status {
      Status s = mpi_check(rc, what, rank_);
      if (!s.ok()) return settle(*st, s);
      st->requests.push_back(req);
      st->peer.push_back(peer);
      return s;
    };
    MPI_Request req = MPI_REQUEST_NULL;
    if (is_send) {
      DISTCA_RETURN_IF_ERROR(posted(MPI_Irecv(&p.theirs, kMeta, MPI_BYTE, peer, p2p_mpi_tag(tag, kP2pAck),
                                              p2p_comm_, &req), "MPI_Irecv", req));
      st->recv_expected = {kMeta};
      DISTCA_RETURN_IF_ERROR(posted(MPI_Isend(&p.mine, kMeta, MPI_BYTE, peer, p2p_mpi_tag(tag, kP2pHeader),
                                              p2p_comm_, &req), "MPI_Isend", req));
      DISTCA_RETURN_IF_ERROR(posted(MPI_Isend(send, count, MPI_BYTE, peer, p2p_mpi_tag(tag, kP2pPayload),
                                              p2p_comm_, &req), "MPI_Isend", req));
    } else {
      DISTCA_RETURN_IF_ERROR(posted(MPI_Irecv(&p.theirs, kMeta, MPI_BYTE, peer, p2p_mpi_tag(tag, kP2pHeader),
                                              p2p_comm_, &req), "MPI_Irecv", req));
      DISTCA_RETURN_IF_ERROR(posted(MPI_Irecv(recv, count, MPI_BYTE, peer, p2p_mpi_tag(tag, kP2pPayload),
                                              p2p_comm_, &req), "MPI_Irecv", req));
      st->recv_expected = {kMeta, count};
      DISTCA_RETURN_IF_ERROR(posted(MPI_Isend(&p.mine, kMeta, MPI_BYTE, peer, p2p_mpi_tag(tag, kP2pAck),
                                              p2p_comm_, &req), "MPI_Isend", req));
    }
    st->n_recv = st->recv_expected.size();
    st->remaining = st->requests.size();
    return launch(std::move(st));
  }

  // Posts the receives, then the sends, of one exchange (self block: memcpy).
  Result<std::shared_ptr<ExchangeState>> post(const AllToAllV& a) {
    DISTCA_RETURN_IF_ERROR(validate_all_to_all_v(a, size_));
    for (int p = 0; p < size_; ++p) {
      const auto up = static_cast<std::size_t>(p);
      if (a.send_counts[up] > static_cast<std::size_t>(INT_MAX) ||
          a.recv_counts[up] > static_cast<std::size_t>(INT_MAX)) {
        return Status::invalid_argument(
            "all_to_all_v: a block to or from rank " + std::to_string(p) +
            " exceeds MPI's int count (" + std::to_string(INT_MAX) + " bytes)");
      }
    }
    const auto me = static_cast<std::size_t>(rank_);
    if (a.send_counts[me] != a.recv_counts[me]) {
      return Status::invalid_argument("all_to_all_v: rank " + std::to_string(rank_) +
                                      " sends itself " + std::to_string(a.send_counts[me]) +
                                      " bytes but expects " + std::to_string(a.recv_counts[me]));
    }
    const int tag = static_cast<int>(next_seq_++ % kTagRange);
    auto st = std::make_shared<ExchangeState>();
    st->rank = rank_;
    st->timeout_s = timeout_s_;
    st->wait = info_.wait;
    st->last_progress = Clock::now();
    st->requests.reserve(2 * static_cast<std::size_t>(size_));
    // A failed post leaves the earlier requests live on the caller's buffers: settle them.
    auto posted = [&](int rc, const char* what) { return rc == MPI_SUCCESS ? Status::ok_status() : settle(*st, mpi_check(rc, what, rank_)); };
    // Zero-byte messages are sent too, so a count mismatch shows up as a wrong count or a
    // truncation instead of a hang.
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      const auto up = static_cast<std::size_t>(p);
      MPI_Request req;
      DISTCA_RETURN_IF_ERROR(posted(MPI_Irecv(a.recv + a.recv_displs[up], static_cast<int>(a.recv_counts[up]),
                                              MPI_BYTE, p, tag, comm_, &req), "MPI_Irecv"));
      st->requests.push_back(req);
      st->peer.push_back(p);
      st->recv_expected.push_back(static_cast<int>(a.recv_counts[up]));
    }
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      const auto up = static_cast<std::size_t>(p);
      MPI_Request req;
      DISTCA_RETURN_IF_ERROR(posted(MPI_Isend(a.send + a.send_displs[up], static_cast<int>(a.send_counts[up]),
                                              MPI_BYTE, p, tag, comm_, &req), "MPI_Isend"));
      st->requests.push_back(req);
      st->peer.push_back(p);
    }
    st->n_recv = st->recv_expected.size();
    st->remaining = st->requests.size();
    if (a.send_counts[me] > 0) {
      std::memcpy(a.recv + a.recv_displs[me], a.send + a.send_displs[me], a.send_counts[me]);
    }
    return st;
  }

  std::shared_ptr<MpiEnvironment> env_;  // first member: outlives comm_
  MPI_Comm comm_;
  MPI_Comm p2p_comm_;  // point-to-point messages only: tags apart from comm_'s exchanges
  const int tag_ub_;   // MPI_TAG_UB of p2p_comm_
  const int rank_;
  const int size_;
  const MpiInfo info_;
  const int poll_interval_us_;
  const int max_poll_interval_us_;
  TraceRecorder* const trace_;
  const double timeout_s_;
  uint64_t next_seq_ = 0;
  int blocking_depth_ = 0;  // open begin_blocking() calls
  std::shared_ptr<ProgressEngine> engine_;  // kThread mode, started at the first exchange
};

}  // namespace

Result<std::unique_ptr<MpiCommunicator>> make_mpi_communicator(int* argc, char*** argv,
                                                               const MpiOptions& options) {
  if (options.poll_interval_us < 0) {
    return Status::invalid_argument("mpi: poll_interval_us must be >= 0 (got " +
                                    std::to_string(options.poll_interval_us) + ")");
  }
  if (options.max_poll_interval_us < options.poll_interval_us) {
    return Status::invalid_argument("mpi: max_poll_interval_us must be >= poll_interval_us (got " +
                                    std::to_string(options.max_poll_interval_us) + " < " +
                                    std::to_string(options.poll_interval_us) + ")");
  }
  if (!(options.timeout_s >= 0) || !std::isfinite(options.timeout_s)) {
    return Status::invalid_argument("mpi: timeout_s must be finite and >= 0 (got " +
                                    std::to_string(options.timeout_s) + ")");
  }
  MpiInfo info;
  if (options.wait) {
    info.wait = *options.wait;
  } else {
    DISTCA_ASSIGN_OR_RETURN(info.wait, wait_policy_from_env());
  }
  DISTCA_ASSIGN_OR_RETURN(auto env, MpiEnvironment::get(argc, argv));
  info.thread_level_provided = env->provided();
  info.thread_level_name = thread_level_name(env->provided());
  const bool multiple = env->provided() >= MPI_THREAD_MULTIPLE;
  switch (options.progress) {
    case ProgressMode::kAuto:
      info.progress = multiple ? ProgressMode::kThread : ProgressMode::kPoll;
      break;
    case ProgressMode::kThread:
      if (!multiple) {
        return Status::invalid_argument(
            "mpi: progress thread needs MPI_THREAD_MULTIPLE, the MPI library provides " +
            info.thread_level_name);
      }
      info.progress = ProgressMode::kThread;
      break;
    case ProgressMode::kPoll:
      info.progress = ProgressMode::kPoll;
      break;
  }
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int vlen = 0;
  DISTCA_RETURN_IF_ERROR(
      mpi_check(MPI_Get_library_version(version, &vlen), "MPI_Get_library_version", -1));
  info.library_version = std::string(version, static_cast<std::size_t>(vlen));
  if (auto nl = info.library_version.find('\n'); nl != std::string::npos) {
    info.library_version.resize(nl);
  }
  int rank = 0;
  int size = 0;
  DISTCA_RETURN_IF_ERROR(mpi_check(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank", -1));
  DISTCA_RETURN_IF_ERROR(mpi_check(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size", rank));
  // A private duplicate keeps distca's messages apart from anyone else's on MPI_COMM_WORLD.
  MPI_Comm comm;
  DISTCA_RETURN_IF_ERROR(mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI_Comm_dup", rank));
  Status st = mpi_check(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN),
                        "MPI_Comm_set_errhandler", rank);
  if (!st.ok()) {
    MPI_Comm_free(&comm);
    return st;
  }
  // A second duplicate for point-to-point messages (see p2p_mpi_tag).
  MPI_Comm p2p_comm;
  st = mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &p2p_comm), "MPI_Comm_dup", rank);
  if (!st.ok()) {
    MPI_Comm_free(&comm);
    return st;
  }
  st = mpi_check(MPI_Comm_set_errhandler(p2p_comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", rank);
  int* tag_ub = nullptr;
  int has_tag_ub = 0;
  if (st.ok()) {
    st = mpi_check(MPI_Comm_get_attr(p2p_comm, MPI_TAG_UB, &tag_ub, &has_tag_ub), "MPI_Comm_get_attr", rank);
  }
  if (!st.ok()) {
    MPI_Comm_free(&comm);
    MPI_Comm_free(&p2p_comm);
    return st;
  }
  // Every MPI provides the attribute; 32767 is the least it may say.
  const int tag_limit = has_tag_ub && tag_ub != nullptr ? *tag_ub : 32767;
  return std::unique_ptr<MpiCommunicator>(std::make_unique<MpiCommunicatorImpl>(
      std::move(env), comm, p2p_comm, tag_limit, rank, size, std::move(info),
      options.poll_interval_us, options.max_poll_interval_us, options.trace, options.timeout_s));
}

void abort_job(int rank, const std::string& cause) {
  // Several threads may fail at once; one line per job is enough.
  if (g_aborting.exchange(true)) {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  std::fprintf(stderr, "distca: rank %d failed: %s\n", rank, cause.c_str());
  std::fflush(stderr);
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

}  // namespace distca::comm
