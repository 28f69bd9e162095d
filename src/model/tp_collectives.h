// The TP collectives over row blocks, blocking (one all-to-all-v) and overlapped with the
// work on the rows (point-to-point on kTpOverlapTag): the machinery behind
// model/tensor_parallel.h's collectives and layer functions ("Overlap" there). Internal to
// the model library (src/model); no state; one thread per rank as the communicator requires.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "distca/comm/communicator.h"
#include "distca/core/check.h"
#include "distca/core/specs.h"
#include "distca/core/status.h"
#include "distca/kernels/blas.h"
#include "distca/model/tensor_parallel.h"

namespace distca::model::tp_detail {

template <class T>
void add_inplace(T* y, const T* x, int64_t count) {
  for (int64_t i = 0; i < count; ++i) y[i] += x[i];
}


// Byte counts and displacements of an exchange of row blocks: block p is rows parts[p].
struct RowBlocks {
  std::vector<size_t> counts, displs;
  RowBlocks(const std::vector<RowRange>& parts, int64_t width, size_t elem) {
    for (const RowRange& r : parts) {
      counts.push_back(static_cast<size_t>(r.size() * width) * elem);
      displs.push_back(static_cast<size_t>(r.begin * width) * elem);
    }
  }
};


// all: (n, width); rank p's rows parts[p] are sent to every other rank.
template <class T>
Status gather_parts(comm::Communicator& tp, T* all, const std::vector<RowRange>& parts,
                    int64_t width) {
  const int size = tp.size(), rank = tp.rank();
  const RowBlocks blocks(parts, width, sizeof(T));
  // The own block is sent to every other rank (send blocks may overlap) and received from no
  // one, so no receive block overlaps it.
  std::vector<size_t> send_counts(static_cast<size_t>(size)), send_displs(send_counts.size());
  std::vector<size_t> recv_counts = blocks.counts;
  const auto self = static_cast<size_t>(rank);
  for (size_t p = 0; p < send_counts.size(); ++p) {
    send_counts[p] = p == self ? 0 : blocks.counts[self];
    send_displs[p] = blocks.displs[self];
  }
  recv_counts[self] = 0;
  comm::AllToAllV a;
  a.send = reinterpret_cast<const std::byte*>(all);
  a.send_counts = send_counts;
  a.send_displs = send_displs;
  a.recv = reinterpret_cast<std::byte*>(all);
  a.recv_counts = recv_counts;
  a.recv_displs = blocks.displs;
  a.label = "tp all_gather";
  return tp.all_to_all_v(a);
}

// The rank-order sum of scatter_parts and the overlapped reduce-scatter: out (count) =
// ((a_0 + a_1) + a_2) + ..., a_p being `own` for p == rank and slot p of `recv` otherwise.
template <class T>
void sum_rank_order(T* out, const T* own, const T* recv, int rank, int size, int64_t count) {
  for (int p = 0; p < size; ++p) {
    const T* addend = p == rank ? own : recv + static_cast<int64_t>(p) * count;
    if (p == 0) {
      std::copy_n(addend, count, out);
    } else {
      add_inplace<T>(out, addend, count);
    }
  }
}

// partial: (n, width) this rank's addend of every row; out: (parts[rank].size(), width) the
// sum over ranks p in rank order of partial_p's rows parts[rank].
template <class T>
Status scatter_parts(comm::Communicator& tp, const T* partial, T* out,
                     const std::vector<RowRange>& parts, int64_t width) {
  const int size = tp.size(), rank = tp.rank();
  const RowBlocks blocks(parts, width, sizeof(T));
  const auto self = static_cast<size_t>(rank);
  const RowRange mine = parts[self];
  const int64_t count = mine.size() * width;
  // Every peer's addend for this rank's rows lands in its own slot of `recv`, then the slots
  // are summed in rank order (the own addend read in place).
  std::vector<T> recv(static_cast<size_t>(count * size));
  std::vector<size_t> recv_counts(blocks.counts.size()), recv_displs(blocks.counts.size());
  for (size_t p = 0; p < recv_counts.size(); ++p) {
    recv_counts[p] = p == self ? 0 : blocks.counts[self];
    recv_displs[p] = p * static_cast<size_t>(count) * sizeof(T);
  }
  std::vector<size_t> send_counts = blocks.counts;
  send_counts[self] = 0;
  comm::AllToAllV a;
  a.send = reinterpret_cast<const std::byte*>(partial);
  a.send_counts = send_counts;
  a.send_displs = blocks.displs;
  a.recv = reinterpret_cast<std::byte*>(recv.data());
  a.recv_counts = recv_counts;
  a.recv_displs = recv_displs;
  a.label = "tp reduce_scatter";
  DISTCA_RETURN_IF_ERROR(tp.all_to_all_v(a));
  sum_rank_order<T>(out, partial + mine.begin * width, recv.data(), rank, size, count);
  return Status::ok_status();
}


// The point-to-point exchanges of one overlapped collective. Every one is completed before
// the collective returns (communicator.h: an exchange must not be dropped unfinished), and
// on a failure the group is failed first so that no wait can hang.
class InFlight {
 public:
  explicit InFlight(comm::Communicator& c) : c_(c) {}
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;
  ~InFlight() { DISTCA_CHECK_MSG(all_done_, "an overlapped TP collective left an exchange unfinished"); }

  // Starts a send (is_send) or a receive of `count` elements at `data` with rank `peer`;
  // returns its slot. On a start failure: fails the group and completes the rest.
  template <class T>
  Result<size_t> start(bool is_send, T* data, int64_t count, int peer, const char* label) {
    const auto bytes = static_cast<size_t>(count) * sizeof(T);
    Result<std::unique_ptr<comm::Exchange>> ex =
        is_send ? c_.start_send(std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), bytes),
                                peer, kTpOverlapTag, label)
                : c_.start_recv(std::span<std::byte>(reinterpret_cast<std::byte*>(data), bytes), peer,
                                kTpOverlapTag, label);
    if (!ex.ok()) return abort(ex.status());
    ex_.push_back(std::move(*ex));
    all_done_ = false;
    return ex_.size() - 1;
  }
  bool test(size_t slot) { return ex_[slot]->test(); }
  // Waits for one exchange; on its failure fails the group and completes the rest.
  Status wait(size_t slot) {
    Status st = ex_[slot]->wait();
    return st.ok() ? st : abort(st);
  }
  Status wait_all() {
    for (auto& e : ex_) {
      if (Status st = e->wait(); !st.ok()) return abort(st);
    }
    all_done_ = true;
    return Status::ok_status();
  }

 private:
  Status abort(const Status& cause) {
    c_.fail(cause);
    for (auto& e : ex_) (void)e->wait();
    all_done_ = true;
    return cause;
  }
  comm::Communicator& c_;
  std::vector<std::unique_ptr<comm::Exchange>> ex_;
  bool all_done_ = true;
};

// The row tiles of the model's products (gemm_tiled: kernels::kGemmTileRows rows) over n rows.
// The overlapped collectives run their products on whole tiles only: a product over fewer rows
// than a tile computes some elements with another kernel path (OpenBLAS, Haswell kernels: a
// row split inside a tile changes 6-13% of the elements by rounding), while a product over
// whole tiles makes the very BLAS calls of the one product over all n rows, so the overlapped
// path has the blocking path's bits.
class RowTiles {
 public:
  explicit RowTiles(int64_t n) : n_(n), done_(static_cast<size_t>((n + kTile - 1) / kTile), false) {}
  // Runs rows(r) on every tile not yet done that ready(tile rows) accepts, runs of consecutive
  // tiles merged into one call.
  template <class Ready, class Rows>
  void run(Ready&& ready, Rows&& rows) {
    int64_t run_begin = -1;
    for (size_t i = 0; i <= done_.size(); ++i) {
      const int64_t b = static_cast<int64_t>(i) * kTile;
      const bool take = i < done_.size() && !done_[i] && ready(RowRange{b, std::min(n_, b + kTile)});
      if (take) {
        done_[i] = true;
        if (run_begin < 0) run_begin = b;
      } else if (run_begin >= 0) {
        rows(RowRange{run_begin, std::min(n_, b)});
        run_begin = -1;
      }
    }
  }

 private:
  static constexpr int64_t kTile = kernels::kGemmTileRows;
  int64_t n_;
  std::vector<bool> done_;
};

inline bool meets(RowRange a, RowRange b) { return std::max(a.begin, b.begin) < std::min(a.end, b.end); }

// An all-gather of the row blocks parts[p] of all (n, width) overlapped with the work on
// them: rows(r) runs on the row tiles (RowTiles) as their rows become available: the ones
// within the rank's own block first, then as each peer's block arrives (whichever test()
// reports first, else the next in the order rank - 1, rank - 2, ...) the tiles it completes.
// Every rank sends its block straight to every other rank (all-pairs: T - 1 messages of its
// block, as the blocking gather_parts). Blocking (overlap false): gather_parts, then
// rows({0, n}) once. Each row's work depends on that row only, so the order of the calls
// cannot change their results.
template <class T, class Rows>
Status gather_then(comm::Communicator& tp, T* all, const std::vector<RowRange>& parts, int64_t width,
                   bool overlap, Rows&& rows) {
  const int size = tp.size(), rank = tp.rank();
  if (!overlap || size == 1) {
    if (size > 1) DISTCA_RETURN_IF_ERROR(gather_parts<T>(tp, all, parts, width));
    rows(RowRange{parts.front().begin, parts.back().end});
    return Status::ok_status();
  }
  const RowRange mine = parts[static_cast<size_t>(rank)];
  InFlight f(tp);
  std::vector<std::pair<int, size_t>> pending;  // (peer, slot of its receive)
  for (int k = 1; k < size; ++k) {
    const int p = (rank - k + size) % size;
    const RowRange r = parts[static_cast<size_t>(p)];
    if (r.size() == 0) continue;
    DISTCA_ASSIGN_OR_RETURN(size_t slot, f.start(false, all + r.begin * width, r.size() * width, p, "tp all_gather"));
    pending.emplace_back(p, slot);
  }
  for (int k = 1; k < size && mine.size() > 0; ++k) {
    DISTCA_RETURN_IF_ERROR(
        f.start(true, all + mine.begin * width, mine.size() * width, (rank + k) % size, "tp all_gather").status());
  }
  std::vector<bool> arrived(static_cast<size_t>(size), false);
  arrived[static_cast<size_t>(rank)] = true;
  RowTiles tiles(parts.back().end);
  auto ready = [&](RowRange t) {
    for (int p = 0; p < size; ++p) {
      if (!arrived[static_cast<size_t>(p)] && meets(parts[static_cast<size_t>(p)], t)) return false;
    }
    return true;
  };
  tiles.run(ready, rows);
  while (!pending.empty()) {
    auto it = std::find_if(pending.begin(), pending.end(), [&](const auto& e) { return f.test(e.second); });
    if (it == pending.end()) {
      it = pending.begin();
      DISTCA_RETURN_IF_ERROR(f.wait(it->second));
    }
    arrived[static_cast<size_t>(it->first)] = true;
    pending.erase(it);
    tiles.run(ready, rows);
  }
  tiles.run([](RowRange) { return true; }, rows);  // blocks of no rows complete no tile
  return f.wait_all();
}

// A reduce-scatter of partial (n, width) overlapped with the work that writes it: rows(r)
// writes partial's rows r (called on whole row tiles, RowTiles); out (parts[rank].size(),
// width) receives the rank-order sum of every rank's partial over the rank's rows (as
// scatter_parts, the same bits). Overlapped: every peer's block is computed (the tiles it
// meets) and sent at once, peers in the order rank + 1, rank + 2, ... (so no two ranks start
// with the same destination), then the rest (the rank's own block), then after() (work that
// needs no exchanged rows: the weight gradients), then the wait and the sum. Blocking:
// rows({0, n}), after(), scatter_parts.
template <class T, class Rows, class After>
Status compute_then_scatter(comm::Communicator& tp, T* partial, T* out, const std::vector<RowRange>& parts,
                            int64_t width, bool overlap, Rows&& rows, After&& after) {
  const int size = tp.size(), rank = tp.rank();
  if (!overlap || size == 1) {
    rows(RowRange{parts.front().begin, parts.back().end});
    after();
    return scatter_parts<T>(tp, partial, out, parts, width);
  }
  const RowRange mine = parts[static_cast<size_t>(rank)];
  const int64_t count = mine.size() * width;
  std::vector<T> recv(static_cast<size_t>(count * size));
  InFlight f(tp);
  for (int p = 0; p < size && count > 0; ++p) {
    if (p == rank) continue;
    DISTCA_RETURN_IF_ERROR(f.start(false, recv.data() + p * count, count, p, "tp reduce_scatter").status());
  }
  RowTiles tiles(parts.back().end);
  for (int k = 1; k < size; ++k) {
    const int p = (rank + k) % size;
    const RowRange r = parts[static_cast<size_t>(p)];
    if (r.size() == 0) continue;
    tiles.run([&](RowRange t) { return meets(r, t); }, rows);
    DISTCA_RETURN_IF_ERROR(f.start(true, partial + r.begin * width, r.size() * width, p, "tp reduce_scatter").status());
  }
  tiles.run([](RowRange) { return true; }, rows);
  after();
  DISTCA_RETURN_IF_ERROR(f.wait_all());
  sum_rank_order<T>(out, partial + mine.begin * width, recv.data(), rank, size, count);
  return Status::ok_status();
}

}  // namespace distca::model::tp_detail
