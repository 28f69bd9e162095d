// Vocabulary parallelism (model/tensor_parallel.h): the split cross-entropy and the split
// embedding against the unsharded layers.h functions, on TP 2 and TP 3 (an uneven split of the
// 37-token vocabulary), including a range of the step whose rows the ranks share unevenly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <vector>

#include "distca/comm/local.h"
#include "distca/core/rng.h"
#include "distca/model/layers.h"
#include "distca/model/tensor_parallel.h"

namespace distca::model {
namespace {

constexpr int64_t kVocab = 37, kHidden = 8, kRows = 13;

// A TP rank's vocabulary share (only the fields the vocabulary functions read).
TpDims vocab_dims(int tp, int rank) {
  TpDims d;
  d.tp = tp;
  d.rank = rank;
  d.h = kHidden;
  d.vocab = even_split(kVocab, tp, rank);
  return d;
}

template <class T>
std::vector<T> random_vec(int64_t count, uint64_t stream, double scale) {
  Rng rng(99, stream);
  std::vector<T> v(static_cast<size_t>(count));
  for (T& e : v) e = static_cast<T>(scale * rng.normal());
  return v;
}

// Targets in [0, vocab) with every fourth row -1 (a document's last token).
std::vector<int32_t> targets() {
  Rng rng(5, 1);
  std::vector<int32_t> t(kRows);
  for (int64_t i = 0; i < kRows; ++i) {
    t[static_cast<size_t>(i)] = i % 4 == 3 ? -1 : static_cast<int32_t>(rng.next_u64() % kVocab);
  }
  return t;
}

// Loss of every row and d(logits) of the rank's columns on TP `tp` against cross_entropy_*.
template <class T>
void check_cross_entropy(int tp, double tol) {
  const std::vector<T> logits = random_vec<T>(kRows * kVocab, 1, 3.0);
  const std::vector<int32_t> tg = targets();
  std::vector<T> ref_loss(kRows), ref_grad(logits.size());
  cross_entropy_forward<T>(ref_loss.data(), logits.data(), tg.data(), kRows, kVocab);
  cross_entropy_backward<T>(ref_grad.data(), logits.data(), tg.data(), kRows, kVocab, 0.25);
  std::mutex mu;
  const Status st = comm::run_local(tp, [&](comm::Communicator& c) -> Status {
    const TpDims d = vocab_dims(tp, c.rank());
    const int64_t vr = d.vocab.size();
    std::vector<T> mine(static_cast<size_t>(kRows * vr)), loss(kRows);
    for (int64_t t = 0; t < kRows; ++t) {
      std::copy_n(logits.data() + t * kVocab + d.vocab.begin, vr, mine.data() + t * vr);
    }
    std::vector<double> stats(2 * kRows);
    DISTCA_RETURN_IF_ERROR(
        tp_vocab_cross_entropy_forward<T>(c, d, kRows, mine.data(), tg.data(), loss.data(), stats.data()));
    tp_vocab_cross_entropy_backward<T>(d, kRows, mine.data(), mine.data(), stats.data(), tg.data(), 0.25);
    std::lock_guard<std::mutex> lock(mu);
    for (int64_t t = 0; t < kRows; ++t) {
      const auto i = static_cast<size_t>(t);
      EXPECT_NEAR(loss[i], ref_loss[i], tol * std::abs(ref_loss[i])) << "tp " << tp << " row " << t;
      for (int64_t j = 0; j < vr; ++j) {
        const T want = ref_grad[static_cast<size_t>(t * kVocab + d.vocab.begin + j)];
        EXPECT_NEAR(mine[static_cast<size_t>(t * vr + j)], want, tol * 0.25) << "tp " << tp << " row " << t;
      }
    }
    return Status::ok_status();
  });
  EXPECT_TRUE(st.ok()) << st.to_string();
}

TEST(TensorParallelVocab, CrossEntropyMatchesUnsharded) {
  for (int tp : {2, 3}) {
    check_cross_entropy<double>(tp, 1e-14);
    check_cross_entropy<float>(tp, 1e-6);
  }
}

// The embedding of a range of the step: each rank's own rows of the range hold exactly the
// unsharded lookup, and the gradient each rank adds to its vocabulary rows is exactly the
// unsharded one's rows (the same row order).
TEST(TensorParallelVocab, EmbeddingMatchesUnshardedBitwise) {
  const std::vector<float> emb = random_vec<float>(kVocab * kHidden, 2, 1.0);
  const std::vector<float> dx = random_vec<float>(kRows * kHidden, 3, 1.0);
  std::vector<int32_t> tokens(kRows);
  for (int64_t t = 0; t < kRows; ++t) tokens[static_cast<size_t>(t)] = static_cast<int32_t>((7 * t + 3) % kVocab);
  tokens[5] = tokens[9];  // a repeated token: its gradient sums two rows
  std::vector<float> ref_demb(emb.size(), 0.0f);
  // Rows [4, 11) of a step of kRows rows (the ranks' shares of that range are uneven).
  const int64_t first = 4, n = 7;
  for (int64_t t = first; t < first + n; ++t) {
    for (int64_t k = 0; k < kHidden; ++k) {
      ref_demb[static_cast<size_t>(tokens[static_cast<size_t>(t)] * kHidden + k)] +=
          dx[static_cast<size_t>(t * kHidden + k)];
    }
  }
  for (int tp : {2, 3}) {
    std::mutex mu;
    int64_t rows_seen = 0;
    const Status st = comm::run_local(tp, [&](comm::Communicator& c) -> Status {
      const TpDims d = vocab_dims(tp, c.rank());
      TpStep<float> s;
      s.n = n;
      s.total = kRows;
      s.first = first;
      const RowRange own = tp_range_rows(s, tp, c.rank());
      EXPECT_EQ(own.begin + first, std::clamp(tp_rows(kRows, tp, c.rank()).begin, first, first + n));
      std::vector<float> x(static_cast<size_t>(own.size() * kHidden));
      std::vector<float> shard(emb.begin() + d.vocab.begin * kHidden, emb.begin() + d.vocab.end * kHidden);
      DISTCA_RETURN_IF_ERROR(tp_embedding_forward<float>(c, d, s, shard.data(), tokens.data() + first, x.data()));
      std::vector<float> demb(shard.size(), 0.0f);
      DISTCA_RETURN_IF_ERROR(tp_embedding_backward<float>(
          c, d, s, tokens.data() + first, dx.data() + (first + own.begin) * kHidden, demb.data()));
      std::lock_guard<std::mutex> lock(mu);
      rows_seen += own.size();
      for (int64_t t = 0; t < own.size(); ++t) {
        const int32_t tok = tokens[static_cast<size_t>(first + own.begin + t)];
        EXPECT_TRUE(std::equal(x.begin() + t * kHidden, x.begin() + (t + 1) * kHidden, emb.begin() + tok * kHidden));
      }
      EXPECT_TRUE(std::equal(demb.begin(), demb.end(), ref_demb.begin() + d.vocab.begin * kHidden)) << c.rank();
      return Status::ok_status();
    });
    EXPECT_TRUE(st.ok()) << st.to_string();
    EXPECT_EQ(rows_seen, n) << "tp " << tp;  // the ranks' shares cover the range once
  }
}

}  // namespace
}  // namespace distca::model
