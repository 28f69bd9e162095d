// A communicator over a subset of another communicator's ranks (MPI_Comm_split's role, or an
// NCCL sub-communicator): a pipeline stage's data-parallel group runs its CA dispatcher and
// its gradient all-reduce on one, while the stages run at different times.
//
// Built on the parent's point-to-point calls (communicator.h, start_send / start_recv), so it
// works on every backend that has them and needs nothing from the backend itself:
// all_to_all_v is one send and one receive per member (zero-byte ones included, so a count
// mismatch is an error on both sides, as on the parent), the self-block a memcpy. Every
// collective of the base class (barrier, broadcast, all_gather, the deterministic
// all_reduce_sum) runs on top of it, so a group of n ranks gives bitwise what a parent of the
// same n ranks would.
//
// Matching: all of a group's messages carry one tag (`tag`); the parent matches point-to-point
// messages first in, first out per (peer, tag), and the collective contract (every member
// calls the same collectives in the same order) makes the k-th exchange of every member
// belong together. Distinct groups sharing members need distinct tags, and the tag must not
// be used by any other point-to-point traffic between the members.
//
// Failure: fail() fails the parent (the whole job, as for any collective); a failed parent
// rank ends the group's pending waits with the parent's error.
//
// Thread safety: like the parent (one thread per rank); the parent must outlive the group.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "distca/comm/communicator.h"

namespace distca::comm {

class GroupCommunicator final : public Communicator {
 public:
  // `members`: parent ranks, ascending, without repeats, containing parent.rank(); group rank
  // i is members[i]. Errors (invalid_argument): an empty or unsorted list, a rank outside the
  // parent, the caller not a member, a tag outside [0, kMaxTag].
  static Result<std::unique_ptr<GroupCommunicator>> create(Communicator& parent, std::vector<int> members,
                                                           int tag);
  static constexpr int kMaxTag = kP2pTagLimit - 1;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  std::string backend() const override { return parent_.backend() + "/group"; }
  Status barrier() override;
  Status all_to_all_v(const AllToAllV& a) override;
  Result<std::unique_ptr<Exchange>> start_all_to_all_v(const AllToAllV& a) override;
  // Group ranks mapped to the parent's; tags are the parent's (keep them apart from `tag`).
  Result<std::unique_ptr<Exchange>> start_send(std::span<const std::byte> data, int peer, int tag,
                                               const char* label = nullptr) override;
  Result<std::unique_ptr<Exchange>> start_recv(std::span<std::byte> data, int peer, int tag,
                                               const char* label = nullptr) override;
  void begin_blocking() override { parent_.begin_blocking(); }
  void end_blocking() override { parent_.end_blocking(); }
  void fail(const Status& cause) override { parent_.fail(cause); }

 private:
  GroupCommunicator(Communicator& parent, std::vector<int> members, int rank, int tag)
      : parent_(parent), members_(std::move(members)), rank_(rank), tag_(tag) {}
  Communicator& parent_;
  std::vector<int> members_;
  int rank_ = 0;
  int tag_ = 0;
};

}  // namespace distca::comm
