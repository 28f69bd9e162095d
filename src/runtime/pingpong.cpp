// Ping-pong nano-batches (include/distca/runtime/pingpong.h).
#include "distca/runtime/pingpong.h"

#include <algorithm>
#include <utility>

namespace distca::runtime {

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
