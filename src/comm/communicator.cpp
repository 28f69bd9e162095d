#include "distca/comm/communicator.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace distca::comm {

Status validate_all_to_all_v(const AllToAllV& a, int n) {
  const auto un = static_cast<std::size_t>(n);
  auto bad_len = [&](const char* field, std::size_t got) {
    return Status::invalid_argument("all_to_all_v: " + std::string(field) + " has " +
                                    std::to_string(got) + " entries, expected one per rank (" +
                                    std::to_string(n) + ")");
  };
  if (a.send_counts.size() != un) return bad_len("send_counts", a.send_counts.size());
  if (a.send_displs.size() != un) return bad_len("send_displs", a.send_displs.size());
  if (a.recv_counts.size() != un) return bad_len("recv_counts", a.recv_counts.size());
  if (a.recv_displs.size() != un) return bad_len("recv_displs", a.recv_displs.size());
  for (std::size_t p = 0; p < un; ++p) {
    if (a.send_counts[p] > 0 && a.send == nullptr) {
      return Status::invalid_argument("all_to_all_v: send is null but send_counts[" +
                                      std::to_string(p) + "] > 0");
    }
    if (a.recv_counts[p] > 0 && a.recv == nullptr) {
      return Status::invalid_argument("all_to_all_v: recv is null but recv_counts[" +
                                      std::to_string(p) + "] > 0");
    }
  }
  return Status::ok_status();
}

Status validate_p2p(const char* call, const void* data, std::size_t bytes, int peer, int tag,
                    int rank, int n) {
  const std::string where = std::string(call) + " (rank " + std::to_string(rank) + "): ";
  if (peer < 0 || peer >= n) {
    return Status::invalid_argument(where + "peer " + std::to_string(peer) +
                                    " is not a rank of a group of " + std::to_string(n));
  }
  if (tag < 0 || tag >= kP2pTagLimit) {
    return Status::invalid_argument(where + "tag " + std::to_string(tag) + " is outside [0, " +
                                    std::to_string(kP2pTagLimit) + ")");
  }
  if (bytes > 0 && data == nullptr) {
    return Status::invalid_argument(where + "buffer is null but has " + std::to_string(bytes) +
                                    " bytes");
  }
  return Status::ok_status();
}

namespace {

// An AllToAllV over the given buffers and per-peer byte counts and offsets.
AllToAllV exchange_of(const std::byte* send, std::span<const std::size_t> send_counts,
                      std::span<const std::size_t> send_displs, std::byte* recv,
                      std::span<const std::size_t> recv_counts, std::span<const std::size_t> recv_displs) {
  return AllToAllV{send, send_counts, send_displs, recv, recv_counts, recv_displs, nullptr};
}

}  // namespace

// Root sends its bytes to every other rank; a copy, so no determinism concern.
Status Communicator::broadcast(std::span<std::byte> data, int root) {
  const int n = size();
  if (root < 0 || root >= n) {
    return Status::invalid_argument("broadcast: root " + std::to_string(root) +
                                    " is not a rank of a group of " + std::to_string(n));
  }
  const auto un = static_cast<std::size_t>(n);
  std::vector<std::size_t> send_counts(un, 0), recv_counts(un, 0), zeros(un, 0);
  if (rank() == root) {
    for (std::size_t p = 0; p < un; ++p) {
      send_counts[p] = static_cast<int>(p) == root ? 0 : data.size();
    }
  } else {
    recv_counts[static_cast<std::size_t>(root)] = data.size();
  }
  const AllToAllV a = exchange_of(data.data(), send_counts, zeros, data.data(), recv_counts, zeros);
  return all_to_all_v(a);
}

Result<std::vector<int64_t>> Communicator::host_ids() {
  return std::vector<int64_t>(static_cast<std::size_t>(size()), 0);
}

Status Communicator::all_gather(std::span<const std::byte> send, std::span<std::byte> recv) {
  const auto un = static_cast<std::size_t>(size());
  const std::size_t k = send.size();
  if (recv.size() != k * un) {
    return Status::invalid_argument("all_gather: recv has " + std::to_string(recv.size()) +
                                    " bytes, expected size() * send = " +
                                    std::to_string(k * un));
  }
  std::vector<std::size_t> counts(un, k), send_displs(un, 0), recv_displs(un);
  for (std::size_t p = 0; p < un; ++p) recv_displs[p] = p * k;
  const AllToAllV a = exchange_of(send.data(), counts, send_displs, recv.data(), counts, recv_displs);
  return all_to_all_v(a);
}

std::vector<std::size_t> all_gather_displs(std::span<const std::size_t> counts) {
  std::vector<std::size_t> displs(counts.size(), 0);
  for (std::size_t p = 1; p < counts.size(); ++p) displs[p] = displs[p - 1] + counts[p - 1];
  return displs;
}

namespace {

// The checks all_gather_v and reduce_scatter_sum share: counts per rank, the sizes of the
// calling rank's two buffers (in elements).
Status check_variable_blocks(const char* call, std::span<const std::size_t> counts, int n, int rank,
                             std::size_t whole, const char* whole_name, std::size_t mine,
                             const char* mine_name) {
  const std::string at = std::string(call) + " (rank " + std::to_string(rank) + "): ";
  if (counts.size() != static_cast<std::size_t>(n)) {
    return Status::invalid_argument(at + "counts has " + std::to_string(counts.size()) +
                                    " entries, expected one per rank (" + std::to_string(n) + ")");
  }
  std::size_t total = 0;
  for (std::size_t c : counts) total += c;
  if (whole != total) {
    return Status::invalid_argument(at + whole_name + " has " + std::to_string(whole) +
                                    ", expected the sum of counts (" + std::to_string(total) + ")");
  }
  const std::size_t own = counts[static_cast<std::size_t>(rank)];
  if (mine != own) {
    return Status::invalid_argument(at + mine_name + " has " + std::to_string(mine) +
                                    ", expected counts[rank] (" + std::to_string(own) + ")");
  }
  return Status::ok_status();
}

}  // namespace

Status Communicator::all_gather_v(std::span<const std::byte> send, std::span<const std::size_t> counts,
                                  std::span<std::byte> recv) {
  const int n = size();
  DISTCA_RETURN_IF_ERROR(check_variable_blocks("all_gather_v", counts, n, rank(), recv.size(),
                                               "recv", send.size(), "send"));
  const auto un = static_cast<std::size_t>(n);
  const std::vector<std::size_t> recv_displs = all_gather_displs(counts);
  std::vector<std::size_t> send_counts(un, send.size()), zeros(un, 0);
  const AllToAllV a = exchange_of(send.data(), send_counts, zeros, recv.data(), counts, recv_displs);
  return all_to_all_v(a).with_context("all_gather_v");
}

namespace {

// Block p of every rank's data (elements [begin[p], begin[p] + count[p])) goes to rank p, which
// sums the n blocks it receives in rank order into out (count[rank] elements), exactly as
// serial_rank_order_sum does: the reduce-scatter of reduce_scatter_sum and all_reduce_sum.
template <class T>
Status rank_order_reduce_scatter(Communicator& comm, const T* data, const std::vector<std::size_t>& begin,
                                 const std::vector<std::size_t>& count, T* out, const char* what) {
  const auto n = static_cast<std::size_t>(comm.size());
  const std::size_t m = count[static_cast<std::size_t>(comm.rank())];
  // gathered: (n, m) - row p is rank p's block for me.
  std::vector<T> gathered(n * m);
  std::vector<std::size_t> send_counts(n), send_displs(n), recv_counts(n, m * sizeof(T)), recv_displs(n);
  for (std::size_t p = 0; p < n; ++p) {
    send_counts[p] = count[p] * sizeof(T);
    send_displs[p] = begin[p] * sizeof(T);
    recv_displs[p] = p * m * sizeof(T);
  }
  const AllToAllV a = exchange_of(reinterpret_cast<const std::byte*>(data), send_counts, send_displs,
                                  reinterpret_cast<std::byte*>(gathered.data()), recv_counts, recv_displs);
  DISTCA_RETURN_IF_ERROR(comm.all_to_all_v(a).with_context(what));
  std::copy(gathered.begin(), gathered.begin() + static_cast<std::ptrdiff_t>(m), out);
  for (std::size_t p = 1; p < n; ++p) {
    const T* row = gathered.data() + p * m;
    for (std::size_t i = 0; i < m; ++i) out[i] += row[i];
  }
  return Status::ok_status();
}

// Slice p of an array of len elements split over n owners: [begin(p), begin(p+1)).
std::size_t slice_begin(std::size_t len, std::size_t n, std::size_t p) { return len * p / n; }

template <class T>
Status all_reduce_sum_impl(Communicator& comm, std::span<T> data) {
  const auto n = static_cast<std::size_t>(comm.size());
  const auto me = static_cast<std::size_t>(comm.rank());
  const std::size_t len = data.size();
  std::vector<std::size_t> begin(n), count(n);
  for (std::size_t p = 0; p < n; ++p) {
    begin[p] = slice_begin(len, n, p);
    count[p] = slice_begin(len, n, p + 1) - begin[p];
  }
  // Reduce-scatter: my slice, summed in rank order. acc: (my slice's length)
  std::vector<T> acc(count[me]);
  DISTCA_RETURN_IF_ERROR(rank_order_reduce_scatter(comm, data.data(), begin, count, acc.data(), "all_reduce_sum"));

  // All-gather of the summed slices back into data (a copy: no arithmetic).
  std::vector<std::size_t> zeros(n, 0), send_counts(n, count[me] * sizeof(T)), recv_counts(n), recv_displs(n);
  for (std::size_t p = 0; p < n; ++p) {
    recv_counts[p] = count[p] * sizeof(T);
    recv_displs[p] = begin[p] * sizeof(T);
  }
  // My slice to every rank; slice p's length from rank p, into slice p.
  const AllToAllV b = exchange_of(reinterpret_cast<const std::byte*>(acc.data()), send_counts, zeros,
                                  reinterpret_cast<std::byte*>(data.data()), recv_counts, recv_displs);
  return comm.all_to_all_v(b).with_context("all_reduce_sum");
}

}  // namespace

Status Communicator::reduce_scatter_sum(std::span<const float> data, std::span<const std::size_t> counts,
                                        std::span<float> out) {
  DISTCA_RETURN_IF_ERROR(check_variable_blocks("reduce_scatter_sum", counts, size(), rank(), data.size(),
                                               "data", out.size(), "out"));
  const std::vector<std::size_t> count(counts.begin(), counts.end());
  return rank_order_reduce_scatter(*this, data.data(), all_gather_displs(counts), count, out.data(),
                                   "reduce_scatter_sum");
}

Status Communicator::all_reduce_sum(std::span<float> data) {
  return all_reduce_sum_impl(*this, data);
}
Status Communicator::all_reduce_sum(std::span<double> data) {
  return all_reduce_sum_impl(*this, data);
}

}  // namespace distca::comm
