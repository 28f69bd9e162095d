// `distca profile`'s measurements (train/profile.h).
#include "distca/train/profile.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <sstream>
#include <string>
#include <memory>
#include <optional>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "distca/comm/group.h"
#include "distca/core/cgroup.h"
#include "distca/core/clock.h"
#include "distca/core/stats.h"
#include "distca/cost/profiled.h"
#include "distca/kernels/blas.h"
#include "distca/model/profile_elementwise.h"
#include "distca/model/tensor_parallel.h"
#include "distca/model/tp_layer_harness.h"
#include "step.h"
#include "timed_comm.h"

namespace distca::train {
namespace {

using Progress = std::function<void(const std::string&)>;

// Message sizes of the link measurements (bytes per message): latency-bound to bandwidth-bound.
const std::vector<int64_t> kLinkBytes = {64, 1024, 16384, 262144, 1 << 20, 4 << 20};
// measure_comm_cpu: the products timed quiet per repeat, and the transfer's length on the link.
constexpr int kCommCpuQuietCalls = 8;
constexpr double kCommCpuLinkSeconds = 0.5;
constexpr int64_t kCommCpuMinBytes = 1 << 20, kCommCpuMaxBytes = 64 << 20;

// The model the element-wise figures are timed at: the profile's shapes, one layer.
ModelSpec elementwise_spec(const ProfileShape& s) {
  return {"profile", 1, s.hidden, s.n_heads, s.n_kv_heads, s.head_dim, s.ffn, s.vocab};
}

// A barrier for the timed runs (none for one process).
std::function<Status()> barrier_of(comm::Communicator* c) {
  if (c == nullptr) return {};
  return [c] { return c->barrier(); };
}

// The attention cells' sync: every rank's barrier and all-gather (none for one process).
kernels::ProfileSync in_step(comm::Communicator* c) {
  if (c == nullptr) return {};
  return {[c] { return c->barrier(); }, [c](double mine) { return c->all_gather_value(mine); }};
}

// One exchange of every size on every rank at once: the median over repetitions of the
// slowest rank's seconds. all_to_all: `bytes` to every other rank; else a ring: `bytes` to
// rank + 1, from rank - 1.
Result<std::vector<LinkPoint>> measure_links(comm::Communicator& c, bool all_to_all, int repeats) {
  const int n = c.size(), me = c.rank();
  std::vector<LinkPoint> points;
  for (const int64_t bytes : kLinkBytes) {
    const auto b = static_cast<size_t>(bytes);
    std::vector<std::byte> send(b * static_cast<size_t>(n), std::byte{1}), recv(b * static_cast<size_t>(n));
    std::vector<size_t> counts(static_cast<size_t>(n), b), displs(static_cast<size_t>(n));
    for (int p = 0; p < n; ++p) displs[static_cast<size_t>(p)] = b * static_cast<size_t>(p);
    counts[static_cast<size_t>(me)] = 0;  // nothing to self: only off-rank bytes move
    auto once = [&]() -> Status {
      if (all_to_all) {
        // Started and waited for, as the runtime's exchanges are (the progress path included).
        comm::AllToAllV a{send.data(), counts, displs, recv.data(), counts, displs, "profile"};
        DISTCA_ASSIGN_OR_RETURN(auto x, c.start_all_to_all_v(a));
        return x->wait();
      }
      DISTCA_ASSIGN_OR_RETURN(auto r, c.start_recv(std::span(recv.data(), b), (me + n - 1) % n, 7, "profile"));
      DISTCA_ASSIGN_OR_RETURN(auto s, c.start_send(std::span<const std::byte>(send.data(), b), (me + 1) % n, 7, "profile"));
      DISTCA_RETURN_IF_ERROR(s->wait());
      return r->wait();
    };
    DISTCA_RETURN_IF_ERROR(once());  // warm-up (connections, registration)
    std::vector<double> t;
    for (int r = 0; r < repeats; ++r) {
      DISTCA_RETURN_IF_ERROR(c.barrier());
      const double t0 = monotonic_seconds();
      DISTCA_RETURN_IF_ERROR(once());
      const double mine = monotonic_seconds() - t0;
      DISTCA_ASSIGN_OR_RETURN(std::vector<double> all, c.all_gather_value(mine));
      t.push_back(*std::max_element(all.begin(), all.end()));
    }
    points.push_back({bytes, std::max(median(t), kMinTaskSeconds)});
  }
  return points;
}

// Transfers between ranks take CPU from the compute beside them (the progress thread's MPI
// rounds and copies, the kernel's network stack), which the link fits - measured with every
// rank waiting - do not see. Per repeat, on every rank at once: back-to-back products of the
// profile's tokens x hidden x hidden (as a layer's wq forward), timed alone per call, then the
// same products while a ring transfer of `bytes` (to rank + 1, from rank - 1) crosses the
// links, until it is done. What the products lost to it: the elapsed time less the calls it
// held times the quiet call; over the bytes this rank moved (sent + received). Per rank the
// median over repeats, then the mean over ranks, at least 0 (HardwareProfile::comm_cpu).
Result<CommCpuProfile> measure_comm_cpu(comm::Communicator& c, const ProfileShape& shape, const LinkProfile& p2p,
                                        int repeats) {
  const int n = c.size(), me = c.rank();
  const int64_t m = shape.tokens, k = shape.hidden;
  std::vector<float> a(static_cast<size_t>(m * k), 0.5f), b(static_cast<size_t>(k * k), 0.25f),
      out(static_cast<size_t>(m * k));
  auto product = [&] { kernels::gemm<float>(false, false, m, k, k, 1.0f, a.data(), k, b.data(), k, 0.0f, out.data(), k); };
  // About half a second on the link, within [1, 64] MiB.
  const auto bytes = static_cast<size_t>(std::clamp(p2p.bytes_per_second * kCommCpuLinkSeconds,
                                                    static_cast<double>(kCommCpuMinBytes), static_cast<double>(kCommCpuMaxBytes)));
  std::vector<std::byte> send(bytes, std::byte{1}), recv(bytes);
  product();  // warm-up (first touch)
  std::vector<double> per_byte;
  for (int r = 0; r < repeats; ++r) {
    DISTCA_RETURN_IF_ERROR(c.barrier());
    const double q0 = monotonic_seconds();
    for (int i = 0; i < kCommCpuQuietCalls; ++i) product();
    const double quiet = (monotonic_seconds() - q0) / kCommCpuQuietCalls;
    DISTCA_RETURN_IF_ERROR(c.barrier());
    const double t0 = monotonic_seconds();
    DISTCA_ASSIGN_OR_RETURN(auto rx, c.start_recv(std::span(recv.data(), bytes), (me + n - 1) % n, 8, "comm cpu"));
    DISTCA_ASSIGN_OR_RETURN(auto tx, c.start_send(std::span<const std::byte>(send.data(), bytes), (me + 1) % n, 8, "comm cpu"));
    int64_t calls = 0;
    bool sent = false, received = false;
    while (!(sent && received)) {
      product();
      ++calls;
      sent = sent || tx->test();
      received = received || rx->test();
    }
    DISTCA_RETURN_IF_ERROR(tx->wait());
    DISTCA_RETURN_IF_ERROR(rx->wait());
    const double lost = monotonic_seconds() - t0 - static_cast<double>(calls) * quiet;
    per_byte.push_back(lost / (2.0 * static_cast<double>(bytes)));
  }
  DISTCA_ASSIGN_OR_RETURN(std::vector<double> all, c.all_gather_value(median(per_byte)));
  return CommCpuProfile{std::max(0.0, mean_of(all)), static_cast<int64_t>(2 * bytes)};
}

// Rows per rank of the TP collectives' sizes: latency-bound to the profile's whole step (its
// `tokens` rows over a group of kTpProfileGroup), strictly increasing.
std::vector<int64_t> tp_rows_per_rank(int64_t tokens) {
  const int64_t top = std::max<int64_t>(1, tokens / kTpProfileGroup);
  std::vector<int64_t> rows;
  for (const int64_t r : {int64_t{1}, int64_t{16}, int64_t{128}}) {
    if (r < top) rows.push_back(r);
  }
  rows.push_back(top);
  return rows;
}

// The profile's TP groups: kTpProfileGroup consecutive ranks (TP innermost), each a
// GroupCommunicator on `c` with the trainer's tag; a rank past the last whole group holds
// none (it takes part in the barriers only).
struct TpGroup {
  int groups = 0;  // whole groups on `c`
  std::unique_ptr<comm::GroupCommunicator> comm;  // null: not grouped
};
Result<TpGroup> tp_group(comm::Communicator& c) {
  const int g = static_cast<int>(kTpProfileGroup);
  TpGroup t;
  t.groups = c.size() / g;
  if (c.rank() < t.groups * g) {
    std::vector<int> members;
    for (int i = 0; i < g; ++i) members.push_back(c.rank() - c.rank() % g + i);
    DISTCA_ASSIGN_OR_RETURN(t.comm, comm::GroupCommunicator::create(c, std::move(members), kTpTag));
  }
  return t;
}

// The grouped ranks' mean of `mine` (every rank of `c` calls it).
Result<double> grouped_mean(comm::Communicator& c, const TpGroup& t, double mine) {
  DISTCA_ASSIGN_OR_RETURN(std::vector<double> every, c.all_gather_value(mine));
  every.resize(static_cast<size_t>(t.groups) * static_cast<size_t>(kTpProfileGroup));
  return mean_of(every);
}

// A layer's product as the profile times it between TP collectives: the wq forward at the
// profile's shapes (every rank the same work).
struct WqProduct {
  explicit WqProduct(const ProfileShape& s)
      : m(s.tokens), q_dim(s.n_heads * s.head_dim), width(s.hidden),
        x(static_cast<size_t>(m * width), 0.5f), w(static_cast<size_t>(q_dim * width), 0.25f),
        y(static_cast<size_t>(m * q_dim)) {}
  void run() {
    kernels::gemm_tiled<float>(false, true, m, q_dim, width, 1.0f, x.data(), width, w.data(), width, 0.0f, y.data(),
                               q_dim);
  }
  int64_t m, q_dim, width;
  std::vector<float> x, w, y;
};

// Tensor parallelism's collectives as the trainer runs them (trainer.cpp): on every TP group
// (tp_group) at once, timed by the trainer's TimedCommunicator. Per size, a barrier, then per
// repeat what a layer does: a product (WqProduct: every rank the same work, so a peer arrives
// late only by this machine's noise), then the model's all-gather and reduce-scatter of `r`
// rows per rank of `hidden` floats back to back (as the output projection's reduce-scatter
// and the next norm's all-gather are). The point is the mean over the grouped ranks of each
// rank's mean over repeats of the two collectives' seconds.
Result<std::vector<LinkPoint>> measure_tp_collectives(comm::Communicator& c, const ProfileShape& shape, int repeats) {
  DISTCA_ASSIGN_OR_RETURN(TpGroup t, tp_group(c));
  const int64_t g = kTpProfileGroup, width = shape.hidden;
  WqProduct product(shape);
  std::vector<LinkPoint> points;
  for (const int64_t r : tp_rows_per_rank(shape.tokens)) {
    const int64_t n = r * g;
    std::vector<float> all(static_cast<size_t>(n * width), 1.0f), out(static_cast<size_t>(r * width));
    auto once = [&]() -> Result<double> {
      if (!t.comm) return 0.0;
      product.run();
      TimedCommunicator timed(*t.comm);
      DISTCA_RETURN_IF_ERROR(model::tp_all_gather_rows<float>(timed, all.data(), n, width));
      DISTCA_RETURN_IF_ERROR(model::tp_reduce_scatter_rows<float>(timed, all.data(), out.data(), n, width));
      return timed.seconds() / 2;
    };
    DISTCA_RETURN_IF_ERROR(c.barrier());
    DISTCA_RETURN_IF_ERROR(once().status());  // warm-up (connections, registration)
    std::vector<double> mine;
    for (int k = 0; k < repeats; ++k) {
      DISTCA_ASSIGN_OR_RETURN(const double s, once());
      mine.push_back(s);
    }
    // The mean, not the median: the trainer pays every collective, its slow tail included.
    DISTCA_ASSIGN_OR_RETURN(const double mean, grouped_mean(c, t, mean_of(mine)));
    points.push_back({r * width * static_cast<int64_t>(sizeof(float)), std::max(mean, kMinTaskSeconds)});
  }
  return points;
}

// The largest row count of measure_tp_wait's layer runs: three runs per repeat (a quarter, a
// half and all of it) cost about 1.75 layers of this many rows.
constexpr int64_t kTpWaitMaxRows = 2048;

// The largest row count of measure_tp_wait's layer runs at `shape` (the profile's tokens, at
// most kTpWaitMaxRows, a multiple of the group); 0 when the model does not split over the
// group (check_tp) or the tokens are fewer than the group's ranks: then there is no TP wait.
int64_t tp_wait_rows(const ProfileShape& shape) {
  const int64_t g = kTpProfileGroup;
  const int64_t top = std::min(shape.tokens, kTpWaitMaxRows) / g * g;
  return model::check_tp(elementwise_spec(shape), g).ok() && top >= g ? top : 0;
}

// The TP peers' wait (HardwareProfile::tp_wait): on every TP group at once, per row count n (a
// quarter, a half and all of the profile's tokens, at most kTpWaitMaxRows, multiples of the
// group), a barrier, a warm-up, then `repeats` runs back to back of one decoder layer's TP
// forward and backward with the collectives blocking (model::TpLayerHarness: the trainer's
// functions in its order, with no barrier between them, as the trainer has none between its
// layers), timed by the trainer's TimedCommunicator. A run's compute is its wall time less its
// collectives' time; its wait is its collectives' time less what `price` (links.tp_collective,
// measured just before) charges for their count and bytes: the time the rank spent in a
// collective for its peer's compute to end. Point: per collective, the grouped ranks' mean of
// each rank's total compute and total wait over the runs (the trainer pays every collective,
// its slow tail included). Null when the shape does not split over the group (check_tp) or
// fewer than two row counts gave increasing compute.
Result<std::optional<TpWaitProfile>> measure_tp_wait(comm::Communicator& c, const ProfileShape& shape,
                                                     const LinkProfile& price, int repeats) {
  DISTCA_ASSIGN_OR_RETURN(TpGroup t, tp_group(c));
  const int64_t g = kTpProfileGroup, top = tp_wait_rows(shape);
  if (top == 0) return std::optional<TpWaitProfile>{};
  const ModelSpec spec = elementwise_spec(shape);
  std::vector<int64_t> sizes;
  for (const int64_t n : {top / 4 / g * g, top / 2 / g * g, top}) {
    if (n >= g && (sizes.empty() || n > sizes.back())) sizes.push_back(n);
  }
  std::vector<TpWaitPoint> points;
  for (const int64_t n : sizes) {
    std::optional<model::TpLayerHarness> layer;
    if (t.comm) layer.emplace(spec, static_cast<int>(g), t.comm->rank(), n);
    double compute = 0, wait = 0;
    int64_t calls = 0;
    auto once = [&]() -> Status {
      if (!layer) return Status::ok_status();
      TimedCommunicator timed(*t.comm);
      const double t0 = monotonic_seconds();
      DISTCA_RETURN_IF_ERROR(layer->run(timed, false));
      const double wall = monotonic_seconds() - t0;
      const double priced = static_cast<double>(timed.calls()) * price.latency_seconds +
                            static_cast<double>(timed.bytes_sent()) / price.bytes_per_second;
      compute += wall - timed.seconds();
      wait += timed.seconds() - priced;
      calls += timed.calls();
      return Status::ok_status();
    };
    DISTCA_RETURN_IF_ERROR(c.barrier());
    DISTCA_RETURN_IF_ERROR(once());  // warm-up (first touch of the buffers)
    compute = wait = 0;
    calls = 0;
    for (int i = 0; i < repeats; ++i) DISTCA_RETURN_IF_ERROR(once());
    const double per = static_cast<double>(std::max<int64_t>(calls, 1));
    DISTCA_ASSIGN_OR_RETURN(const double mc, grouped_mean(c, t, compute / per));
    DISTCA_ASSIGN_OR_RETURN(const double mw, grouped_mean(c, t, wait / per));
    const TpWaitPoint p{std::max(mc, kMinTaskSeconds), std::max(mw, kMinTaskSeconds)};
    // Every rank sees the same grouped means, so every rank keeps or drops the same points.
    if (points.empty() || p.compute_seconds > points.back().compute_seconds) points.push_back(p);
  }
  if (points.size() < 2) return std::optional<TpWaitProfile>{};
  return std::optional<TpWaitProfile>{fit_tp_wait(std::move(points))};
}

// A barrier whose waiters sleep: a zero-byte exchange with every rank, tested every 200 us.
// The communicator's barrier() spins in MPI_Testsome; with more ranks than cores the spinning
// ranks would take cores from the one being timed alone (how much depends on the scheduler
// and MPI's yield setting), so the alone figures would not be one rank on a core.
Status sleeping_barrier(comm::Communicator& c) {
  const std::vector<size_t> zeros(static_cast<size_t>(c.size()), 0);
  DISTCA_ASSIGN_OR_RETURN(auto x, c.start_all_to_all_v({nullptr, zeros, zeros, nullptr, zeros, zeros, "barrier"}));
  while (!x->test()) std::this_thread::sleep_for(std::chrono::microseconds(200));
  return x->wait();
}

// The GEMMs: each product timed with every rank computing it at once and with rank 0 alone.
Status measure_gemms(comm::Communicator* c, const ProfileRun& run, const Progress& progress, HardwareProfile& hp) {
  const std::function<Status()> sync = barrier_of(c);
  const bool lead = c == nullptr || c->rank() == 0;
  uint64_t seed = 100 + static_cast<uint64_t>(c != nullptr ? c->rank() : 0);
  for (GemmRecord& g : hp.gemms) {
    DISTCA_ASSIGN_OR_RETURN(double mine, kernels::time_profile_gemm(g, run.gemm_repeats, sync, seed++, run.min_call_seconds));
    g.seconds_concurrent = mine;
    if (c != nullptr) {
      DISTCA_ASSIGN_OR_RETURN(g.seconds_concurrent, kernels::slowest_over_ranks(in_step(c), mine));
      if (lead) {
        DISTCA_ASSIGN_OR_RETURN(g.seconds_alone, kernels::time_profile_gemm(g, run.gemm_repeats, {}, seed++, run.min_call_seconds));
      }
      DISTCA_RETURN_IF_ERROR(sleeping_barrier(*c));
    } else {
      g.seconds_alone = mine;
    }
    if (progress && lead) {
      progress(g.layer + " " + gemm_pass_name(g.pass) + ": " + std::to_string(g.flops() / g.seconds_concurrent / 1e9) +
               " GFLOP/s");
    }
  }
  return {};
}

// The element-wise figures (model/profile_elementwise.h), like the GEMMs. Skipped for an odd
// head_dim (RoPE needs pairs; the trainer refuses such a model anyway): the profile then has
// no "elementwise" object.
Status measure_elementwise(comm::Communicator* c, const ProfileRun& run, HardwareProfile& hp) {
  const ModelSpec spec = elementwise_spec(hp.shape);
  if (spec.head_dim % 2 != 0) return {};
  const bool lead = c == nullptr || c->rank() == 0;
  const uint64_t seed = 500 + static_cast<uint64_t>(c != nullptr ? c->rank() : 0);
  DISTCA_ASSIGN_OR_RETURN(model::ElementwiseSeconds mine,
                          model::time_elementwise(spec, hp.shape.tokens, run.gemm_repeats, barrier_of(c), seed, run.min_call_seconds));
  model::ElementwiseSeconds alone = mine, concurrent = mine;
  if (c != nullptr) {
    for (double model::ElementwiseSeconds::*field :
         {&model::ElementwiseSeconds::layer_forward, &model::ElementwiseSeconds::layer_backward,
          &model::ElementwiseSeconds::loss_forward, &model::ElementwiseSeconds::loss_backward,
          &model::ElementwiseSeconds::optimizer}) {
      DISTCA_ASSIGN_OR_RETURN(concurrent.*field, kernels::slowest_over_ranks(in_step(c), mine.*field));
    }
    if (lead) {
      DISTCA_ASSIGN_OR_RETURN(alone, model::time_elementwise(spec, hp.shape.tokens, run.gemm_repeats, {}, seed, run.min_call_seconds));
    }
    DISTCA_RETURN_IF_ERROR(sleeping_barrier(*c));
  }
  ElementwiseProfile e;
  e.layer_forward = {alone.layer_forward, concurrent.layer_forward};
  e.layer_backward = {alone.layer_backward, concurrent.layer_backward};
  e.loss_forward = {alone.loss_forward, concurrent.loss_forward};
  e.loss_backward = {alone.loss_backward, concurrent.loss_backward};
  e.optimizer = {alone.optimizer, concurrent.optimizer};
  hp.elementwise = e;
  return {};
}

// `path` ("/a/b") and its ancestors ("/a", "/"), deepest first.
std::vector<std::string> path_and_ancestors(std::string path) {
  std::vector<std::string> out;
  while (!path.empty() && path != "/") {
    out.push_back(path);
    path = path.substr(0, path.rfind('/'));
  }
  out.push_back("/");
  return out;
}

// The least quota (cores) of the cgroups `mount` + each of `paths`; `quota_of` reads one
// directory's (nullopt: none set or unreadable).
double least_quota(const std::string& mount, const std::string& path,
                   const std::function<std::optional<double>(const std::string&)>& quota_of) {
  double least = 0;
  for (const std::string& p : path_and_ancestors(path)) {
    const std::optional<double> q = quota_of(mount + (p == "/" ? "" : p));
    if (q && *q > 0 && (least == 0 || *q < least)) least = *q;
  }
  return least;
}

std::optional<double> to_number(const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str()) return std::nullopt;
  return v;
}

}  // namespace

double cgroup_cpu_quota(const ReadText& read_given) {
  const ReadText read = read_given ? read_given : ReadText(read_text_file);
  const CpuCgroupPaths g = cpu_cgroup_paths(read);
  double least = 0;
  auto keep = [&](double q) {
    if (q > 0 && (least == 0 || q < least)) least = q;
  };
  if (!g.v2_mount.empty() && !g.v2_path.empty()) {
    keep(least_quota(g.v2_mount, g.v2_path, [&](const std::string& dir) -> std::optional<double> {
      const std::optional<std::string> t = read(dir + "/cpu.max");
      if (!t) return std::nullopt;
      std::istringstream in(*t);
      std::string q, p;
      if (!(in >> q >> p)) return std::nullopt;
      const std::optional<double> quota = to_number(q), period = to_number(p);
      if (!quota || !period || *period <= 0) return std::nullopt;  // "max": none
      return *quota / *period;
    }));
  }
  if (!g.v1_mount.empty() && !g.v1_path.empty()) {
    keep(least_quota(g.v1_mount, g.v1_path, [&](const std::string& dir) -> std::optional<double> {
      const std::optional<std::string> q = read(dir + "/cpu.cfs_quota_us"), p = read(dir + "/cpu.cfs_period_us");
      if (!q || !p) return std::nullopt;
      const std::optional<double> quota = to_number(*q), period = to_number(*p);
      if (!quota || !period || *quota <= 0 || *period <= 0) return std::nullopt;  // -1: none
      return *quota / *period;
    }));
  }
  return least;
}

double profile_run_bytes(const ProfileRun& run, int64_t ranks) {
  const kernels::ProfileOptions& a = run.attention;
  const int64_t longest = a.q_lens.back();
  double need = kernels::problem_memory_bytes(longest, longest, a.n_heads, a.n_kv_heads, a.head_dim);
  if (run.hardware) {
    double gemm = 0;
    for (const GemmRecord& g : profile_gemm_list(run.shape)) gemm = std::max(gemm, kernels::profile_gemm_bytes(g));
    const double links = 2.0 * static_cast<double>(std::max<int64_t>(ranks, 2)) * static_cast<double>(kLinkBytes.back());
    // measure_comm_cpu: its send and receive buffers at most, and the product's operands.
    const double comm_cpu = 2.0 * static_cast<double>(kCommCpuMaxBytes) +
                            static_cast<double>(2 * run.shape.tokens * run.shape.hidden + run.shape.hidden * run.shape.hidden) *
                                sizeof(float);
    const double ew = model::elementwise_profile_bytes(elementwise_spec(run.shape), run.shape.tokens);
    // The TP collectives' largest size (the gathered rows, the rank's own and the reduce's
    // receive buffer, of the profile's tokens) and the wq forward between them.
    const double q_dim = static_cast<double>(run.shape.n_heads * run.shape.head_dim);
    const double tp = (2.0 * static_cast<double>(run.shape.tokens * run.shape.hidden) +
                       (static_cast<double>(run.shape.tokens) + static_cast<double>(run.shape.hidden)) * q_dim +
                       static_cast<double>(run.shape.tokens * run.shape.hidden)) * sizeof(float);
    // The TP wait's layer runs (measure_tp_wait), at their largest.
    const int64_t wait_rows = tp_wait_rows(run.shape);
    const double wait = wait_rows == 0 ? 0.0
                                       : model::TpLayerHarness::peak_bytes(elementwise_spec(run.shape),
                                                                           static_cast<int>(kTpProfileGroup), wait_rows);
    need = std::max({need, gemm, links, comm_cpu, ew, tp, wait});
  }
  return need;
}

HardwareProfile new_hardware_profile(const ProfileRun& run, int64_t ranks, int threads) {
  HardwareProfile hp;
  hp.cpu = kernels::cpu_model_name();
  // The machine's cores (mpirun binds each rank to fewer: its own affinity mask).
  hp.cores = std::max<long>(1, ::sysconf(_SC_NPROCESSORS_ONLN));
  hp.ranks = ranks;
  hp.threads_per_rank = threads;
  hp.blas = kernels::blas_core_name();
  hp.alone_waiters_sleep = true;  // the alone figures: sleeping_barrier
  hp.shape = run.shape;
  if (run.hardware) hp.gemms = profile_gemm_list(run.shape);
  return hp;
}

Status measure_profile(comm::Communicator* c, const ProfileRun& run, const Progress& progress, HardwareProfile& hp,
                       const Progress& notice) {
  const bool lead = c == nullptr || c->rank() == 0;
  const Progress shown = lead ? progress : Progress{};
  DISTCA_ASSIGN_OR_RETURN(kernels::AttentionGrids grids,
                          kernels::profile_attention_split(run.attention, shown, in_step(c), lead ? notice : Progress{}));
  hp.attention_forward = std::move(grids.forward);
  hp.attention_backward = std::move(grids.backward);
  hp.attention_concurrent = c != nullptr;
  // The ranks' CPU quota (scripts/rank-cap.sh): the least over ranks, 0 when any rank had none.
  hp.cpu_quota = cgroup_cpu_quota();
  if (c != nullptr) {
    DISTCA_ASSIGN_OR_RETURN(std::vector<double> quotas, c->all_gather_value(hp.cpu_quota));
    hp.cpu_quota = *std::min_element(quotas.begin(), quotas.end());
  }
  hp.cpu_quota = std::min(hp.cpu_quota, static_cast<double>(hp.cores));
  if (run.hardware) {
    DISTCA_RETURN_IF_ERROR(measure_gemms(c, run, shown, hp));
    if (shown) shown("element-wise work, optimizer");
    DISTCA_RETURN_IF_ERROR(measure_elementwise(c, run, hp));
    if (c != nullptr) {
      DISTCA_ASSIGN_OR_RETURN(std::vector<LinkPoint> a2a, measure_links(*c, true, run.link_repeats));
      DISTCA_ASSIGN_OR_RETURN(std::vector<LinkPoint> ring, measure_links(*c, false, run.link_repeats));
      hp.all_to_all = fit_link(std::move(a2a), static_cast<double>(c->size() - 1));
      hp.p2p = fit_link(std::move(ring), 1.0);
      DISTCA_ASSIGN_OR_RETURN(hp.comm_cpu, measure_comm_cpu(*c, run.shape, *hp.p2p, run.link_repeats));
      if (c->size() >= kTpProfileGroup) {
        DISTCA_ASSIGN_OR_RETURN(std::vector<LinkPoint> tp,
                                measure_tp_collectives(*c, run.shape, run.link_repeats));
        hp.tp_collective = fit_link(std::move(tp), 1.0);
        DISTCA_ASSIGN_OR_RETURN(hp.tp_wait, measure_tp_wait(*c, run.shape, *hp.tp_collective, run.link_repeats));
      }
    }
  }
  return {};
}

}  // namespace distca::train
