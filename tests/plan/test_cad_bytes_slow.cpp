// Slow checks of `cad`'s bytes on batches like `distca bench plan`'s (label `slow`): at most
// the bytes of `cad-symmetric` on every batch, and never more bytes at a wider tolerance,
// over a larger sweep than test_cad_monotone's. Bytes recounted by compute_traffic.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "distca/core/specs.h"
#include "distca/data/workload.h"
#include "distca/plan/cad.h"
#include "distca/plan/traffic.h"

namespace distca {
namespace {

ScheduleOptions opts(double tol) {
  ScheduleOptions o;
  o.model = *model_preset("llama-8b");
  o.tolerance = tol;
  return o;
}

int64_t bytes_of(const Result<Schedule>& s, const Batch& b) {
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  if (!s.ok()) return 0;
  return compute_traffic(DocumentIndex(b), s->tasks, row_bytes(opts(0).model, 2)).bytes.forward();
}

std::vector<Batch> bench_batches(const char* dist, int64_t servers, int64_t tokens, int64_t count) {
  WorkloadOptions w;
  w.dist = dist;
  w.ranks = servers;
  w.tokens_per_rank = tokens;
  w.batches = count;
  w.seed = 42;
  auto bs = make_batches(w);
  EXPECT_TRUE(bs.ok()) << bs.status().to_string();
  return bs.ok() ? *bs : std::vector<Batch>{};
}

TEST(CadBytesSlow, AtMostSymmetricOnEveryBenchBatch) {
  for (const char* dist : {"pretrain", "prolong"}) {
    for (const int64_t servers : {8, 16, 32, 64, 128}) {
      for (const int64_t tokens : {int64_t{128} << 10, int64_t{512} << 10}) {
        const auto bs = bench_batches(dist, servers, tokens, 30);
        for (size_t i = 0; i < bs.size(); ++i) {
          CadStats a, s;
          const int64_t cad = bytes_of(schedule_cad(bs[i], opts(0.05), &a), bs[i]);
          const int64_t sym = bytes_of(schedule_cad_symmetric(bs[i], opts(0.05), &s), bs[i]);
          EXPECT_TRUE(a.balanced);
          EXPECT_LE(cad, sym) << dist << " " << servers << " x " << tokens << " batch " << i;
        }
      }
    }
  }
}

TEST(CadBytesSlow, NeverMoreBytesAtAWiderTolerance) {
  static const double kTols[] = {0.0, 0.01, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3, 0.5};
  for (const char* dist : {"pretrain", "prolong"}) {
    for (const int64_t servers : {8, 32}) {
      const auto bs = bench_batches(dist, servers, int64_t{128} << 10, 20);
      for (size_t i = 0; i < bs.size(); ++i) {
        std::vector<int64_t> bytes;
        std::vector<bool> balanced;
        for (const double t : kTols) {
          CadStats st;
          bytes.push_back(bytes_of(schedule_cad(bs[i], opts(t), &st), bs[i]));
          balanced.push_back(st.balanced);
        }
        for (size_t a = 0; a < bytes.size(); ++a) {
          for (size_t b = a + 1; b < bytes.size() && balanced[a]; ++b) {
            EXPECT_LE(bytes[b], bytes[a]) << dist << " " << servers << " batch " << i << " tolerances " << kTols[a]
                                          << " < " << kTols[b];
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace distca
