// Ping-pong nano-batches (include/distca/runtime/pingpong.h).
#include "distca/runtime/pingpong.h"

#include <algorithm>
#include <utility>

namespace distca::runtime {

Result<OverlapMode> parse_overlap_mode(const std::string& text, const std::string& flag) {
  if (text == "pingpong") return OverlapMode::kPingPong;
  if (text == "single-stream") return OverlapMode::kSingleStream;
  if (text == "signal") return OverlapMode::kSignal;
  return Status::invalid_argument(flag + " must be pingpong, single-stream or signal (got '" + text + "')");
}

const char* overlap_mode_name(OverlapMode mode) {
  switch (mode) {
    case OverlapMode::kPingPong: return "pingpong";
    case OverlapMode::kSingleStream: return "single-stream";
    case OverlapMode::kSignal: return "signal";
  }
  return "?";
}

Result<NanoPlans> plan_nano_batches(const Batch& batch, const SchedulerSpec& spec,
                                    const ScheduleOptions& options) {
  DISTCA_RETURN_IF_ERROR(options.validate(batch, spec));
  NanoPlans out;
  DISTCA_ASSIGN_OR_RETURN(out.split, split_nano_batches(batch, options.align_rows));
  // The scheduler's input, kept for build_plan's loads_before (what validate_plan checks).
  const Batch input = out.split.batch;
  DISTCA_ASSIGN_OR_RETURN(Schedule sched, run_scheduler(spec, input, options));
  if (!(sched.batch == input)) {
    // wlb re-packs whole documents, ignoring the split's pieces: split its batch again. A cut
    // document keeps its cut (a function of its length); short ones stay whole.
    DISTCA_ASSIGN_OR_RETURN(out.split, split_nano_batches(sched.batch, options.align_rows));
  }
  // Each task [a, b) is cut at its document's cut (a no-op when its piece already lies on one
  // side, i.e. for every scheduler that keeps the split's pieces).
  Schedule whole;
  std::array<Schedule, 2> halves;
  whole.batch = out.split.batch;
  for (auto& h : halves) h.batch = out.split.batch;
  for (const TaskPlacement& t : sched.tasks) {
    const int64_t c = out.split.cut_of(t.doc);
    TaskPlacement a = t, b = t;
    a.q_end = std::min(t.q_end, c);
    b.q_begin = std::max(t.q_begin, c);
    if (a.q_end > a.q_begin) {
      halves[0].tasks.push_back(a);
      whole.tasks.push_back(a);
    }
    if (b.q_end > b.q_begin) {
      halves[1].tasks.push_back(b);
      whole.tasks.push_back(b);
    }
  }
  DISTCA_ASSIGN_OR_RETURN(out.full, build_plan(whole, input, spec, options));
  for (size_t x = 0; x < 2; ++x) {
    DISTCA_ASSIGN_OR_RETURN(out.nano[x], build_plan(halves[x], input, spec, options));
  }
  return out;
}

Status gather_trace(comm::Communicator& comm, const std::vector<TraceEvent>& mine,
                    std::vector<TraceEvent>* out) {
  const std::vector<std::byte> bytes = pack_trace_events(mine);
  const int64_t my_size = static_cast<int64_t>(bytes.size());
  DISTCA_ASSIGN_OR_RETURN(std::vector<int64_t> sizes, comm.all_gather_value(my_size));
  const size_t n = static_cast<size_t>(comm.size());
  std::vector<size_t> sc(n, 0), sd(n, 0), rc(n, 0), rd(n, 0);
  sc[0] = bytes.size();
  std::vector<std::byte> recv;
  if (comm.rank() == 0) {
    size_t off = 0;
    for (size_t p = 0; p < n; ++p) {
      rc[p] = static_cast<size_t>(sizes[p]);
      rd[p] = off;
      off += rc[p];
    }
    recv.resize(off);
  }
  DISTCA_RETURN_IF_ERROR(comm.all_to_all_v({bytes.data(), sc, sd, recv.data(), rc, rd}));
  if (comm.rank() != 0) return Status::ok_status();
  out->clear();
  for (size_t p = 0; p < n; ++p) {
    DISTCA_ASSIGN_OR_RETURN(auto ev, unpack_trace_events(std::span<const std::byte>(recv.data() + rd[p], rc[p])));
    out->insert(out->end(), ev.begin(), ev.end());
  }
  return Status::ok_status();
}

}  // namespace distca::runtime
