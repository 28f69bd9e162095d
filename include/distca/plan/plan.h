// The plan: what every rank does with its attention in one layer, precise enough for a
// runtime to dispatch real tensors (docs/plan-format.md is the field-by-field reference).
//
// Buffers (rows; a row is one token's tensor for all heads):
//   token buffer of rank r   the rank's own rows, pieces in Batch::per_rank[r] order
//                            (DocumentIndex::local_row gives the mapping)
//   send / receive buffer    one per exchange; peer p's rows at [displs[p], displs[p]+counts[p])
//                            in the order of that peer's RowBlock list. A rank never sends to
//                            itself: counts[self] == 0 and local rows are read in place.
// Exchanges, canonical order of the rows of one (sender, receiver) pair:
//   kQ    home -> server. Blocks = the receiver's tasks with that home whose home != server,
//         in the server's task order; block = the task's query rows [q_begin, q_end).
//   kKv   holder -> server. For each document in the order of its first task on the server,
//         the context [0, E) (E = max q_end of the document's tasks there), restricted to the
//         rows the sender holds, as maximal runs in increasing position (one block per held
//         run, so a block never straddles two pieces).
//   kOLse server -> home: exactly kQ's blocks in the opposite direction (O rows, then the
//         runtime sends LSE with the same counts; row_bytes = o + lse).
//   kDO   like kQ (dO rows); kDQ like kOLse (dQ rows); kDKv like kKv in the opposite
//         direction (the server's dK/dV partials for every context row it received, each
//         summed first over the server's tasks in task order).
// So on a server: q receive == o_lse send == dO receive == dQ send, and kv receive == dkv
// send; on a home the mirror images hold.
//
// Server side: tasks in fused-call order (the order of Schedule::tasks). Q input row i of the
// fused call is the task's query rows; K/V input of task t is its whole context [0, q_end)
// contiguous (varlen kernels need it), assembled from `kv` segments: local rows of the
// server's token buffer or rows of its kKv receive buffer (a received row may feed several
// tasks: dedup on the wire, expansion on the server). Outputs: O row cu_q[t] + i of the fused
// call belongs to query row q_begin + i; it goes back by kOLse at q_offset (remote home) or
// into the token buffer at q_offset (local home). Backward dK/dV of a context row: the
// server sums its tasks' partials for a received row (task order) into the kDKv send buffer
// at the segment's offset; the holder adds, for each of its rows, first its own local
// partials, then the partials received from servers in ascending rank order (fixed order,
// so the sum is bitwise reproducible).
//
// Thread safety: plain values.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "distca/core/check.h"

#include "distca/cost/analytic.h"
#include "distca/data/batch.h"
#include "distca/plan/peer_vector.h"
#include "distca/plan/schedule.h"
#include "distca/plan/traffic.h"

namespace distca {

// Rows [begin, end) of document `doc`.
struct RowBlock {
  int64_t doc = 0;
  int64_t begin = 0;
  int64_t end = 0;
  int64_t rows() const { return end - begin; }
  bool operator==(const RowBlock&) const = default;
};

// `len` consecutive rows of a task's input: local rows [offset, offset + len) of the server's
// token buffer (received == false), or rows [offset, offset + len) of its receive buffer of
// the exchange (received == true; offset includes the peer's displacement).
struct Segment {
  bool received = false;
  int64_t offset = 0;
  int64_t len = 0;
  bool operator==(const Segment&) const = default;
};

// A task's segments: a vector (iteration, size, [], push_back, reserve, ==) that keeps up to
// kInline segments in place (64 bytes in all). A task's context is almost always one or two runs, so a plan of
// 10^5 tasks does not make 10^5 small allocations (docs/scheduler.md, "Performance").
class SegmentList {
 public:
  static constexpr uint32_t kInline = 2;
  SegmentList() = default;
  SegmentList(std::initializer_list<Segment> init) {
    reserve(init.size());
    for (const Segment& s : init) push_back(s);
  }
  SegmentList(const SegmentList& o) { *this = o; }
  SegmentList(SegmentList&& o) noexcept { steal(o); }
  SegmentList& operator=(const SegmentList& o) {
    if (this == &o) return *this;
    size_ = 0;
    reserve(o.size_);
    std::copy(o.begin(), o.end(), data());
    size_ = o.size_;
    return *this;
  }
  SegmentList& operator=(SegmentList&& o) noexcept {
    if (this != &o) {
      release();
      steal(o);
    }
    return *this;
  }
  ~SegmentList() { release(); }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  Segment* data() { return cap_ > kInline ? heap_ : inline_; }
  const Segment* data() const { return cap_ > kInline ? heap_ : inline_; }
  Segment* begin() { return data(); }
  Segment* end() { return data() + size_; }
  const Segment* begin() const { return data(); }
  const Segment* end() const { return data() + size_; }
  Segment& operator[](size_t i) { return data()[i]; }
  const Segment& operator[](size_t i) const { return data()[i]; }
  Segment& back() { return data()[size_ - 1]; }
  const Segment& back() const { return data()[size_ - 1]; }
  void clear() { size_ = 0; }
  void reserve(size_t n) {
    if (n <= cap_) return;
    DISTCA_CHECK(n < (size_t{1} << 31));
    auto* grown = new Segment[n];
    std::copy(begin(), end(), grown);
    release();
    heap_ = grown;
    cap_ = static_cast<uint32_t>(n);
  }
  void push_back(const Segment& s) {
    if (size_ == cap_) reserve(2 * static_cast<size_t>(cap_));
    data()[size_++] = s;
  }
  bool operator==(const SegmentList& o) const { return std::equal(begin(), end(), o.begin(), o.end()); }

 private:
  void release() {
    if (cap_ > kInline) delete[] heap_;
    heap_ = nullptr;
    cap_ = kInline;
  }
  // Takes o's contents (o is left empty); precondition: this holds no heap block.
  void steal(SegmentList& o) {
    size_ = o.size_;
    cap_ = o.cap_;
    if (o.cap_ > kInline) {
      heap_ = o.heap_;
    } else {
      std::copy(o.inline_, o.inline_ + o.size_, inline_);
    }
    o.size_ = 0;
    o.cap_ = kInline;
    o.heap_ = nullptr;
  }

  uint32_t size_ = 0;
  uint32_t cap_ = kInline;  // > kInline: the segments live in heap_
  Segment inline_[kInline];
  Segment* heap_ = nullptr;
};

struct ServerTask {
  TaskPlacement task;
  // home == server: local row of q_begin in the server's token buffer. home != server: first
  // row of the task in the server's kQ receive buffer (== kOLse send, kDO receive, kDQ send).
  int64_t q_offset = 0;
  // Context rows [0, q_end) in order; lengths sum to q_end. Received offsets index kKv.
  SegmentList kv;
  bool operator==(const ServerTask&) const = default;
};

struct ServerPlan {
  std::vector<ServerTask> tasks;      // fused-call order
  std::vector<int32_t> cu_seqlens_q;  // [tasks + 1] prefix sums of q_len, starts at 0
  std::vector<int32_t> cu_seqlens_k;  // [tasks + 1] prefix sums of kv_len (= q_end)
  double load = 0;                    // sum of task costs in task order
  bool operator==(const ServerPlan&) const = default;
};

enum class ExchangeKind { kQ = 0, kKv, kOLse, kDO, kDQ, kDKv };
inline constexpr int kNumExchanges = 6;
const char* exchange_name(ExchangeKind kind);  // "q", "kv", "o_lse", "do", "dq", "dkv"

// One all-to-all-v of one rank, in rows. Every vector is [ranks], stored sparsely
// (peer_vector.h): a rank holds entries only for the peers it exchanges rows with, so a plan
// is linear in ranks plus the pairs that talk, not quadratic. counts[p] is 0 and blocks[p]
// empty for any other peer; displs[p] is the prefix sum of the counts of peers below p where
// counts[p] > 0 and 0 where counts[p] == 0 (an all-to-all-v ignores the displacement of an
// empty message; the JSON prints the dense prefix sums, docs/plan-format.md).
struct Exchange {
  int64_t row_bytes = 0;
  PeerVector<int64_t> send_counts, send_displs, recv_counts, recv_displs;
  PeerVector<std::vector<RowBlock>> send_blocks, recv_blocks;  // [peer][blocks in order]
  int64_t send_rows() const;
  int64_t recv_rows() const;
  bool operator==(const Exchange&) const = default;
};

struct RankPlan {
  int64_t tokens = 0;                          // rows of the rank's token buffer
  std::array<Exchange, kNumExchanges> exchanges;  // indexed by ExchangeKind
  const Exchange& exchange(ExchangeKind k) const { return exchanges[static_cast<size_t>(k)]; }
  bool operator==(const RankPlan&) const = default;
};

// The exchanges' bytes (traffic, summed over ranks, each message once) split by the link
// they cross under ScheduleOptions::topology: between two ranks of one host, or between
// hosts. Without a topology every byte is intra-host.
struct HostBytes {
  int64_t intra_fwd = 0, inter_fwd = 0;
  int64_t intra_bwd = 0, inter_bwd = 0;
  bool operator==(const HostBytes&) const = default;
};

// The figures the summary reports, all derived from the plan (the validator recomputes them).
struct PlanMetrics {
  std::vector<double> loads;         // [ranks] after (this schedule)
  std::vector<double> loads_before;  // [ranks] colocated on the INPUT batch
  std::vector<int64_t> tokens;       // [ranks] of the plan's batch
  double load_max_over_mean = 1;
  double load_before_max_over_mean = 1;
  double tokens_max_over_mean = 1;
  Traffic traffic;              // the plan's exchanges (the byte rules of traffic.h)
  AllGatherTraffic allgather;   // percp only (zero otherwise)
  // Reported figures. For every scheduler but percp they are traffic's (the exchanges). For
  // percp, what a CP implementation really moves: its data loader lays every document's
  // head-tail shards out on their ranks (free, like wlb's re-pack), so Q, O, dO and dQ stay
  // local, and the bytes are the group all-gather of K/V (forward) and the reduce-scatter of
  // dK/dV (backward, the same bytes): allgather. The exchanges (traffic) are still the
  // layouts a CAD runtime would use to execute this plan on the unmoved tokens.
  int64_t comm_bytes_total = 0;      // forward
  int64_t comm_bytes_backward = 0;
  int64_t comm_bytes_max_rank = 0;   // forward sent + received of the busiest rank
  std::vector<RankBytes> per_rank;   // [ranks] the reported bytes per rank
  HostBytes host_bytes;              // traffic by link (percp: its exchanges, not the all-gather)
  bool operator==(const PlanMetrics&) const = default;
};

struct Plan {
  SchedulerSpec scheduler;
  double tolerance = 0;
  int64_t align_rows = 1;            // ScheduleOptions::align_rows the plan was made with
  int64_t dtype_bytes = 2;
  RowBytes row_bytes;
  std::string cost_unit = "pairs";
  // [ranks] host of every rank (canonical_hosts of ScheduleOptions::topology), or empty.
  std::vector<int64_t> hosts;
  int64_t inter_host_price = 1;      // the topology's price (1 without one)
  Batch batch;                       // the batch homes and local rows refer to
  std::vector<ServerPlan> servers;   // [ranks]
  std::vector<RankPlan> ranks;       // [ranks]
  PlanMetrics metrics;
  int64_t num_tasks() const;
};

// Wall-clock seconds of the phases of a complete plan (make_plan fills all of them,
// build_plan the last five). What `distca bench plan` reports per phase.
struct PlanPhases {
  double validate_s = 0;  // make_plan: ScheduleOptions::validate (the batch's check included)
  double schedule_s = 0;  // make_plan: the scheduler
  double index_s = 0;     // the schedule's batch checked, the document index, the plan's copy of the batch
  double tasks_s = 0;     // tasks checked and handed to their servers, empty exchanges
  double layouts_s = 0;   // per server: q and kv blocks on both ends, receive counts, task inputs
  double mirror_s = 0;    // send counts; o_lse, do, dq, dkv mirrored from q and kv
  double metrics_s = 0;   // loads, tokens, traffic (and percp's all-gather)
  double total() const;
};

// Builds the plan of `schedule` (whose batch the homes refer to). `input` is the batch the
// scheduler was given (for loads_before). Fails (kInvalidArgument) if a task is malformed:
// unknown document, empty or out-of-range query rows, rank out of range, query rows not
// inside one piece held by home. It does NOT check coverage; validate_plan does.
// Cost: O(pieces + tasks + ranks + blocks) time and memory (docs/scheduler.md, "Performance":
// no [ranks] or [documents] array per server, a fixed number of allocations per task, per
// block list and per rank). `phases`, when given, receives the time of its phases.
Result<Plan> build_plan(const Schedule& schedule, const Batch& input, const SchedulerSpec& spec,
                        const ScheduleOptions& options, PlanPhases* phases = nullptr);

// What build_plan will hold for `schedule`, counted before it allocates (the CLI's memory
// estimate, docs/scheduler.md): its tasks, one q block per task served away from home, and the
// kv blocks (per (document, server) pair, the runs held by other ranks that start inside the
// context [0, E), E the pair's largest q_end). Tasks naming an unknown document are skipped
// (build_plan refuses them). Precondition: schedule.batch.validate() is OK.
struct PlanSize {
  int64_t tasks = 0;
  int64_t q_blocks = 0;
  int64_t kv_blocks = 0;
};
PlanSize plan_size(const Schedule& schedule);

// HostBytes of a plan's exchanges (its layouts) under `hosts` ([ranks] host ids, or empty:
// every byte intra-host).
HostBytes host_bytes(const Plan& plan, const std::vector<int64_t>& hosts);

// The groups (of CP degree C) serving each document under percp: every group holding any of
// its rows, ascending (one group unless the document crosses a group boundary).
// [slot of index.doc_ids()][groups]. Precondition: cp_degree divides index.ranks().
std::vector<std::vector<int64_t>> percp_groups(const DocumentIndex& index, int64_t cp_degree);

namespace detail {
// make_plan's build_plan: takes the schedule's batch instead of copying it, and skips the
// batch's check when it equals `validated_input` (which the caller has validated).
Result<Plan> build_plan_from(Schedule&& schedule, const Batch& validated_input, const SchedulerSpec& spec,
                             const ScheduleOptions& options, PlanPhases* phases);
}  // namespace detail

// run_scheduler + build_plan (the options and the batch checked once). `phases`, when given,
// receives the time of every phase.
Result<Plan> make_plan(const Batch& batch, const SchedulerSpec& spec, const ScheduleOptions& options,
                       PlanPhases* phases = nullptr);

}  // namespace distca
