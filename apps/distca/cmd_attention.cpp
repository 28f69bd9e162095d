// `distca attention`: run the attention kernels on tensors from .npy files (a debugging and
// interoperability tool: feed it from numpy or PyTorch, compare with your own implementation).
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "command.h"
#include "distca/core/io.h"
#include "distca/core/memory.h"
#include "distca/core/npy.h"
#include "distca/kernels/attention_inputs.h"

namespace distca::cli::cmd_attention {
namespace {

struct AttentionFlags {
  std::string q, k, v, cu_q, cu_k, d_o, out_dir;
  bool no_causal = false;
  bool reference = false;
  double scale = 0;
  bool scale_given = false;
};

// Loads `path` (given with `flag`) and checks dtype and rank; errors name the flag and file.
Result<NpyArray> load(const std::string& flag, const std::string& path, NpyDtype dtype, size_t rank) {
  Result<NpyArray> a = read_npy(path);
  if (!a.ok()) return Status(a.status().code(), flag + ": " + a.status().message());
  if (a->dtype != dtype) {
    return Status::invalid_argument(flag + " '" + path + "': dtype " + npy_dtype_name(a->dtype) + ", expected " +
                                    npy_dtype_name(dtype));
  }
  if (a->shape.size() != rank) {
    return Status::invalid_argument(flag + " '" + path + "': " + std::to_string(a->shape.size()) +
                                    "-d array, expected " + std::to_string(rank) + "-d");
  }
  return a;
}

int run(const AttentionFlags& f) {
  if (f.scale_given) {
    if (Status st = kernels::check_softmax_scale(f.scale, "--scale"); !st.ok()) return fail(st);
  }
  const bool backward = !f.d_o.empty();
  auto q = load("--q", f.q, NpyDtype::kFloat32, 3);
  if (!q.ok()) return fail(q.status());
  auto k = load("--k", f.k, NpyDtype::kFloat32, 3);
  if (!k.ok()) return fail(k.status());
  auto v = load("--v", f.v, NpyDtype::kFloat32, 3);
  if (!v.ok()) return fail(v.status());
  auto cq = load("--cu-seqlens-q", f.cu_q, NpyDtype::kInt32, 1);
  if (!cq.ok()) return fail(cq.status());
  auto ck = load("--cu-seqlens-k", f.cu_k, NpyDtype::kInt32, 1);
  if (!ck.ok()) return fail(ck.status());
  Result<NpyArray> dO = Status::not_found("unused");
  if (backward) {
    dO = load("--do", f.d_o, NpyDtype::kFloat32, 3);
    if (!dO.ok()) return fail(dO.status());
  }

  kernels::AttentionInputs in;
  in.q = {"--q", q->shape};
  in.k = {"--k", k->shape};
  in.v = {"--v", v->shape};
  in.cu_seqlens_q = {"--cu-seqlens-q", cq->shape};
  in.cu_seqlens_k = {"--cu-seqlens-k", ck->shape};
  in.scale_name = "--scale";
  if (backward) in.d_o = kernels::AttentionArray{"--do", dO->shape};
  if (Status st = kernels::check_shapes(in); !st.ok()) return fail(st);
  auto made = kernels::make_params(in, q->f32.data(), k->f32.data(), v->f32.data(), cq->i32.data(), ck->i32.data(),
                                   !f.no_causal, f.scale_given ? static_cast<float>(f.scale) : 0.0f);
  if (!made.ok()) return fail(made.status());
  kernels::AttentionParams p = *made;
  if (backward) p.d_o = dO->f32.data();
  const auto& qs = q->shape;
  const auto& ks = k->shape;

  // Every output is checked before the work, and written all or none after it.
  const std::string dir = f.out_dir + "/";
  std::vector<std::string> names = {"o.npy", "lse.npy"};
  if (backward) names.insert(names.end(), {"dq.npy", "dk.npy", "dv.npy"});
  if (Status st = check_output_dir(f.out_dir, /*create=*/true); !st.ok()) return fail_input("--out-dir: " + st.message());
  for (const std::string& n : names) {
    if (Status st = check_output_path(dir + n); !st.ok()) return fail_input("--out-dir: " + st.message());
  }
  // Outputs (o, lse; dq, dk, dv) twice (the arrays and their .npy bytes) and the kernels' scratch.
  const double need = 2 * kernels::attention_output_bytes(in) +
                      kernels::attention_scratch_bytes(qs[0], qs[1], ks[1], qs[2], backward, omp_get_max_threads());
  if (Status st = check_memory(need, in.describe()); !st.ok()) {
    return fail_input(st.message());
  }
  const kernels::AttentionOutputs out = kernels::run_attention(p, backward, f.reference);
  const int64_t H = qs[1], Hkv = ks[1], d = qs[2];
  std::vector<std::pair<std::string, std::string>> files;
  files.emplace_back(dir + "o.npy", npy_bytes(out.o.data(), {qs[0], H, d}));
  files.emplace_back(dir + "lse.npy", npy_bytes(out.lse.data(), {H, qs[0]}));
  if (backward) {
    files.emplace_back(dir + "dq.npy", npy_bytes(out.dq.data(), {qs[0], H, d}));
    files.emplace_back(dir + "dk.npy", npy_bytes(out.dk.data(), {ks[0], Hkv, d}));
    files.emplace_back(dir + "dv.npy", npy_bytes(out.dv.data(), {ks[0], Hkv, d}));
  }
  if (Status st = write_files_atomic(files); !st.ok()) return fail(st);
  return kExitOk;
}

Runner setup(CLI::App& app) {
  auto f = std::make_shared<AttentionFlags>();
  app.add_option("--q", f->q, "queries, float32 (total_q, n_heads, head_dim)")->required();
  app.add_option("--k", f->k, "keys, float32 (total_kv, n_kv_heads, head_dim)")->required();
  app.add_option("--v", f->v, "values, float32 (total_kv, n_kv_heads, head_dim)")->required();
  app.add_option("--cu-seqlens-q", f->cu_q, "int32 (n_tasks + 1) query offsets")->required();
  app.add_option("--cu-seqlens-k", f->cu_k, "int32 (n_tasks + 1) key/value offsets")->required();
  app.add_option("--out-dir", f->out_dir, "writes o.npy, lse.npy (and dq/dk/dv.npy with --do)")->required();
  app.add_option("--do", f->d_o, "output gradient, float32 like --q: also run the backward");
  CLI::Option* scale = app.add_option("--scale", f->scale, "softmax scale, finite and > 0 (default 1/sqrt(head_dim))");
  app.add_flag("--no-causal", f->no_causal, "every query sees every key of its task");
  app.add_flag("--reference", f->reference, "use the naive fp32 reference instead of the fast path");
  return [f, scale] {
    f->scale_given = scale->count() > 0;
    return run(*f);
  };
}

}  // namespace

DISTCA_REGISTER_COMMAND(attention, {"attention", "", "Run core attention (forward, and backward with --do) on .npy tensors",
                                    50, &setup});

}  // namespace distca::cli::cmd_attention
