// PeerVector<T>: a [ranks] vector of per-peer values that stores only the peers that were set.
//
// Why: every rank's exchange layout is indexed by peer, and a dense [ranks] vector per rank
// makes a plan quadratic in ranks (8192 ranks: ~34 GB for layouts that are almost all zeros,
// since a rank talks to a handful of peers). A PeerVector costs O(peers set) instead, while
// reading like the dense vector it replaces: size() is the number of ranks and operator[]
// returns the value of any peer (T{} for one never set).
//
// Contract:
//   * Entries are kept sorted by peer; entries() lists them ascending. A peer may hold an
//     explicitly set T{} (it still compares equal to an unset one).
//   * operator== compares values peer by peer (size included), so set-to-default and unset
//     are the same vector, as they were when the vector was dense.
//   * Converting to std::vector<T> (dense(), or implicitly for consumers written against the
//     dense layout, such as the runtime, which needs only its own rank's O(ranks) view)
//     materializes every peer.
//   * mut(p) inserts p when absent: O(log n) to find plus O(n) to insert out of order,
//     O(1) amortized when peers are set in ascending order (the builder's usual order).
//
// Thread safety: a plain value; const methods may be called concurrently.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "distca/core/check.h"

namespace distca {

template <class T>
class PeerVector {
 public:
  using Entry = std::pair<size_t, T>;

  PeerVector() = default;
  explicit PeerVector(size_t size) : size_(size) {}

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // The value of peer p (T{} when never set). Precondition: p < size().
  const T& operator[](size_t p) const {
    DISTCA_CHECK(p < size_);
    const auto it = find(p);
    return it != entries_.end() && it->first == p ? it->second : kDefault;
  }

  // A reference to peer p's value, inserting T{} first when unset. Precondition: p < size().
  T& mut(size_t p) {
    DISTCA_CHECK(p < size_);
    if (entries_.empty() || entries_.back().first < p) return entries_.emplace_back(p, T{}).second;
    auto it = std::lower_bound(entries_.begin(), entries_.end(), p,
                               [](const Entry& e, size_t q) { return e.first < q; });
    if (it == entries_.end() || it->first != p) it = entries_.emplace(it, p, T{});
    return it->second;
  }

  // The peers set, ascending.
  const std::vector<Entry>& entries() const { return entries_; }
  std::vector<Entry>& entries_mut() { return entries_; }

  std::vector<T> dense() const {
    std::vector<T> out(size_);
    for (const auto& [p, v] : entries_) out[p] = v;
    return out;
  }
  // NOLINTNEXTLINE(google-explicit-constructor): keeps dense-layout consumers unchanged.
  operator std::vector<T>() const { return dense(); }

  bool operator==(const PeerVector& o) const {
    if (size_ != o.size_) return false;
    auto a = entries_.begin(), b = o.entries_.begin();
    while (a != entries_.end() || b != o.entries_.end()) {
      if (b == o.entries_.end() || (a != entries_.end() && a->first < b->first)) {
        if (!(a->second == kDefault)) return false;
        ++a;
      } else if (a == entries_.end() || b->first < a->first) {
        if (!(b->second == kDefault)) return false;
        ++b;
      } else {
        if (!(a->second == b->second)) return false;
        ++a, ++b;
      }
    }
    return true;
  }

 private:
  typename std::vector<Entry>::const_iterator find(size_t p) const {
    return std::lower_bound(entries_.begin(), entries_.end(), p,
                            [](const Entry& e, size_t q) { return e.first < q; });
  }

  static inline const T kDefault{};
  size_t size_ = 0;
  std::vector<Entry> entries_;
};

}  // namespace distca
