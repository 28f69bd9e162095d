// `distca profile`: measure attention on a (q_len, kv_len) grid on this machine and write the
// cost table the planner reads with --cost-table (docs/kernels.md, section "Cost table"); with
// --hardware-out FILE, also the linear layers' GEMMs and the element-wise work between them
// (model/profile_elementwise.h) at one model's shapes and, under mpirun,
// the all-to-all and point-to-point links: the hardware profile `distca simulate --hardware`
// reads (docs/simulation-model.md, section "Hardware profile"; docs/simulation.md).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "command.h"
#include "distca/core/stats.h"
#include "distca/comm/launch.h"
#include "distca/core/clock.h"
#include "distca/core/io.h"
#include "distca/core/memory.h"
#include "distca/core/specs.h"
#include "distca/cost/hardware_profile.h"
#include "distca/cost/profiled.h"
#include "distca/kernels/blas.h"
#include "distca/kernels/profiler.h"
#include "distca/model/profile_elementwise.h"
#include "launcher.h"

namespace distca::cli {
namespace {

struct ProfileFlags {
  std::string out;
  std::string hardware_out;
  std::string model;
  int heads = 1;
  int kv_heads = 1;
  int head_dim = 128;
  int64_t min_len = 128;
  int64_t max_len = 32768;
  int repeats = 3;
  double min_seconds = 0.5;
  // --hardware-out: the model whose linear layers are timed (bench train's defaults).
  int64_t width = 512;
  int64_t ffn = 0;  // 0: bench train's rule, about 8/3 of the width on a multiple of 64
  int64_t vocab = 512;
  int64_t tokens = 4096;
  int gemm_repeats = 5;
  int link_repeats = 10;
  double mpi_timeout = 300;
  CLI::App* app = nullptr;
};

bool given(const ProfileFlags& f, const char* flag) { return f.app->count(flag) > 0; }

// Message sizes of the link measurements (bytes per message): latency-bound to bandwidth-bound.
const std::vector<int64_t> kLinkBytes = {64, 1024, 16384, 262144, 1 << 20, 4 << 20};

// Everything the flags decide, checked before any work.
struct Plan {
  kernels::ProfileOptions attention;
  ProfileShape shape;
  bool hardware = false;
  std::string what;  // the flags that size the run, for the memory message
};

Result<Plan> make_plan(const ProfileFlags& f, const Launcher& launcher) {
  Plan p;
  p.hardware = !f.hardware_out.empty();
  auto bad = [](const std::string& m) { return Status::invalid_argument(m); };
  if (!p.hardware) {
    for (const char* flag : {"--width", "--ffn", "--vocab", "--tokens", "--gemm-repeats", "--link-repeats"}) {
      if (given(f, flag)) return bad(std::string(flag) + " needs --hardware-out FILE (it sizes the hardware profile)");
    }
    if (launcher.present && launcher.size > 1) {
      return bad("under mpirun, profile writes a hardware profile: give --hardware-out FILE");
    }
  }
  kernels::ProfileOptions& opt = p.attention;
  opt.n_heads = f.heads;
  opt.n_kv_heads = f.kv_heads;
  opt.head_dim = f.head_dim;
  ProfileShape& s = p.shape;
  if (!f.model.empty()) {
    if (p.hardware) {
      for (const char* flag : {"--width", "--ffn", "--vocab", "--heads", "--kv-heads", "--head-dim"}) {
        if (given(f, flag)) return bad(std::string(flag) + " cannot be combined with --model (the preset sets it)");
      }
    }
    Result<ModelSpec> m = model_preset(f.model);
    if (!m.ok()) return bad("--model: " + m.status().message());
    opt.n_heads = static_cast<int32_t>(m->n_heads);
    opt.n_kv_heads = static_cast<int32_t>(m->n_kv_heads);
    opt.head_dim = static_cast<int32_t>(m->head_dim);
    s = {m->hidden, m->n_heads, m->n_kv_heads, m->head_dim, m->ffn, m->vocab, f.tokens};
  } else if (p.hardware) {
    // bench train's model (train::bench_spec, train/bench.h): head_dim 64, width / head_dim
    // query heads, half as many K/V heads when even, unless the flags say otherwise.
    const int64_t hd = given(f, "--head-dim") ? f.head_dim : 64;
    if (f.width < 1 || f.width > (int64_t{1} << 20)) return bad("--width must be in 1..1048576");
    if (!given(f, "--heads") && f.width % hd != 0) return bad("--head-dim " + std::to_string(hd) + " must divide --width");
    const int64_t heads = given(f, "--heads") ? f.heads : f.width / hd;
    const int64_t kv = given(f, "--kv-heads") ? f.kv_heads : (heads % 2 == 0 ? heads / 2 : heads);
    const int64_t ffn = f.ffn > 0 ? f.ffn : std::max<int64_t>(64, (8 * f.width / 3 + 32) / 64 * 64);
    if (given(f, "--ffn") && f.ffn < 1) return bad("--ffn must be positive");
    opt.n_heads = static_cast<int32_t>(heads);
    opt.n_kv_heads = static_cast<int32_t>(kv);
    opt.head_dim = static_cast<int32_t>(hd);
    s = {f.width, heads, kv, hd, ffn, f.vocab, f.tokens};
  }
  if (opt.n_heads % opt.n_kv_heads != 0) return bad("--kv-heads must divide --heads");
  const int64_t max_len = p.hardware && !given(f, "--max-len") ? std::max<int64_t>(f.min_len, 8192) : f.max_len;
  if (max_len < f.min_len) return bad("--max-len must be >= --min-len");
  if (!std::isfinite(f.min_seconds) || f.min_seconds < 0) return bad("--min-seconds: must be a finite number >= 0");
  if (p.hardware) {
    if (f.vocab < 2 || f.vocab > (int64_t{1} << 24)) return bad("--vocab must be in 2..16777216");
    if (f.tokens < 1 || f.tokens > (int64_t{1} << 20)) return bad("--tokens must be in 1..1048576");
    if (Status st = s.validate("the model's shapes: "); !st.ok()) return st;
  }
  opt.q_lens = kernels::power_of_two_lengths(f.min_len, max_len);
  opt.kv_lens = opt.q_lens;
  opt.repeats = f.repeats;
  opt.min_seconds = f.min_seconds;
  p.what = f.model.empty() ? "--heads " + std::to_string(opt.n_heads) + " --kv-heads " + std::to_string(opt.n_kv_heads) +
                                 " --head-dim " + std::to_string(opt.head_dim)
                           : "--model " + f.model;
  p.what += " --max-len " + std::to_string(max_len);
  if (p.hardware) p.what += " --width " + std::to_string(s.hidden) + " --tokens " + std::to_string(s.tokens);
  return p;
}

// The model the element-wise figures are timed at: the profile's shapes, one layer.
ModelSpec elementwise_spec(const ProfileShape& s) {
  return {"profile", 1, s.hidden, s.n_heads, s.n_kv_heads, s.head_dim, s.ffn, s.vocab};
}

// What the run allocates at most: the largest attention problem, the largest GEMM's operands
// and the link buffers (one at a time).
double plan_bytes(const Plan& p, int64_t ranks) {
  const int64_t longest = p.attention.q_lens.back();
  double need = kernels::problem_memory_bytes(longest, longest, p.attention.n_heads, p.attention.n_kv_heads,
                                              p.attention.head_dim);
  if (p.hardware) {
    double gemm = 0;
    for (const GemmRecord& g : profile_gemm_list(p.shape)) gemm = std::max(gemm, kernels::profile_gemm_bytes(g));
    const double links = 2.0 * static_cast<double>(std::max<int64_t>(ranks, 2)) * static_cast<double>(kLinkBytes.back());
    const double ew = model::elementwise_profile_bytes(elementwise_spec(p.shape), p.shape.tokens);
    need = std::max({need, gemm, links, ew});
  }
  return need;
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

// The GEMMs: each product timed with every rank computing it at once (the median over ranks
// of each rank's median) and with rank 0 alone while the others sleep in a barrier
// (HardwareProfile::alone_waiters_sleep).
Status measure_gemms(comm::Communicator* c, const ProfileFlags& f, HardwareProfile& hp, bool progress) {
  std::function<Status()> sync;
  if (c != nullptr) sync = [c] { return c->barrier(); };
  const bool lead = c == nullptr || c->rank() == 0;
  uint64_t seed = 100 + static_cast<uint64_t>(c != nullptr ? c->rank() : 0);
  for (GemmRecord& g : hp.gemms) {
    DISTCA_ASSIGN_OR_RETURN(double mine, kernels::time_profile_gemm(g, f.gemm_repeats, sync, seed++));
    g.seconds_concurrent = mine;
    if (c != nullptr) {
      DISTCA_ASSIGN_OR_RETURN(std::vector<double> all, c->all_gather_value(mine));
      g.seconds_concurrent = median(all);
      if (lead) {
        DISTCA_ASSIGN_OR_RETURN(g.seconds_alone, kernels::time_profile_gemm(g, f.gemm_repeats, {}, seed++));
      }
      DISTCA_RETURN_IF_ERROR(sleeping_barrier(*c));
    } else {
      g.seconds_alone = mine;
    }
    if (progress && lead) {
      std::fprintf(stderr, "\r%-60s", (g.layer + " " + gemm_pass_name(g.pass) + ": " +
                                       std::to_string(g.flops() / g.seconds_concurrent / 1e9) + " GFLOP/s").c_str());
    }
  }
  return {};
}

// The element-wise figures (model/profile_elementwise.h), like the GEMMs: every rank at once
// (barrier before each timed run; the median over ranks of each rank's median), then rank 0
// alone while the others sleep. Skipped for an odd head_dim (RoPE needs pairs; the trainer
// refuses such a model anyway): the profile then has no "elementwise" object.
Status measure_elementwise(comm::Communicator* c, const ProfileFlags& f, HardwareProfile& hp) {
  const ModelSpec spec = elementwise_spec(hp.shape);
  if (spec.head_dim % 2 != 0) return {};
  std::function<Status()> sync;
  if (c != nullptr) sync = [c] { return c->barrier(); };
  const bool lead = c == nullptr || c->rank() == 0;
  const uint64_t seed = 500 + static_cast<uint64_t>(c != nullptr ? c->rank() : 0);
  DISTCA_ASSIGN_OR_RETURN(model::ElementwiseSeconds mine,
                          model::time_elementwise(spec, hp.shape.tokens, f.gemm_repeats, sync, seed));
  model::ElementwiseSeconds alone = mine, concurrent = mine;
  if (c != nullptr) {
    for (double model::ElementwiseSeconds::*field :
         {&model::ElementwiseSeconds::layer_forward, &model::ElementwiseSeconds::layer_backward,
          &model::ElementwiseSeconds::loss_forward, &model::ElementwiseSeconds::loss_backward,
          &model::ElementwiseSeconds::optimizer}) {
      DISTCA_ASSIGN_OR_RETURN(std::vector<double> all, c->all_gather_value(mine.*field));
      concurrent.*field = median(all);
    }
    if (lead) {
      DISTCA_ASSIGN_OR_RETURN(alone, model::time_elementwise(spec, hp.shape.tokens, f.gemm_repeats, {}, seed));
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

// The whole measurement on this rank (c: null without mpirun). Fills hp (rank 0's view).
Status measure(comm::Communicator* c, const ProfileFlags& f, const Plan& p, HardwareProfile& hp) {
  const bool lead = c == nullptr || c->rank() == 0;
  const bool progress = lead && stderr_is_terminal();
  std::function<Status()> sync;
  if (c != nullptr) sync = [c] { return c->barrier(); };
  DISTCA_ASSIGN_OR_RETURN(kernels::AttentionGrids grids,
                          kernels::profile_attention_split(p.attention, [&](const std::string& line) {
                            if (progress) std::fprintf(stderr, "\r%-60s", line.c_str());
                          }, sync));
  hp.attention_forward = std::move(grids.forward);
  hp.attention_backward = std::move(grids.backward);
  hp.attention_concurrent = c != nullptr;
  if (p.hardware) {
    DISTCA_RETURN_IF_ERROR(measure_gemms(c, f, hp, progress));
    if (progress) std::fprintf(stderr, "\r%-60s", "element-wise work, optimizer");
    DISTCA_RETURN_IF_ERROR(measure_elementwise(c, f, hp));
    if (c != nullptr) {
      DISTCA_ASSIGN_OR_RETURN(std::vector<LinkPoint> a2a, measure_links(*c, true, f.link_repeats));
      DISTCA_ASSIGN_OR_RETURN(std::vector<LinkPoint> ring, measure_links(*c, false, f.link_repeats));
      hp.all_to_all = fit_link(std::move(a2a), static_cast<double>(c->size() - 1));
      hp.p2p = fit_link(std::move(ring), 1.0);
    }
  }
  if (progress) std::fprintf(stderr, "\r%60s\r", "");
  return {};
}

comm::Settings profile_settings(const ProfileFlags& f) {
  comm::Settings s;
  s.add("command", "profile").add("--model", f.model).add("--heads", f.heads).add("--kv-heads", f.kv_heads);
  s.add("--head-dim", f.head_dim).add("--min-len", f.min_len).add("--max-len", f.max_len).add("--repeats", f.repeats);
  s.add("--min-seconds", f.min_seconds).add("--width", f.width).add("--ffn", f.ffn).add("--vocab", f.vocab);
  s.add("--tokens", f.tokens).add("--gemm-repeats", f.gemm_repeats).add("--link-repeats", f.link_repeats);
  s.add("--hardware-out given", !f.hardware_out.empty());
  return s;
}

int run(const ProfileFlags& f) {
  const Launcher launcher = detect_launcher();
  const bool first = launcher.rank <= 0;  // before the group exists only rank 0 speaks
  auto early_fail = [&](const std::string& m) { return first ? fail_input(m) : kExitBadInput; };
  Result<Plan> plan = make_plan(f, launcher);
  if (!plan.ok()) return early_fail(plan.status().message());
  const bool to_stdout = !plan->hardware && (f.out.empty() || f.out == "-");
  if (Status st = check_distinct_outputs({{"--out", f.out, true}, {"--hardware-out", f.hardware_out}}); !st.ok()) {
    return early_fail(st.message());
  }
  if (!f.out.empty() && f.out != "-") {
    if (Status st = check_output_path(f.out); !st.ok()) return early_fail("--out: " + st.message());
  }
  if (plan->hardware) {
    if (Status st = check_output_path(f.hardware_out); !st.ok()) return early_fail("--hardware-out: " + st.message());
  }
  const int64_t ranks = launcher.present && launcher.size > 1 ? launcher.size : 1;
  if (Status st = check_memory(plan_bytes(*plan, ranks), plan->what); !st.ok()) return early_fail(st.message());

  // As the trainer runs: BLAS on one thread, the rank's OpenMP team sized by the ranks sharing
  // this machine's cores.
  const kernels::ScopedBlasThreads one_blas_thread(1);
  const int threads = kernels::compute_threads_per_rank(mpi_local_ranks(ranks));
  const kernels::ScopedComputeThreads team(threads);
  HardwareProfile hp;
  hp.cpu = kernels::cpu_model_name();
  // The machine's cores (mpirun binds each rank to fewer: its own affinity mask).
  hp.cores = std::max<long>(1, ::sysconf(_SC_NPROCESSORS_ONLN));
  hp.ranks = ranks;
  hp.threads_per_rank = threads;
  hp.blas = kernels::blas_core_name();
  hp.alone_waiters_sleep = true;  // measure_gemms: sleeping_barrier
  hp.shape = plan->shape;
  if (plan->hardware) hp.gemms = profile_gemm_list(plan->shape);
  if (ranks > 1) {
    comm::LaunchOptions lo{comm::Backend::kMpi, 1, {}};
    lo.mpi.timeout_s = f.mpi_timeout;
    const comm::Launched launched =
        comm::launch(lo, profile_settings(f), nullptr, [&](comm::Communicator& c, int) {
          hp.ranks = c.size();
          return measure(&c, f, *plan, hp);
        });
    if (!launched.status.ok()) return launch_failed(launched);
    if (!launched.speaks) return kExitOk;
  } else if (Status st = measure(nullptr, f, *plan, hp); !st.ok()) {
    return fail(st);
  }

  std::vector<std::pair<std::string, std::string>> files;
  std::string table_text;
  if (!plan->hardware || !f.out.empty()) {
    CostTable total = plan->hardware ? hp.attention_total() : hp.attention_forward;
    if (!plan->hardware) {
      for (size_t i = 0; i < total.seconds.size(); ++i) {
        for (size_t j = 0; j < total.seconds[i].size(); ++j) total.seconds[i][j] += hp.attention_backward.seconds[i][j];
      }
    }
    total.hardware["threads"] = threads;
    if (Status v = total.validate("profile"); !v.ok()) return fail(v);
    table_text = to_json(total).dump(2) + "\n";
    if (!to_stdout) files.emplace_back(f.out, table_text);
  }
  if (plan->hardware) {
    if (Status v = hp.validate("profile"); !v.ok()) return fail(v);
    files.emplace_back(f.hardware_out, to_json(hp).dump(2) + "\n");
  }
  if (Status w = write_files_atomic(files); !w.ok()) return fail(w);
  if (to_stdout) {
    if (Status w = write_stdout(table_text); !w.ok()) return fail(w);
  }
  return kExitOk;
}

Runner setup(CLI::App& app) {
  auto f = std::make_shared<ProfileFlags>();
  f->app = &app;
  app.add_option("--out", f->out, "write the JSON cost table here (default: stdout, unless --hardware-out)");
  app.add_option("--hardware-out", f->hardware_out,
                 "also time the linear layers' GEMMs (and, under mpirun, the links) and write the hardware profile here");
  app.add_option("--model", f->model, "take the heads (and with --hardware-out every shape) from a model preset");
  app.add_option("--heads", f->heads, "query heads (default 1; --hardware-out: --width / --head-dim)")->check(CLI::PositiveNumber);
  app.add_option("--kv-heads", f->kv_heads, "key/value heads (default 1; --hardware-out: half the heads when even)")
      ->check(CLI::PositiveNumber);
  app.add_option("--head-dim", f->head_dim, "head dimension (default 128; --hardware-out: 64)")->check(CLI::PositiveNumber);
  app.add_option("--min-len", f->min_len, "smallest grid length (default 128)")->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  app.add_option("--max-len", f->max_len, "largest grid length (default 32768; --hardware-out: 8192); the grid doubles")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  app.add_option("--repeats", f->repeats, "timed repetitions per point (median; default 3)")->check(CLI::Range(1, 100));
  app.add_option("--min-seconds", f->min_seconds, "stop repeating a point after this long, finite >= 0 (default 0.5)");
  app.add_option("--width", f->width, "--hardware-out: model width (default 512, as bench train)");
  app.add_option("--ffn", f->ffn, "--hardware-out: SwiGLU width (default: bench train's, about 8/3 of --width)");
  app.add_option("--vocab", f->vocab, "--hardware-out: vocabulary (default 512)");
  app.add_option("--tokens", f->tokens, "--hardware-out: rows of every timed GEMM (default 4096)");
  app.add_option("--gemm-repeats", f->gemm_repeats, "--hardware-out: timed calls per GEMM (median; default 5)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--link-repeats", f->link_repeats, "--hardware-out under mpirun: exchanges per size (median; default 10)")
      ->check(CLI::Range(1, 1000));
  add_mpi_timeout(app, f->mpi_timeout);
  return [f] { return run(*f); };
}

}  // namespace

DISTCA_REGISTER_COMMAND(profile, {"profile", "",
                                  "Measure attention (and GEMMs, links: a hardware profile) on this machine", 45,
                                  &setup});

}  // namespace distca::cli
