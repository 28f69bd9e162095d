// Where a tensor-parallel collective's time goes when it follows compute (issue 29): under
// `mpirun -np 2` (both ranks on one host), per count k of products, every rank runs k sgemms
// of the model's q projection, then the trainer's sequence-parallel all-gather
// (model::tp_all_gather_rows on a GroupCommunicator, as train/trainer.cpp builds the TP
// group). Each rank records when it entered and left every collective on the host's
// monotonic clock (one clock for every process of a host), and the ranks' records are
// gathered afterwards, so each collective splits into
//   wait   the last rank's arrival - this rank's arrival (the peer still computing), and
//   after  this rank's exit - the last arrival (the transfer and the library's overhead).
// k = 0 is back to back, as `distca profile` prices links.tp_collective. If `after` stays at
// the k = 0 figure while `wait` grows with k, the extra time of a collective inside training
// is the peers' skew, not our code or MPI's.
//   mpirun --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1 -np 2
//     build/release/bench/bench_tp_wait [ROWS_PER_RANK WIDTH REPEATS]   (default 4096 512 40)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "distca/comm/group.h"
#include "distca/comm/mpi.h"
#include "distca/kernels/blas.h"
#include "distca/model/tensor_parallel.h"

namespace {

using namespace distca;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

[[noreturn]] void die(comm::Communicator* c, const Status& st) {
  std::fprintf(stderr, "bench_tp_wait: %s\n", st.message().c_str());
  if (c != nullptr) c->fail(st);
  std::exit(1);
}

struct Figures {
  double compute = 0, total = 0, wait = 0, after = 0;  // means over ranks and repeats, seconds
};

// Every rank's (enter, exit) per repeat, gathered; the means of Figures over ranks and repeats.
Figures split(comm::Communicator& c, const std::vector<double>& compute, const std::vector<double>& times) {
  const auto n = static_cast<size_t>(c.size());
  std::vector<double> every(times.size() * n), computes(compute.size() * n);
  if (Status st = c.all_gather(std::as_bytes(std::span(times)), std::as_writable_bytes(std::span(every)));
      !st.ok()) {
    die(&c, st);
  }
  if (Status st = c.all_gather(std::as_bytes(std::span(compute)), std::as_writable_bytes(std::span(computes)));
      !st.ok()) {
    die(&c, st);
  }
  const size_t reps = compute.size();
  Figures f;
  for (size_t i = 0; i < reps; ++i) {
    double last = 0;
    for (size_t r = 0; r < n; ++r) last = std::max(last, every[r * 2 * reps + 2 * i]);
    for (size_t r = 0; r < n; ++r) {
      const double enter = every[r * 2 * reps + 2 * i], exit = every[r * 2 * reps + 2 * i + 1];
      f.compute += computes[r * reps + i];
      f.total += exit - enter;
      f.wait += last - enter;
      f.after += exit - last;
    }
  }
  const double k = static_cast<double>(reps * n);
  return {f.compute / k, f.total / k, f.wait / k, f.after / k};
}

}  // namespace

int main(int argc, char** argv) {
  auto made = comm::make_mpi_communicator(&argc, &argv, {});
  if (!made.ok()) die(nullptr, made.status());
  comm::Communicator& world = **made;
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 4096, width = argc > 2 ? std::atoll(argv[2]) : 512;
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 40;
  if (world.size() < 2 || rows <= 0 || width <= 0 || repeats <= 0) {
    if (world.rank() == 0) std::fprintf(stderr, "bench_tp_wait: needs 2+ ranks and positive ROWS WIDTH REPEATS\n");
    return 2;
  }
  auto hosts = world.host_ids();
  if (!hosts.ok()) die(&world, hosts.status());
  if (std::count(hosts->begin(), hosts->end(), hosts->front()) != static_cast<long>(hosts->size())) {
    if (world.rank() == 0) std::fprintf(stderr, "bench_tp_wait: the ranks must share one host (one clock)\n");
    return 2;
  }
  std::vector<int> members(static_cast<size_t>(world.size()));
  for (int i = 0; i < world.size(); ++i) members[static_cast<size_t>(i)] = i;
  auto group = comm::GroupCommunicator::create(world, members, 7);
  if (!group.ok()) die(&world, group.status());
  comm::Communicator& tp = **group;
  // The q projection of a TP rank at the model's shapes: every row of the sequence, half the heads.
  const int64_t m = rows * tp.size(), q = width / tp.size();
  std::vector<float> x(static_cast<size_t>(m * width), 0.5f), w(static_cast<size_t>(q * width), 0.25f),
      y(static_cast<size_t>(m * q));
  std::vector<float> all(static_cast<size_t>(m * width), 1.0f);
  if (world.rank() == 0) {
    std::printf("bench_tp_wait: %d ranks, all-gather of %lld rows x %lld floats per rank, %d repeats; ms per "
                "collective, mean over ranks\n", tp.size(), static_cast<long long>(rows),
                static_cast<long long>(width), repeats);
    std::printf("%9s %10s %10s %10s %10s\n", "products", "compute", "total", "wait", "after");
  }
  for (const int k : {0, 1, 4, 16}) {
    std::vector<double> compute, times;
    for (int i = -1; i < repeats; ++i) {  // i = -1: warm-up
      const double t0 = now_s();
      for (int j = 0; j < k; ++j) {
        kernels::gemm_tiled<float>(false, true, m, q, width, 1.0f, x.data(), width, w.data(), width, 0.0f, y.data(), q);
      }
      const double enter = now_s();
      if (Status st = model::tp_all_gather_rows<float>(tp, all.data(), m, width); !st.ok()) die(&world, st);
      const double exit = now_s();
      if (i < 0) continue;
      compute.push_back(enter - t0);
      times.push_back(enter);
      times.push_back(exit);
    }
    const Figures f = split(tp, compute, times);
    if (world.rank() == 0) {
      std::printf("%9d %10.3f %10.3f %10.3f %10.3f\n", k, f.compute * 1e3, f.total * 1e3, f.wait * 1e3, f.after * 1e3);
    }
    if (Status st = world.barrier(); !st.ok()) die(&world, st);
  }
  return 0;
}
