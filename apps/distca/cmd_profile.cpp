// `distca profile`: measure forward+backward attention time on a (q_len, kv_len) grid on this
// machine and write the cost table the planner reads with --cost-table (docs/kernels.md,
// section "Cost table").
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "command.h"
#include "distca/core/io.h"
#include "distca/core/memory.h"
#include "distca/core/specs.h"
#include "distca/cost/profiled.h"
#include "distca/kernels/profiler.h"

namespace distca::cli {
namespace {

struct ProfileFlags {
  std::string out;
  std::string model;
  int heads = 1;
  int kv_heads = 1;
  int head_dim = 128;
  int64_t min_len = 128;
  int64_t max_len = 32768;
  int repeats = 3;
  double min_seconds = 0.5;
};

int run(const ProfileFlags& f) {
  kernels::ProfileOptions opt;
  opt.n_heads = f.heads;
  opt.n_kv_heads = f.kv_heads;
  opt.head_dim = f.head_dim;
  if (!f.model.empty()) {
    Result<ModelSpec> m = model_preset(f.model);
    if (!m.ok()) return fail_input("--model: " + m.status().message());
    opt.n_heads = static_cast<int32_t>(m->n_heads);
    opt.n_kv_heads = static_cast<int32_t>(m->n_kv_heads);
    opt.head_dim = static_cast<int32_t>(m->head_dim);
  }
  if (opt.n_heads % opt.n_kv_heads != 0) return fail_input("--kv-heads must divide --heads");
  if (f.max_len < f.min_len) return fail_input("--max-len must be >= --min-len");
  if (!std::isfinite(f.min_seconds) || f.min_seconds < 0) return fail_input("--min-seconds: must be a finite number >= 0");
  const bool to_stdout = f.out.empty() || f.out == "-";
  if (!to_stdout) {
    if (Status st = check_output_path(f.out); !st.ok()) return fail_input("--out: " + st.message());
  }
  opt.q_lens = kernels::power_of_two_lengths(f.min_len, f.max_len);
  // The grid's largest point (q_len = kv_len = the longest length) is the largest problem; the
  // problems are built one at a time.
  const int64_t longest = opt.q_lens.back();
  const double need = kernels::problem_memory_bytes(longest, longest, opt.n_heads, opt.n_kv_heads, opt.head_dim);
  const std::string what = f.model.empty() ? "--heads " + std::to_string(opt.n_heads) + " --kv-heads " +
                                                 std::to_string(opt.n_kv_heads) + " --head-dim " +
                                                 std::to_string(opt.head_dim)
                                           : "--model " + f.model;
  if (Status st = check_memory(need, what + " --max-len " + std::to_string(f.max_len)); !st.ok()) {
    return fail_input(st.message());
  }
  opt.kv_lens = opt.q_lens;
  opt.repeats = f.repeats;
  opt.min_seconds = f.min_seconds;
  const bool progress = stderr_is_terminal();
  Result<CostTable> table = kernels::profile_attention(opt, [&](const std::string& line) {
    if (progress) std::fprintf(stderr, "\r%-60s", line.c_str());
  });
  if (progress) std::fprintf(stderr, "\r%60s\r", "");
  if (!table.ok()) return fail(table.status());
  const std::string text = to_json(*table).dump(2) + "\n";
  if (Status st = to_stdout ? write_stdout(text) : write_file_atomic(f.out, text); !st.ok()) return fail(st);
  return kExitOk;
}

Runner setup(CLI::App& app) {
  auto f = std::make_shared<ProfileFlags>();
  app.add_option("--out", f->out, "write the JSON table here (default: stdout)");
  app.add_option("--model", f->model, "take heads, kv heads and head_dim from a model preset");
  app.add_option("--heads", f->heads, "query heads (default 1)")->check(CLI::PositiveNumber);
  app.add_option("--kv-heads", f->kv_heads, "key/value heads (default 1)")->check(CLI::PositiveNumber);
  app.add_option("--head-dim", f->head_dim, "head dimension (default 128)")->check(CLI::PositiveNumber);
  app.add_option("--min-len", f->min_len, "smallest grid length (default 128)")->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  app.add_option("--max-len", f->max_len, "largest grid length (default 32768); the grid doubles")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  app.add_option("--repeats", f->repeats, "timed repetitions per point (median; default 3)")->check(CLI::Range(1, 100));
  app.add_option("--min-seconds", f->min_seconds, "stop repeating a point after this long, finite >= 0 (default 0.5)");
  return [f] { return run(*f); };
}

}  // namespace

DISTCA_REGISTER_COMMAND(profile, {"profile", "", "Measure attention time on a (q_len, kv_len) grid: the planner's cost table",
                                  45, &setup});

}  // namespace distca::cli
