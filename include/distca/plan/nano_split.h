// The split of a micro-batch into two nano-batches for ping-pong (runtime/pingpong.h,
// docs/runtime.md "Nano-batch split").
//
// Causality first. Nano-batch 0 runs its pre-CA and dispatch before nano-batch 1's, so its
// attention may not need K/V of nano-1 rows (they would arrive only with nano 1's dispatch).
// So nano 0 is a PREFIX [0, cut) of every document and nano 1 the rest [cut, L): nano 0's
// contexts end before the cut, nano 1 reads nano 0's K/V (which exist by then).
//
// The cut. With T = align_rows (the kernel's query tile):
//  - A document of length L >= 2T is cut at the multiple of T nearest to L / sqrt(2) (ties
//    down; none occur, sqrt(2) is irrational), clamped to [T, largest multiple of T below L].
//    [0, c) then holds c(c+1)/2 ~ L^2/4 causal pairs, half the document's: the two nano-batches
//    carry (nearly) equal attention, so nano 1's dispatch has as much of nano 0's attention to
//    hide behind as nano 0's return has of nano 1's (at L / 2 nano 1 would hold 3/4 of the
//    pairs and its dispatch would be exposed). On the grid of T neither half pays tile padding;
//    the price is |pairs(nano 0) - pairs(nano 1)| <= T * L (half a tile off the equal point).
//  - A document shorter than 2T is not cut (each half would be under a tile and pay padding):
//    it goes whole into one nano-batch. After the cut documents are counted, the short ones
//    are taken in decreasing length (ties: lower doc id first) and each is given to the
//    nano-batch with fewer causal pairs on the rank holding the document's first piece (ties:
//    nano 0), the classic greedy: on a rank, it never leaves the imbalance above the larger of
//    the imbalance before and the pairs it adds (plus the pairs of short pieces decided on
//    another rank, i.e. pieces of a short document that starts on an earlier rank).
// Pairs of a piece part = sum over its positions p of (p + 1), counted on the rank holding
// the rows.
//
// Token buffers. In NanoSplit::batch every piece is cut at its document's cut and each rank's
// pieces are reordered: all nano-0 parts first (in the original piece order), then all nano-1
// parts (same order). So each rank's local rows [0, t0) are nano 0 and [t0, t0 + t1) nano 1:
// the model runs each nano-batch's linear layers on one contiguous row range. Tokens per rank
// (and so memory) are unchanged; the two nano-batches need not hold equal tokens (a rank with
// one long document gives ~71% of its rows to nano 0).
//
// A link-aware cut (cut_fraction f in (0, 1], chosen by `--tolerance auto`'s ping-pong
// timeline, plan/auto_tolerance.h): a document of length L >= 2T is cut at the multiple of T
// nearest to f L (ties down), clamped to [T, largest multiple of T below L]; f = 1 puts the
// whole document in nano 0. The cut decides which rows the scheduler can move in which
// nano-batch, and so behind which compute their exchanges run. Short documents as above.
// cut_fraction 0 is the L / sqrt(2) rule.
//
// Determinism: a pure function of (batch, align_rows, cut_fraction). Thread safety: pure function.
#pragma once

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "distca/core/status.h"
#include "distca/data/batch.h"

namespace distca {

struct NanoSplit {
  // The input batch with every piece cut at its document's cut and each rank's pieces
  // reordered: all nano-0 parts first (in the original piece order), then all nano-1 parts
  // (same order). Same documents, same rank totals; Batch::validate() holds.
  Batch batch;
  // [rank] rows of nano 0 (local rows [0, t0)) and nano 1 ([t0, t0 + t1)).
  std::vector<std::array<int64_t, 2>> tokens;
  // (doc id, cut) sorted by doc id; rows [0, cut) are nano 0. cut == doc_len: the whole
  // document is in nano 0; cut == 0: the whole document is in nano 1.
  std::vector<std::pair<int64_t, int64_t>> cuts;
  // The cut of `doc` (binary search). DISTCA_CHECKs that the document exists.
  int64_t cut_of(int64_t doc) const;
};

// The cut of a document of length doc_len >= 2 * align_rows (the first rule above).
// Preconditions: align_rows >= 1, doc_len >= 2 * align_rows.
int64_t nano_cut_long(int64_t doc_len, int64_t align_rows);

// The cut of the link-aware rule. Preconditions: align_rows >= 1, doc_len >= 2 * align_rows,
// 0 < fraction <= 1.
int64_t nano_cut_fraction(int64_t doc_len, int64_t align_rows, double fraction);

// Splits `batch` by the rules above. Errors (kInvalidArgument): an invalid batch (the message
// of Batch::validate), align_rows out of range (check_align_rows, naming --align-rows),
// cut_fraction neither 0 nor in (0, 1]. Deterministic.
Result<NanoSplit> split_nano_batches(const Batch& batch, int64_t align_rows, double cut_fraction = 0);

}  // namespace distca
