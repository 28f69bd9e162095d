// Measurement behind docs/training.md, "Planning ahead" (not a test; built on request:
// `cmake --build build/release --target plan_broadcast_measure`): what each rank pays to make
// a step's plans itself, against what one rank planning and broadcasting them would cost the
// others - the plans' size in a compact binary form (CBOR of plan_to_json, every field of the
// batch and the three plans), the time to encode and decode that form, and a broadcast of that
// many bytes over the local backend (rank threads) and, under mpirun, over MPI. With --tp the
// plan is a TP rank's (its heads) over the data-parallel replicas, and the local broadcast
// runs over the TP group's ranks: what "once per TP group and shared" would cost.
//
//   build/release/tests/train/plan_broadcast_measure            # local backend
//   mpirun -np 2 build/release/tests/train/plan_broadcast_measure --mpi
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "distca/comm/local.h"
#include "distca/comm/mpi.h"
#include "distca/plan/plan_json.h"
#include "distca/runtime/dispatcher.h"
#include "distca/train/config.h"
#include "distca/train/data.h"
#include "train/planner.h"

namespace distca::train {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Case {
  std::string name;
  TrainConfig config;
};

PlanContext context(const TrainConfig& c, ModelSpec spec) {
  PlanContext ctx;
  ctx.sspec = *parse_scheduler(c.scheduler);
  spec.n_heads /= c.tp;  // a TP rank plans its heads (as the trainer's set_up_rank)
  spec.n_kv_heads /= c.tp;
  ctx.sopt.model = spec;
  ctx.sopt.dtype_bytes = 4;
  ctx.sopt.tolerance = c.tolerance;
  runtime::AttentionDims dims;
  dims.n_heads = static_cast<int32_t>(spec.n_heads);
  dims.n_kv_heads = static_cast<int32_t>(spec.n_kv_heads);
  dims.head_dim = static_cast<int32_t>(spec.head_dim);
  ctx.sopt.align_rows = runtime::query_tile_rows(dims);
  ctx.dp = c.dp();
  return ctx;
}

nlohmann::json batch_json(const Batch& b) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& pieces : b.per_rank) {
    nlohmann::json r = nlohmann::json::array();
    for (const Piece& p : pieces) r.push_back({p.doc, p.offset, p.len, p.doc_len});
    j.push_back(std::move(r));
  }
  return j;
}

// Median seconds of `reps` broadcasts of `bytes` from rank 0, as rank 0 sees them (a barrier
// before each, so every rank starts together).
double broadcast_seconds(comm::Communicator& c, int64_t bytes, int reps) {
  std::vector<std::byte> buf(static_cast<size_t>(bytes));
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    if (!c.barrier().ok()) return -1;
    const auto t0 = Clock::now();
    if (!c.broadcast(buf, 0).ok()) return -1;
    t.push_back(since(t0));
  }
  return median(t);
}

int run(bool mpi) {
  std::vector<Case> cases;
  cases.push_back({"default (2 x 256, pretrain, max 128)", TrainConfig{}});
  TrainConfig big;
  big.ranks = 8;
  big.tokens_per_rank = 4096;
  big.dist = "prolong";
  big.max_doc_len = 0;
  cases.push_back({"8 x 4096, prolong", big});
  big.ranks = 64;
  big.tokens_per_rank = 16384;
  cases.push_back({"64 x 16384, prolong", big});
  TrainConfig tp = TrainConfig{};
  tp.ranks = 4;
  tp.tp = 2;
  cases.push_back({"default, tp 2 (2 replicas x 2)", tp});
  big.ranks = 16;
  big.tokens_per_rank = 4096;
  big.tp = 2;
  cases.push_back({"8 x 4096, prolong, tp 2 (8 x 2)", big});

  std::unique_ptr<comm::MpiCommunicator> world;
  if (mpi) {
    auto w = comm::make_mpi_communicator(nullptr, nullptr, {});
    if (!w.ok()) {
      std::fprintf(stderr, "%s\n", w.status().to_string().c_str());
      return 1;
    }
    world = std::move(*w);
  }
  const bool lead = !world || world->rank() == 0;
  if (lead) {
    std::printf("%-38s %10s %10s %12s %12s %14s %14s\n", "batch", "plan ms", "KiB", "encode ms", "decode ms",
                "bcast ms local", mpi ? "bcast ms mpi" : "");
  }
  constexpr int kSteps = 15;
  for (const Case& k : cases) {
    auto spec = k.config.model_spec();
    auto data = DataSource::create(k.config, spec->vocab);
    if (!data.ok()) return 1;
    const PlanContext ctx = context(k.config, *spec);
    std::vector<double> plan_s, enc_s, dec_s, kib;
    for (int64_t step = 0; step < kSteps; ++step) {
      const std::vector<Batch> batches = step_batches(*data, 1, step);
      auto u = plan_unit(ctx, step, 0, batches);
      if (!u.ok()) {
        std::fprintf(stderr, "%s\n", u.status().to_string().c_str());
        return 1;
      }
      plan_s.push_back(u->seconds);
      auto t0 = Clock::now();
      const nlohmann::json j = {batch_json(u->micro->split.batch), plan_to_json(u->micro->full),
                                plan_to_json(u->micro->nano[0]), plan_to_json(u->micro->nano[1])};
      const std::vector<std::uint8_t> bytes = nlohmann::json::to_cbor(j);
      enc_s.push_back(since(t0));
      t0 = Clock::now();
      const nlohmann::json back = nlohmann::json::from_cbor(bytes);
      dec_s.push_back(since(t0));
      if (back.size() != 4) return 1;
      kib.push_back(static_cast<double>(bytes.size()) / 1024.0);
    }
    const auto bytes = static_cast<int64_t>(median(kib) * 1024);
    const int local_ranks = static_cast<int>(k.config.tp > 1 ? k.config.tp : std::min<int64_t>(k.config.ranks, 8));
    double local_bcast = 0;
    if (lead) {
      (void)comm::run_local(local_ranks, [&](comm::Communicator& c) {
        const double t = broadcast_seconds(c, bytes, 21);
        if (c.rank() == 0) local_bcast = t;
        return Status{};
      });
    }
    double mpi_bcast = 0;
    if (world) mpi_bcast = broadcast_seconds(*world, bytes, 21);
    if (lead) {
      char mpi_col[32] = "";
      if (mpi) std::snprintf(mpi_col, sizeof(mpi_col), "%14.3f", 1e3 * mpi_bcast);
      std::printf("%-38s %10.3f %10.1f %12.3f %12.3f %11.3f (%d) %s\n", k.name.c_str(), 1e3 * median(plan_s),
                  median(kib), 1e3 * median(enc_s), 1e3 * median(dec_s), 1e3 * local_bcast, local_ranks, mpi_col);
    }
  }
  return 0;
}

}  // namespace
}  // namespace distca::train

int main(int argc, char** argv) {
  const bool mpi = argc > 1 && std::strcmp(argv[1], "--mpi") == 0;
  return distca::train::run(mpi);
}
