// Backend `local`: n ranks as threads of one process, sharing memory.
//
// Exchanges are pull-based: a rank posts pointers to its send buffer and layout in a shared
// slot (one slot per exchange sequence number); each receiver copies its block out of the
// peer's buffer as soon as the peer has posted, and the sender's wait() returns once every
// peer has copied its block. Blocking collectives are start + wait. Rendezvous use one mutex
// and condition variable per group, so there are no data races (ThreadSanitizer-clean) and
// every wait also watches the group's failure flag.
//
// Failure: when a rank fails (fail(), a non-OK return or an exception from its function in
// run_local, or a mismatch detected in a collective), the group is marked failed with the
// first cause; every rank blocked in a collective wakes and returns
// "rank R failed: CAUSE". A rank whose function returns OK while peers still wait for it in a
// collective is also a failure ("rank R returned while peers were in a collective").
#pragma once

#include <functional>

#include "distca/comm/communicator.h"

namespace distca::comm {

// Runs fn(comm) for ranks 0..n-1, each on its own thread with its own Communicator of a
// fresh group of n ranks, and joins them. Returns OK if every rank returned OK; otherwise the
// first failure as Status::internal("rank R failed: CAUSE"). Precondition-like errors (n < 1)
// come back as invalid_argument. Never hangs on a rank failure: peers blocked in collectives
// are woken with an error.
Status run_local(int n, const std::function<Status(Communicator&)>& fn);

}  // namespace distca::comm
