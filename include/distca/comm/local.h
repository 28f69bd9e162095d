// Backend `local`: n ranks as threads of one process, sharing memory.
//
// Exchanges are pull-based: a rank posts pointers to its send buffer and layout in a shared
// slot (one slot per exchange sequence number); each receiver copies its block out of the
// peer's buffer as soon as the peer has posted, and the sender's wait() returns once every
// peer has copied its block. Blocking collectives are start + wait. Rendezvous use one mutex
// and condition variable per group, so there are no data races (ThreadSanitizer-clean) and
// every wait also watches the group's failure flag.
//
// Point-to-point messages (start_send/start_recv) match in a table of channels keyed by
// (source, destination, tag), apart from the collectives' slots. The side that posts second
// copies the bytes at once (outside the lock), so a message is complete as soon as both sides
// have started it; a size mismatch completes both sides with invalid_argument and copies
// nothing. The group stays usable after a mismatch (the caller decides, as the contract says).
//
// Failure: when a rank fails (fail(), a non-OK return or an exception from its function in
// run_local, or a mismatch detected in a collective), the group is marked failed with the
// first cause; every rank blocked in a collective or a p2p wait wakes and returns
// "rank R failed: CAUSE", and so does every later wait and start. A rank whose function
// returns OK while peers still wait for it in a collective or for its side of a p2p message
// is also a failure ("rank R failed: returned while rank Q waited for it in ...").
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
