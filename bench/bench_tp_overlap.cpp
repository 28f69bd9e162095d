// One decoder layer's tensor-parallel forward and backward (model/tensor_parallel.h) with the
// TP collectives blocking (TpStep::overlap false) against overlapped with the layer's own
// products (true), paired repeat by repeat on the same inputs (issue 29). Under `mpirun -np T`
// (one TP group of every rank) at bench train's model shapes (width 512, 8 heads, 4 KV heads
// of 64, ffn 1344) over ROWS rows (default 4096: a pingpong nano-batch of bench train's 8192
// tokens), every repeat runs the layer's four TP functions (the attention itself left out:
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
#include "distca/core/rng.h"
#include "distca/model/layers.h"
#include "distca/model/tensor_parallel.h"
#include "distca/train/bench.h"
#include "train/timed_comm.h"

namespace {

using namespace distca;

[[noreturn]] void die(comm::Communicator* c, const Status& st) {
  std::fprintf(stderr, "bench_tp_overlap: %s\n", st.message().c_str());
  if (c != nullptr) c->fail(st);
  std::exit(1);
}

std::vector<float> random_vec(int64_t count, uint64_t stream, double scale) {
  Rng rng(7, stream);
  std::vector<float> v(static_cast<size_t>(count));
  for (float& e : v) e = static_cast<float>(scale * rng.normal());
  return v;
}

// One rank's buffers of the layer: fixed inputs, outputs rewritten by every run.
struct Layer {
  model::TpDims d;
  int64_t n = 0, nr = 0;
  std::vector<float> shard, grad, x, rstd1, xn1, q, k, v, o, x_mid, rstd2, xn2, g, u, a, out, dx, d_o, dq, dk, dv,
      cos_t, sin_t;
  Layer(const ModelSpec& spec, int tp, int rank, int64_t rows) : d(model::tp_dims(spec, tp, rank)), n(rows) {
    nr = model::tp_rows(n, tp, rank).size();
    const int64_t h = d.h, qd = d.qd(), kvd = d.kvd(), f = d.f();
    shard = random_vec(d.layer_params(), 1 + static_cast<uint64_t>(rank), 0.05);
    for (int64_t i = 0; i < h; ++i) shard[static_cast<size_t>(i)] += 1.0f;  // attn_norm around 1
    x = random_vec(nr * h, 10 + static_cast<uint64_t>(rank), 1.0);
    o = random_vec(n * qd, 20, 1.0);
    dq = random_vec(n * qd, 21, 1.0);
    dk = random_vec(n * kvd, 22, 1.0);
    dv = random_vec(n * kvd, 23, 1.0);
    cos_t = random_vec(n * d.hd / 2, 24, 1.0);
    sin_t = random_vec(n * d.hd / 2, 25, 1.0);
    rstd1.resize(static_cast<size_t>(nr));
    rstd2 = rstd1;
    xn1.resize(static_cast<size_t>(n * h));
    xn2 = xn1;
    q.resize(static_cast<size_t>(n * qd));
    k.resize(static_cast<size_t>(n * kvd));
    v = k;
    g.resize(static_cast<size_t>(n * f));
    u = a = g;
    x_mid.resize(static_cast<size_t>(nr * h));
    out = dx = x_mid;
    d_o = q;
  }
  // The four TP calls; returns the outputs' bits for the comparison.
  std::vector<float> run(comm::Communicator& tp, bool overlap) {
    const auto w = model::tp_layer_tensors<const float>(d, shard.data());
    grad.assign(shard.size(), 0.0f);
    const auto gw = model::tp_layer_tensors<float>(d, grad.data());
    const model::TpLayerActs<float> acts{x.data(), rstd1.data(), xn1.data(), q.data(), k.data(), v.data(),
                                         o.data(), x_mid.data(), rstd2.data(), xn2.data(), g.data(), u.data(),
                                         a.data(), out.data()};
    model::TpStep<float> s{n, cos_t.data(), sin_t.data(), 1e-5};
    s.overlap = overlap;
    std::vector<float> dqc = dq, dkc = dk;
    Status st = model::tp_attention_in_forward<float>(tp, d, s, w, acts);
    if (st.ok()) st = model::tp_attention_out_mlp_forward<float>(tp, d, s, w, acts);
    std::copy(out.begin(), out.end(), dx.begin());  // d(out): the output itself
    if (st.ok()) st = model::tp_attention_out_mlp_backward<float>(tp, d, s, w, gw, acts, dx.data(), d_o.data());
    if (st.ok()) {
      st = model::tp_attention_in_backward<float>(tp, d, s, w, gw, acts, dqc.data(), dkc.data(), dv.data(), dx.data());
    }
    if (!st.ok()) die(&tp, st);
    std::vector<float> bits = q;
    for (const auto* t : {&out, &dx, &d_o, &grad}) bits.insert(bits.end(), t->begin(), t->end());
    return bits;
  }
};

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
  Layer layer(spec, tp.size(), tp.rank(), rows);
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
      bits[mode] = layer.run(tp, mode == 1);
      wall[mode].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      comm_s[mode].push_back(tp.seconds() - c0);
      bytes[mode] = tp.bytes_sent() - b0;
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
