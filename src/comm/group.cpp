// A communicator over a subset of a parent's ranks, on the parent's point-to-point calls
// (include/distca/comm/group.h).
#include "distca/comm/group.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace distca::comm {
namespace {

// The exchanges of one group all_to_all_v: every member's send and receive.
class GroupExchange final : public Exchange {
 public:
  explicit GroupExchange(std::vector<std::unique_ptr<Exchange>> parts) : parts_(std::move(parts)) {}
  Status wait() override {
    if (done_) return status_;
    // Every part is waited for even after an error, so no buffer is left in use.
    for (auto& p : parts_) {
      Status st = p->wait();
      if (status_.ok() && !st.ok()) status_ = std::move(st);
    }
    done_ = true;
    return status_;
  }
  bool test() override {
    if (done_) return true;
    for (auto& p : parts_) {
      if (!p->test()) return false;
    }
    return true;
  }

 private:
  std::vector<std::unique_ptr<Exchange>> parts_;
  bool done_ = false;
  Status status_;
};

}  // namespace

Result<std::unique_ptr<GroupCommunicator>> GroupCommunicator::create(Communicator& parent, std::vector<int> members,
                                                                     int tag) {
  if (members.empty()) return Status::invalid_argument("group: no members");
  if (tag < 0 || tag > kMaxTag) {
    return Status::invalid_argument("group: tag " + std::to_string(tag) + " outside [0, " + std::to_string(kMaxTag) + "]");
  }
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] < 0 || members[i] >= parent.size()) {
      return Status::invalid_argument("group: member " + std::to_string(members[i]) + " outside the parent's " +
                                      std::to_string(parent.size()) + " ranks");
    }
    if (i > 0 && members[i] <= members[i - 1]) return Status::invalid_argument("group: members must ascend");
  }
  const auto it = std::find(members.begin(), members.end(), parent.rank());
  if (it == members.end()) {
    return Status::invalid_argument("group: parent rank " + std::to_string(parent.rank()) + " is not a member");
  }
  const int rank = static_cast<int>(it - members.begin());
  return std::unique_ptr<GroupCommunicator>(new GroupCommunicator(parent, std::move(members), rank, tag));
}

Status GroupCommunicator::barrier() {
  const std::vector<std::size_t> zeros(members_.size(), 0);
  return all_to_all_v({nullptr, zeros, zeros, nullptr, zeros, zeros}).with_context("group barrier");
}

Status GroupCommunicator::all_to_all_v(const AllToAllV& a) {
  // Waited for at once: the parent's waits drive it (Communicator::begin_blocking).
  parent_.begin_blocking();
  Result<std::unique_ptr<Exchange>> ex = start_all_to_all_v(a);
  Status st = ex.ok() ? (*ex)->wait() : ex.status();
  parent_.end_blocking();
  return st;
}

Result<std::unique_ptr<Exchange>> GroupCommunicator::start_all_to_all_v(const AllToAllV& a) {
  const int n = size();
  DISTCA_RETURN_IF_ERROR(validate_all_to_all_v(a, n));
  const auto me = static_cast<size_t>(rank_);
  if (a.send_counts[me] != a.recv_counts[me]) {
    return Status::invalid_argument("group all_to_all_v: rank " + std::to_string(rank_) + " sends " +
                                    std::to_string(a.send_counts[me]) + " bytes to itself but expects " +
                                    std::to_string(a.recv_counts[me]));
  }
  std::vector<std::unique_ptr<Exchange>> parts;
  parts.reserve(2 * static_cast<size_t>(n));
  // Receives first, then sends, each in ascending member order: the same order on every member.
  for (int p = 0; p < n; ++p) {
    if (p == rank_) continue;
    const auto i = static_cast<size_t>(p);
    std::span<std::byte> dst(a.recv == nullptr ? nullptr : a.recv + a.recv_displs[i], a.recv_counts[i]);
    DISTCA_ASSIGN_OR_RETURN(auto r, parent_.start_recv(dst, members_[i], tag_, a.label));
    parts.push_back(std::move(r));
  }
  for (int p = 0; p < n; ++p) {
    if (p == rank_) continue;
    const auto i = static_cast<size_t>(p);
    std::span<const std::byte> src(a.send == nullptr ? nullptr : a.send + a.send_displs[i], a.send_counts[i]);
    DISTCA_ASSIGN_OR_RETURN(auto s, parent_.start_send(src, members_[i], tag_, a.label));
    parts.push_back(std::move(s));
  }
  if (a.send_counts[me] > 0) std::memcpy(a.recv + a.recv_displs[me], a.send + a.send_displs[me], a.send_counts[me]);
  return std::unique_ptr<Exchange>(new GroupExchange(std::move(parts)));
}

Result<std::unique_ptr<Exchange>> GroupCommunicator::start_send(std::span<const std::byte> data, int peer, int tag,
                                                                  const char* label) {
  DISTCA_RETURN_IF_ERROR(validate_p2p("start_send", data.data(), data.size(), peer, tag, rank_, size()));
  return parent_.start_send(data, members_[static_cast<size_t>(peer)], tag, label);
}

Result<std::unique_ptr<Exchange>> GroupCommunicator::start_recv(std::span<std::byte> data, int peer, int tag,
                                                                  const char* label) {
  DISTCA_RETURN_IF_ERROR(validate_p2p("start_recv", data.data(), data.size(), peer, tag, rank_, size()));
  return parent_.start_recv(data, members_[static_cast<size_t>(peer)], tag, label);
}

}  // namespace distca::comm
