// One decoder layer's tensor-parallel forward and backward (model/tensor_parallel.h) with the
// TP collectives blocking (TpStep::overlap false) against overlapped with the layer's own
// products (true), paired repeat by repeat on the same inputs (issue 29). Under `mpirun -np T`
// (one TP group of every rank) at bench train's model shapes (width 512, 8 heads, 4 KV heads
// of 64, ffn 1344) over ROWS rows (default 4096: a pingpong nano-batch of bench train's 8192
// tokens), every repeat runs the layer's four TP functions (model/tp_layer_harness.h; the attention left out:
// its inputs are fixed random values) once per mode, in alternating order, after a barrier.
// Per mode it prints the medians over repeats of rank 0's
//   layer  wall time of the four calls, and
//   comm   its time inside the TP communicator's calls: a blocking collective whole, an
//          overlapped one's test() and wait() (src/train/timed_comm.h, as the trainer counts
//          StepMetrics::tp_comm_s),
// and the bytes rank 0 sent. The two modes' outputs must be the same bits (checked, rank 0).
//   mpirun --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1 -np 2
//     build/release/bench/bench_tp_overlap [ROWS REPEATS [MAX_POLL_US [WIDTH]]]   (default 4096 9;
//     MAX_POLL_US: the progress thread's longest pause, MpiOptions::max_poll_interval_us, 0 the
//     trainer's; WIDTH: bench train's --width, heads and ffn following it as there, default 512)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "distca/comm/group.h"
#include "distca/comm/mpi.h"
#include "distca/model/tensor_parallel.h"
#include "distca/model/tp_layer_harness.h"
#include "distca/train/bench.h"
#include "train/timed_comm.h"

namespace {

using namespace distca;

[[noreturn]] void die(comm::Communicator* c, const Status& st) {
  std::fprintf(stderr, "bench_tp_overlap: %s\n", st.message().c_str());
  if (c != nullptr) c->fail(st);
  std::exit(1);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  comm::MpiOptions options;  // the trainer's defaults unless MAX_POLL_US is given
  if (argc > 3 && std::atoi(argv[3]) > 0) {
    options.max_poll_interval_us = std::max(options.poll_interval_us, std::atoi(argv[3]));
  }
  auto made = comm::make_mpi_communicator(&argc, &argv, options);
  if (!made.ok()) die(nullptr, made.status());
  comm::Communicator& world = **made;
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 4096;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 9;
  train::BenchOptions shape;
  if (argc > 4) shape.width = std::atoll(argv[4]);
  if (shape.width < shape.head_dim || shape.width % shape.head_dim != 0) {
    if (world.rank() == 0) std::fprintf(stderr, "bench_tp_overlap: WIDTH must be a multiple of 64\n");
    return 2;
  }
  ModelSpec spec = train::bench_spec(shape);
  spec.n_layers = 1;
  if (world.size() < 2 || !model::check_tp(spec, world.size()).ok() || rows < world.size() || repeats <= 0) {
    if (world.rank() == 0) {
      std::fprintf(stderr, "bench_tp_overlap: needs 2, 4 or 8 ranks and ROWS >= ranks, REPEATS > 0\n");
    }
    return 2;
  }
  std::vector<int> members(static_cast<size_t>(world.size()));
  for (int i = 0; i < world.size(); ++i) members[static_cast<size_t>(i)] = i;
  auto group = comm::GroupCommunicator::create(world, members, 7);
  if (!group.ok()) die(&world, group.status());
  train::TimedCommunicator tp(**group);
  model::TpLayerHarness layer(spec, tp.size(), tp.rank(), rows);
  std::vector<double> wall[2], comm_s[2];
  int64_t bytes[2] = {0, 0};
  bool same_bits = true;
  for (int r = 0; r < repeats; ++r) {
    std::vector<float> bits[2];
    for (int i = 0; i < 2; ++i) {
      const int mode = (r + i) % 2;  // alternate which mode runs first
      if (Status st = tp.barrier(); !st.ok()) die(&tp, st);
      const double c0 = tp.seconds();
      const int64_t b0 = tp.bytes_sent();
      const auto t0 = std::chrono::steady_clock::now();
      if (Status st = layer.run(tp, mode == 1); !st.ok()) die(&tp, st);
      wall[mode].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      comm_s[mode].push_back(tp.seconds() - c0);
      bytes[mode] = tp.bytes_sent() - b0;
      bits[mode] = layer.outputs();
    }
    same_bits = same_bits && bits[0] == bits[1];
  }
  if (world.rank() == 0) {
    std::printf("bench_tp_overlap: TP %d, %lld rows, %d repeats, progress pause up to %d us; rank 0, medians, ms\n",
                tp.size(), static_cast<long long>(rows), repeats, options.max_poll_interval_us);
    std::printf("%-10s %10s %10s %8s %12s\n", "mode", "layer", "comm", "comm %", "sent MiB");
    for (int mode = 0; mode < 2; ++mode) {
      const double l = median(wall[mode]), c = median(comm_s[mode]);
      std::printf("%-10s %10.2f %10.2f %7.1f%% %12.2f\n", mode == 1 ? "overlap" : "blocking", 1e3 * l, 1e3 * c,
                  100 * c / l, static_cast<double>(bytes[mode]) / (1 << 20));
    }
    std::printf("outputs: %s\n", same_bits ? "the same bits" : "DIFFERENT bits");
  }
  return same_bits ? 0 : 1;
}
