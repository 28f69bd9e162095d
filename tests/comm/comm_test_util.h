// Shared inputs and references of the comm tests (local GTest program and the MPI program).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "distca/comm/communicator.h"
#include "distca/core/rng.h"

namespace distca::comm::testing {

// Bitwise equality (memcmp; never handed the null data() of an empty vector).
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// Rank r's all-reduce input: values spread over many magnitudes, so the order of additions
// changes the rounded result (which is what makes a bitwise test meaningful).
template <class T>
std::vector<T> rank_input(uint64_t seed, int rank, std::size_t len) {
  Rng rng(seed, static_cast<uint64_t>(rank));
  std::vector<T> v(len);
  for (auto& x : v) x = static_cast<T>(rng.normal() * std::pow(10.0, rng.uniform(-4.0, 4.0)));
  return v;
}

// Count matrix and payload shared by every rank: counts[p][q] bytes from p to q, zeros
// included; byte i of block p->q is payload(p, q, i).
inline std::vector<std::vector<std::size_t>> random_counts(uint64_t seed, int n) {
  Rng rng(seed);
  std::vector<std::vector<std::size_t>> c(static_cast<std::size_t>(n),
                                          std::vector<std::size_t>(static_cast<std::size_t>(n)));
  for (auto& row : c) {
    for (auto& x : row) x = rng.bernoulli(0.3) ? 0 : rng.uniform_int(300);
  }
  return c;
}

inline std::byte payload(int p, int q, std::size_t i) {
  return static_cast<std::byte>((p * 131 + q * 31 + static_cast<int>(i) * 7 + 1) & 0xff);
}

inline constexpr std::byte kUntouched{0xAB};

// One rank's buffers for the exchange described by counts: send blocks in peer order with a
// gap of 3 bytes after each; receive blocks in reverse peer order with gaps of 5 bytes (gaps
// must stay untouched).
struct Layout {
  std::vector<std::size_t> send_counts, send_displs, recv_counts, recv_displs;
  std::vector<std::byte> send, recv, expected_recv;
  AllToAllV args() {
    AllToAllV a;
    a.send = send.data();
    a.send_counts = send_counts;
    a.send_displs = send_displs;
    a.recv = recv.data();
    a.recv_counts = recv_counts;
    a.recv_displs = recv_displs;
    return a;
  }
};

inline Layout make_layout(const std::vector<std::vector<std::size_t>>& counts, int me) {
  const int n = static_cast<int>(counts.size());
  const auto um = static_cast<std::size_t>(me);
  Layout l;
  std::size_t off = 0;
  for (int q = 0; q < n; ++q) {
    l.send_counts.push_back(counts[um][static_cast<std::size_t>(q)]);
    l.send_displs.push_back(off);
    off += l.send_counts.back() + 3;
  }
  l.send.assign(off, std::byte{0});
  for (int q = 0; q < n; ++q) {
    const auto uq = static_cast<std::size_t>(q);
    for (std::size_t i = 0; i < l.send_counts[uq]; ++i) {
      l.send[l.send_displs[uq] + i] = payload(me, q, i);
    }
  }
  l.recv_counts.assign(static_cast<std::size_t>(n), 0);
  l.recv_displs.assign(static_cast<std::size_t>(n), 0);
  off = 0;
  for (int p = n - 1; p >= 0; --p) {
    const auto up = static_cast<std::size_t>(p);
    l.recv_counts[up] = counts[up][um];
    l.recv_displs[up] = off;
    off += l.recv_counts[up] + 5;
  }
  l.recv.assign(off, kUntouched);
  l.expected_recv.assign(off, kUntouched);
  for (int p = 0; p < n; ++p) {
    const auto up = static_cast<std::size_t>(p);
    for (std::size_t i = 0; i < l.recv_counts[up]; ++i) {
      l.expected_recv[l.recv_displs[up] + i] = payload(p, me, i);
    }
  }
  return l;
}

// Byte i of the k-th message from src to dst with tag t: distinct per (src, dst, tag, k), so
// a message matched to the wrong receive shows up in its bytes.
inline std::byte p2p_byte(int src, int dst, int tag, int k, std::size_t i) {
  return static_cast<std::byte>((src * 37 + dst * 11 + tag * 5 + k * 101 +
                                 static_cast<int>(i % 251) * 3 + 1) & 0xff);
}

inline std::vector<std::byte> p2p_message(int src, int dst, int tag, int k, std::size_t bytes) {
  std::vector<std::byte> v(bytes);
  for (std::size_t i = 0; i < bytes; ++i) v[i] = p2p_byte(src, dst, tag, k, i);
  return v;
}

// all_gather_v and reduce_scatter_sum on `comm` against references built here from the inputs
// alone: the gather is the rank-major concatenation of every rank's block (its own bytes,
// payload(p, 0, i)); the reduce-scatter's block is serial_rank_order_sum over the ranks' copies
// of that block (rank_input values, whose sum changes with the order). Counts from `seed`,
// zeros included; a wrong-size call is refused on the calling rank.
inline Status check_variable_collectives(Communicator& comm, uint64_t seed) {
  const int n = comm.size();
  const auto me = static_cast<std::size_t>(comm.rank());
  const auto fail = [&](const std::string& what) {
    return Status::internal("seed " + std::to_string(seed) + " rank " + std::to_string(me) + ": " + what);
  };
  Rng rng(seed);
  std::vector<std::size_t> counts(static_cast<std::size_t>(n));
  for (auto& c : counts) c = rng.bernoulli(0.25) ? 0 : rng.uniform_int(400);
  std::size_t total = 0;
  for (std::size_t c : counts) total += c;
  // Gather: rank p sends counts[p] bytes payload(p, 0, i).
  std::vector<std::byte> send(counts[me]), recv(total, kUntouched), want;
  for (std::size_t i = 0; i < send.size(); ++i) send[i] = payload(static_cast<int>(me), 0, i);
  for (int p = 0; p < n; ++p) {
    for (std::size_t i = 0; i < counts[static_cast<std::size_t>(p)]; ++i) want.push_back(payload(p, 0, i));
  }
  DISTCA_RETURN_IF_ERROR(comm.all_gather_v(send, counts, recv));
  if (recv != want) return fail("all_gather_v differs from the concatenation");
  // Reduce-scatter: rank p's data is rank_input(seed, p, total).
  const std::vector<float> data = rank_input<float>(seed, static_cast<int>(me), total);
  std::vector<float> out(counts[me], -1.0f);
  DISTCA_RETURN_IF_ERROR(comm.reduce_scatter_sum(data, counts, out));
  std::size_t begin = 0;
  for (std::size_t p = 0; p < me; ++p) begin += counts[p];
  std::vector<std::vector<float>> blocks;
  for (int p = 0; p < n; ++p) {
    const std::vector<float> x = rank_input<float>(seed, p, total);
    blocks.emplace_back(x.begin() + static_cast<std::ptrdiff_t>(begin),
                        x.begin() + static_cast<std::ptrdiff_t>(begin + counts[me]));
  }
  if (!same_bits(out, serial_rank_order_sum(blocks))) return fail("reduce_scatter_sum differs from the rank-order sum");
  // A wrong size is refused before anything moves (so no other rank is waiting for it).
  std::vector<float> wrong(counts[me] + 1);
  if (comm.reduce_scatter_sum(data, counts, wrong).ok()) return fail("reduce_scatter_sum took a wrong out size");
  std::vector<std::byte> longer(total + 1);
  if (comm.all_gather_v(send, counts, longer).ok()) return fail("all_gather_v took a wrong recv size");
  return comm.barrier();
}

}  // namespace distca::comm::testing
