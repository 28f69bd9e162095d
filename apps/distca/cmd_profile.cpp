// `distca profile`: measure attention on a (q_len, kv_len) grid on this machine and write the
// cost table the planner reads with --cost-table (docs/kernels.md, section "Cost table"); with
// --hardware-out FILE, also the linear layers' GEMMs and the element-wise work between them at
// one model's shapes and, under mpirun, the links: the hardware profile `distca simulate
// --hardware` reads (docs/simulation-model.md, section "Hardware profile"). The measurements
// are the library's (train/profile.h); this command checks the flags and writes the files.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "command.h"
#include "distca/comm/launch.h"
#include "distca/core/io.h"
#include "distca/core/memory.h"
#include "distca/core/specs.h"
#include "distca/cost/hardware_profile.h"
#include "distca/cost/profiled.h"
#include "distca/kernels/blas.h"
#include "distca/kernels/profiler.h"
#include "distca/train/profile.h"
#include "launcher.h"

namespace distca::cli::cmd_profile {
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
  double min_call_seconds = kernels::kDefaultMinCallSeconds;
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

// Everything the flags decide, checked before any work.
struct Plan : train::ProfileRun {
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
  if (!std::isfinite(f.min_call_seconds) || f.min_call_seconds < 0 || f.min_call_seconds > 10) {
    return bad("--min-call-seconds: must be a number in 0..10");
  }
  if (p.hardware) {
    if (f.vocab < 2 || f.vocab > (int64_t{1} << 24)) return bad("--vocab must be in 2..16777216");
    if (f.tokens < 1 || f.tokens > (int64_t{1} << 20)) return bad("--tokens must be in 1..1048576");
    if (Status st = s.validate("the model's shapes: "); !st.ok()) return st;
  }
  opt.q_lens = kernels::power_of_two_lengths(f.min_len, max_len);
  opt.kv_lens = opt.q_lens;
  opt.repeats = f.repeats;
  opt.min_seconds = f.min_seconds;
  opt.min_call_seconds = f.min_call_seconds;
  p.min_call_seconds = f.min_call_seconds;
  p.gemm_repeats = f.gemm_repeats;
  p.link_repeats = f.link_repeats;
  p.what = f.model.empty() ? "--heads " + std::to_string(opt.n_heads) + " --kv-heads " + std::to_string(opt.n_kv_heads) +
                                 " --head-dim " + std::to_string(opt.head_dim)
                           : "--model " + f.model;
  p.what += " --max-len " + std::to_string(max_len);
  if (p.hardware) p.what += " --width " + std::to_string(s.hidden) + " --tokens " + std::to_string(s.tokens);
  return p;
}

comm::Settings profile_settings(const ProfileFlags& f) {
  comm::Settings s;
  s.add("command", "profile").add("--model", f.model).add("--heads", f.heads).add("--kv-heads", f.kv_heads);
  s.add("--head-dim", f.head_dim).add("--min-len", f.min_len).add("--max-len", f.max_len).add("--repeats", f.repeats);
  s.add("--min-seconds", f.min_seconds).add("--min-call-seconds", f.min_call_seconds);
  s.add("--width", f.width).add("--ffn", f.ffn).add("--vocab", f.vocab);
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
  if (Status st = check_memory(train::profile_run_bytes(*plan, ranks), plan->what); !st.ok()) return early_fail(st.message());

  // As the trainer runs: BLAS on one thread, the rank's OpenMP team sized by the ranks sharing
  // this machine's cores.
  const kernels::ScopedBlasThreads one_blas_thread(1);
  const int threads = kernels::compute_threads_per_rank(mpi_local_ranks(ranks));
  const kernels::ScopedComputeThreads team(threads);
  HardwareProfile hp = train::new_hardware_profile(*plan, ranks, threads);
  auto measure = [&](comm::Communicator* c) {
    const bool show = (c == nullptr || c->rank() == 0) && stderr_is_terminal();
    const bool lead = c == nullptr || c->rank() == 0;
    Status st = train::measure_profile(c, *plan, show ? [](const std::string& line) {
      std::fprintf(stderr, "\r%-60s", line.c_str());
    } : std::function<void(const std::string&)>{}, hp, lead ? [show](const std::string& line) {
      std::fprintf(stderr, "%sdistca: profile: %s\n", show ? "\r" : "", line.c_str());
    } : std::function<void(const std::string&)>{});
    if (st.ok() && show) std::fprintf(stderr, "\r%60s\r", "");
    return st;
  };
  if (ranks > 1) {
    comm::LaunchOptions lo{comm::Backend::kMpi, 1, {}};
    lo.mpi.timeout_s = f.mpi_timeout;
    const comm::Launched launched =
        comm::launch(lo, profile_settings(f), nullptr, [&](comm::Communicator& c, int) {
          hp.ranks = c.size();
          return measure(&c);
        });
    if (!launched.status.ok()) return launch_failed(launched);
    if (!launched.speaks) return kExitOk;
  } else if (Status st = measure(nullptr); !st.ok()) {
    return fail(st);
  }

  std::vector<std::pair<std::string, std::string>> files;
  std::string table_text;
  if (!plan->hardware || !f.out.empty()) {
    CostTable total = hp.attention_total();
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
  app.add_option("--min-call-seconds", f->min_call_seconds,
                 "time each measurement (attention pass, GEMM, element-wise run) over back-to-back calls "
                 "spanning at least this long, 0..10 (default 0.02: 10 CPU-cap periods of rank-cap.sh)");
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

}  // namespace distca::cli::cmd_profile
