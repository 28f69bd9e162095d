// distca.plan and the Plan, Exchange and Server views (docs/python.md, "Arrays").
//
// plan() runs make_plan, the library call `distca plan` makes, with the GIL released. The
// plan's own vectors (cu_seqlens) are viewed in place; the layout arrays (dense counts and
// displacements, row identities, fused-call gather indices) are materialised once per rank or
// server on first access, kept in the plan's state and viewed from there. Every view's base
// owns a reference to that state, so arrays stay valid after the Plan object is gone.
#include <pybind11/stl.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "bind_common.h"
#include "distca/core/memory.h"
#include "distca/core/specs.h"
#include "distca/data/batch_memory.h"
#include "distca/cost/cost_model.h"
#include "distca/plan/doc_index.h"
#include "distca/plan/plan.h"
#include "distca/plan/plan_json.h"
#include "distca/plan/plan_memory.h"
#include "distca/plan/validate.h"

namespace distca::python {
namespace {

// One exchange of one rank, dense over peers. rows: (n, 2) (doc, position) of every row of
// the buffer in buffer order; local: (n) the row's index in the rank's token buffer, -1 when
// the rank does not hold it (a server's buffers).
struct ExchangeArrays {
  std::vector<int64_t> send_counts, send_displs, recv_counts, recv_displs;  // [ranks]
  std::vector<int64_t> send_rows, recv_rows;                                // [n * 2]
  std::vector<int64_t> send_local, recv_local;                              // [n]
};

struct RankCache {
  std::array<ExchangeArrays, kNumExchanges> exchanges;
  std::vector<int64_t> token_rows;  // [tokens * 2]: (doc, position) of every token-buffer row
};

struct ServerCache {
  std::vector<int64_t> tasks;      // [tasks * 6]: doc, q_begin, q_end, home, q_offset, n_segments
  std::vector<int64_t> q_source;   // [total_q]
  std::vector<int64_t> kv_source;  // [total_kv]
};

struct PlanState {
  Plan plan;
  std::shared_ptr<const Batch> input;
  PlanSetup setup;
  std::string model;
  std::string dist, layout, batch_file;
  uint64_t seed = 0;
  double plan_seconds = 0;
  std::optional<DocumentIndex> index;  // of plan.batch, built on first use
  std::vector<std::unique_ptr<RankCache>> rank_cache;
  std::vector<std::unique_ptr<ServerCache>> server_cache;

  const AttentionCostModel* cost() const { return setup.options.cost; }
  int64_t ranks() const { return static_cast<int64_t>(plan.ranks.size()); }
  const DocumentIndex& doc_index() {
    if (!index) index.emplace(plan.batch);
    return *index;
  }
};
using StatePtr = std::shared_ptr<PlanState>;

int64_t checked_rank(const PlanState& s, int64_t rank) {
  if (rank < 0 || rank >= s.ranks()) {
    throw py::index_error("rank " + std::to_string(rank) + " out of range [0, " + std::to_string(s.ranks()) + ")");
  }
  return rank;
}

ExchangeKind parse_kind(const std::string& name) {
  for (int k = 0; k < kNumExchanges; ++k) {
    if (name == exchange_name(static_cast<ExchangeKind>(k))) return static_cast<ExchangeKind>(k);
  }
  raise_value_error("unknown exchange '" + name + "' (expected q, kv, o_lse, do, dq or dkv)");
}

void dense(const PeerVector<int64_t>& counts, std::vector<int64_t>& c, std::vector<int64_t>& d) {
  c = counts.dense();
  d.resize(c.size());
  int64_t at = 0;
  for (size_t p = 0; p < c.size(); ++p) {
    d[p] = at;
    at += c[p];
  }
}

void expand(const PeerVector<std::vector<RowBlock>>& blocks, int64_t rows_total, int64_t rank,
            const DocumentIndex& index, std::vector<int64_t>& rows, std::vector<int64_t>& local) {
  rows.reserve(static_cast<size_t>(2 * rows_total));
  local.reserve(static_cast<size_t>(rows_total));
  for (const auto& [peer, list] : blocks.entries()) {
    (void)peer;
    for (const RowBlock& b : list) {
      // One lookup per held run the block crosses (a block usually lies in one piece).
      for (int64_t pos = b.begin; pos < b.end;) {
        const HeldRun& run = index.run_at(b.doc, pos);
        const int64_t stop = std::min(run.end, b.end);
        const bool held = run.rank == rank;
        for (; pos < stop; ++pos) {
          rows.push_back(b.doc);
          rows.push_back(pos);
          local.push_back(held ? run.local_row + (pos - run.begin) : -1);
        }
      }
    }
  }
}

// The arrays are materialised only once they fit (a plan's rows are counted, not stored:
// a batch of 2^40 tokens plans in kilobytes but its row arrays would not).
void check_cache_memory(double int64s, const std::string& what) {
  check(check_memory(8 * int64s, what));
}

RankCache& rank_cache(PlanState& s, int64_t rank) {
  if (s.rank_cache.empty()) s.rank_cache.resize(static_cast<size_t>(s.ranks()));
  auto& slot = s.rank_cache[static_cast<size_t>(rank)];
  if (!slot) {
    const RankPlan& rp = s.plan.ranks[static_cast<size_t>(rank)];
    double rows = 0;
    for (const Exchange& e : rp.exchanges) rows += static_cast<double>(e.send_rows() + e.recv_rows());
    check_cache_memory(3 * rows + 2 * static_cast<double>(rp.tokens) + 4.0 * kNumExchanges * static_cast<double>(s.ranks()),
                       "the row arrays of rank " + std::to_string(rank));
    auto c = std::make_unique<RankCache>();
    const DocumentIndex& index = s.doc_index();
    for (int k = 0; k < kNumExchanges; ++k) {
      const Exchange& e = s.plan.ranks[static_cast<size_t>(rank)].exchanges[static_cast<size_t>(k)];
      ExchangeArrays& a = c->exchanges[static_cast<size_t>(k)];
      dense(e.send_counts, a.send_counts, a.send_displs);
      dense(e.recv_counts, a.recv_counts, a.recv_displs);
      expand(e.send_blocks, e.send_rows(), rank, index, a.send_rows, a.send_local);
      expand(e.recv_blocks, e.recv_rows(), rank, index, a.recv_rows, a.recv_local);
    }
    for (const Piece& piece : s.plan.batch.per_rank[static_cast<size_t>(rank)]) {
      for (int64_t i = 0; i < piece.len; ++i) {
        c->token_rows.push_back(piece.doc);
        c->token_rows.push_back(piece.offset + i);
      }
    }
    slot = std::move(c);
  }
  return *slot;
}

ServerCache& server_cache(PlanState& s, int64_t rank) {
  if (s.server_cache.empty()) s.server_cache.resize(static_cast<size_t>(s.ranks()));
  auto& slot = s.server_cache[static_cast<size_t>(rank)];
  if (!slot) {
    const ServerPlan& sp = s.plan.servers[static_cast<size_t>(rank)];
    const double rows_q = sp.cu_seqlens_q.empty() ? 0 : static_cast<double>(sp.cu_seqlens_q.back());
    const double rows_kv = sp.cu_seqlens_k.empty() ? 0 : static_cast<double>(sp.cu_seqlens_k.back());
    check_cache_memory(6 * static_cast<double>(sp.tasks.size()) + rows_q + rows_kv,
                       "the gather indices of server " + std::to_string(rank));
    auto c = std::make_unique<ServerCache>();
    const int64_t tokens = s.plan.ranks[static_cast<size_t>(rank)].tokens;
    for (const ServerTask& t : s.plan.servers[static_cast<size_t>(rank)].tasks) {
      const TaskPlacement& p = t.task;
      for (int64_t v : {p.doc, p.q_begin, p.q_end, p.home, t.q_offset, static_cast<int64_t>(t.kv.size())}) {
        c->tasks.push_back(v);
      }
      const int64_t q_base = p.home == rank ? t.q_offset : tokens + t.q_offset;
      for (int64_t i = 0; i < p.q_end - p.q_begin; ++i) c->q_source.push_back(q_base + i);
      for (const Segment& seg : t.kv) {
        const int64_t base = seg.received ? tokens + seg.offset : seg.offset;
        for (int64_t i = 0; i < seg.len; ++i) c->kv_source.push_back(base + i);
      }
    }
    slot = std::move(c);
  }
  return *slot;
}

py::array view(const std::vector<int64_t>& v, const StatePtr& s) {
  return readonly_view(v.data(), {static_cast<py::ssize_t>(v.size())}, keep_alive(s));
}
py::array view2(const std::vector<int64_t>& v, py::ssize_t cols, const StatePtr& s) {
  return readonly_view(v.data(), {static_cast<py::ssize_t>(v.size()) / cols, cols}, keep_alive(s));
}
py::array view_i32(const std::vector<int32_t>& v, const StatePtr& s) {
  return readonly_view(v.data(), {static_cast<py::ssize_t>(v.size())}, keep_alive(s));
}

struct PyExchange {
  StatePtr state;
  int64_t rank = 0;
  ExchangeKind kind = ExchangeKind::kQ;
  const ExchangeArrays& arrays() const { return rank_cache(*state, rank).exchanges[static_cast<size_t>(kind)]; }
};

struct PyServer {
  StatePtr state;
  int64_t rank = 0;
  const ServerPlan& sp() const { return state->plan.servers[static_cast<size_t>(rank)]; }
};

struct PyPlan {
  StatePtr state;
};

nlohmann::json summary_json(const PlanState& s) {
  nlohmann::json out = plan_summary_json(s.plan, s.plan_seconds);
  out["model"] = s.model;
  if (!s.dist.empty()) {
    out["dist"] = s.dist;
    out["layout"] = s.layout;
    out["seed"] = s.seed;
  } else {
    // `distca plan --batch FILE` reports the file; a batch built in memory has none.
    out["batch_file"] = s.batch_file.empty() ? nlohmann::json(nullptr) : nlohmann::json(s.batch_file);
  }
  return out;
}

ModelSpec resolve_model(const py::object& model) {
  if (py::isinstance<py::str>(model)) {
    auto m = model_preset(model.cast<std::string>());
    if (!m.ok()) raise_status(Status(m.status().code(), "--model: " + m.status().message()));
    return std::move(m).value();
  }
  if (py::isinstance<ModelSpec>(model)) {
    ModelSpec m = model.cast<ModelSpec>();
    auto st = m.validate();
    if (!st.ok()) raise_status(Status(st.code(), "--model: " + st.message()));
    return m;
  }
  throw py::type_error("model must be a preset name (str) or a distca.ModelSpec");
}

// The CLI's checks, in its order (make_plan_setup, then `distca plan`'s): the model, the
// flags, percp's degree against a drawn batch's ranks, then the options against the batch.
// Returns the model's name.
std::string prepare(const PyBatch& batch, const py::object& model, const PlanFlags& flags, PlanSetup& setup) {
  ModelSpec m = resolve_model(model);
  check(make_plan_setup(m, flags, setup));
  const SchedulerSpec& spec = setup.spec;
  // A drawn batch: `distca plan --dist ...` names --ranks here; a given one (--batch) is
  // checked by ScheduleOptions::validate below.
  if (!batch.dist.empty() && spec.kind == SchedulerKind::kPerCp && batch.batch->ranks % spec.cp_degree != 0) {
    raise_value_error("--scheduler " + spec.name() + ": CP degree " + std::to_string(spec.cp_degree) +
                      " does not divide --ranks " + std::to_string(batch.batch->ranks));
  }
  check(setup.options.validate(*batch.batch, spec));
  return m.name;
}

// The arguments a plan's memory grows with, for check_memory's message: the CLI's flags for a
// drawn batch or a file, else the batch's size.
std::string plan_what(const PyBatch& batch) {
  const Batch& b = *batch.batch;
  if (!batch.dist.empty()) {
    return "--ranks " + std::to_string(b.ranks) + " --tokens-per-rank " + std::to_string(batch.tokens_per_rank);
  }
  if (!batch.batch_file.empty()) return "--batch " + batch.batch_file;
  return "a batch of " + std::to_string(b.ranks) + " ranks and " +
         std::to_string(static_cast<int64_t>(shape_of(b).pieces)) + " pieces";
}

PyPlan make(const PyBatch& batch, const py::object& model, const std::string& scheduler, double tolerance,
            int64_t align_rows, double wlb_mem_cap, const std::string& dtype, const std::string& cost_table) {
  auto s = std::make_shared<PlanState>();
  s->model = prepare(batch, model, PlanFlags{scheduler, dtype, tolerance, wlb_mem_cap, align_rows, cost_table}, s->setup);
  const SchedulerSpec& spec = s->setup.spec;
  s->input = batch.batch;
  s->dist = batch.dist;
  s->layout = batch.layout;
  s->seed = batch.seed;
  s->batch_file = batch.batch_file;
  // `distca plan`'s steps and memory checks, each before the allocation it covers
  // (plan/plan_memory.h); plan_seconds leaves out the check between the two phases.
  const std::string what = plan_what(batch);
  check(check_memory(plan_schedule_bytes(*batch.batch, spec),
                     what + (spec.kind == SchedulerKind::kPerCp ? " --scheduler " + spec.name() : "")));
  Result<Plan> plan = Status::internal("not planned");
  {
    py::gil_scoped_release release;
    plan = make_plan_within_memory(*batch.batch, spec, s->setup.options, 0, what, &s->plan_seconds);
  }
  s->plan = take(std::move(plan));
  return PyPlan{std::move(s)};
}

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// For bench/bench_python_plan.py: make_plan timed in C++ alone, `repeats` times: (wall
// seconds, process CPU seconds) each. CPU time leaves out the time the process waited for a
// core (a shared machine preempts a 2 ms call for a whole time slice).
std::vector<std::pair<double, double>> time_make_plan(const PyBatch& batch, const py::object& model,
                                                      const std::string& scheduler, double tolerance, int64_t repeats) {
  if (repeats < 1 || repeats > 1000000) raise_value_error("repeats must be in 1..1000000 (got " + std::to_string(repeats) + ")");
  PlanSetup p;
  PlanFlags flags;
  flags.scheduler = scheduler;
  flags.tolerance = tolerance;
  prepare(batch, model, flags, p);
  check(check_memory(plan_schedule_bytes(*batch.batch, p.spec), plan_what(batch)));
  std::vector<std::pair<double, double>> out;
  Status st;
  {
    py::gil_scoped_release release;
    for (int64_t i = 0; i < repeats && st.ok(); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      const double c0 = process_cpu_seconds();
      auto r = make_plan(*batch.batch, p.spec, p.options);
      const double c1 = process_cpu_seconds();
      out.emplace_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), c1 - c0);
      if (!r.ok()) st = r.status();
    }
  }
  check(st);
  return out;
}

void bind_views(py::module_& m) {
  py::class_<PyExchange>(m, "Exchange", R"doc(
One all-to-all-v of one rank (plan.exchange(rank, kind)); kinds q, kv, o_lse, do, dq, dkv.

Arrays (read-only int64 views owned by the plan; docs/python.md, "Arrays"):
  send_counts, send_displs, recv_counts, recv_displs   (ranks,) rows per peer; displs are
      the dense prefix sums of the counts (an all-to-all-v's input/output split offsets)
  send_rows, recv_rows     (n, 2) (doc, position) of every row of the send / receive
      buffer, in buffer order: peers ascending, each peer's rows in the canonical order
  send_local, recv_local   (n,) that row's index in this rank's token buffer, -1 where this
      rank does not hold it
row_bytes: bytes per row on the wire (the plan's byte accounting).
)doc")
      .def_property_readonly("rank", [](const PyExchange& e) { return e.rank; })
      .def_property_readonly("kind", [](const PyExchange& e) { return std::string(exchange_name(e.kind)); })
      .def_property_readonly("row_bytes", [](const PyExchange& e) {
        return e.state->plan.ranks[static_cast<size_t>(e.rank)].exchange(e.kind).row_bytes;
      })
      .def_property_readonly("send_counts", [](const PyExchange& e) { return view(e.arrays().send_counts, e.state); })
      .def_property_readonly("send_displs", [](const PyExchange& e) { return view(e.arrays().send_displs, e.state); })
      .def_property_readonly("recv_counts", [](const PyExchange& e) { return view(e.arrays().recv_counts, e.state); })
      .def_property_readonly("recv_displs", [](const PyExchange& e) { return view(e.arrays().recv_displs, e.state); })
      .def_property_readonly("send_rows", [](const PyExchange& e) { return view2(e.arrays().send_rows, 2, e.state); })
      .def_property_readonly("recv_rows", [](const PyExchange& e) { return view2(e.arrays().recv_rows, 2, e.state); })
      .def_property_readonly("send_local", [](const PyExchange& e) { return view(e.arrays().send_local, e.state); })
      .def_property_readonly("recv_local", [](const PyExchange& e) { return view(e.arrays().recv_local, e.state); })
      .def("__repr__", [](const PyExchange& e) {
        return "<distca.Exchange rank=" + std::to_string(e.rank) + " kind=" + exchange_name(e.kind) + ">";
      });

  py::class_<PyServer>(m, "Server", R"doc(
The fused attention call of one server (plan.server(rank)), tasks in fused-call order.

  cu_seqlens_q, cu_seqlens_k  (tasks + 1,) int32, views of the plan: task t owns fused
      query rows [cu_q[t], cu_q[t+1]) and K/V rows [cu_k[t], cu_k[t+1]) (its whole context
      [0, q_end), causal, bottom-right aligned)
  tasks      (tasks, 6) int64: doc, q_begin, q_end, home, q_offset, kv segments
  q_source   (total_q,) int64: fused query row j comes from row q_source[j] of
      concat(this rank's token buffer, its q receive buffer); the same index places fused
      O/dQ row j into concat(token buffer, o_lse / dq send buffer)
  kv_source  (total_kv,) int64: fused K/V row j comes from row kv_source[j] of
      concat(token buffer, kv receive buffer); fused dK/dV rows are SUMMED (in fused order)
      into concat(token buffer, dkv send buffer) at the same indices
load: the server's load (cost units of the plan).
)doc")
      .def_property_readonly("rank", [](const PyServer& s) { return s.rank; })
      .def_property_readonly("num_tasks", [](const PyServer& s) { return static_cast<int64_t>(s.sp().tasks.size()); })
      .def_property_readonly("load", [](const PyServer& s) { return s.sp().load; })
      .def_property_readonly("cu_seqlens_q", [](const PyServer& s) { return view_i32(s.sp().cu_seqlens_q, s.state); })
      .def_property_readonly("cu_seqlens_k", [](const PyServer& s) { return view_i32(s.sp().cu_seqlens_k, s.state); })
      .def_property_readonly("tasks", [](const PyServer& s) {
        return view2(server_cache(*s.state, s.rank).tasks, 6, s.state);
      })
      .def_property_readonly("q_source", [](const PyServer& s) { return view(server_cache(*s.state, s.rank).q_source, s.state); })
      .def_property_readonly("kv_source", [](const PyServer& s) { return view(server_cache(*s.state, s.rank).kv_source, s.state); })
      .def("__repr__", [](const PyServer& s) {
        return "<distca.Server rank=" + std::to_string(s.rank) + " tasks=" + std::to_string(s.sp().tasks.size()) + ">";
      });
}

}  // namespace

void bind_plan(py::module_& m) {
  bind_views(m);
  py::class_<PyPlan>(m, "Plan", R"doc(
A plan: the CA-tasks of a batch placed on servers, with every exchange layout (the value
`distca plan` computes; docs/plan-format.md). Made by distca.plan(); immutable.

  summary            dict, the keys of `distca plan --json`
  ranks, num_tasks, scheduler
  tokens(rank)       rows of the rank's token buffer
  token_rows(rank)   (tokens, 2) int64: (doc, position) of each of those rows
  exchange(rank, kind) -> Exchange   kind: q | kv | o_lse | do | dq | dkv
  server(rank) -> Server             the fused call (cu_seqlens, gather indices)
  validate()         the independent validator (RuntimeError naming the first failed rule)
  to_dict()          the whole plan, as the "plan" key of `distca plan --json --full`
)doc")
      .def_property_readonly("summary", [](const PyPlan& p) { return json_to_python(summary_json(*p.state).dump()); },
                             "dict with the keys of `distca plan --json` (plan_seconds: make_plan's wall time)")
      .def_property_readonly("ranks", [](const PyPlan& p) { return p.state->ranks(); })
      .def_property_readonly("num_tasks", [](const PyPlan& p) { return p.state->plan.num_tasks(); })
      .def_property_readonly("scheduler", [](const PyPlan& p) { return p.state->plan.scheduler.name(); })
      .def_property_readonly("plan_seconds", [](const PyPlan& p) { return p.state->plan_seconds; })
      .def_property_readonly("batch", [](const PyPlan& p) {
        PyBatch b;
        b.batch = std::make_shared<const Batch>(p.state->plan.batch);
        return b;
      }, "the batch the homes and local rows refer to (wlb: its re-packed batch; otherwise the input)")
      .def("tokens", [](const PyPlan& p, int64_t rank) {
        return p.state->plan.ranks[static_cast<size_t>(checked_rank(*p.state, rank))].tokens;
      }, py::arg("rank"))
      .def("token_rows", [](const PyPlan& p, int64_t rank) {
        checked_rank(*p.state, rank);
        return view2(rank_cache(*p.state, rank).token_rows, 2, p.state);
      }, py::arg("rank"), "int64 (tokens, 2): (doc, position) of every row of the rank's token buffer, in order.")
      .def_property_readonly("row_bytes", [](const PyPlan& p) {
        const RowBytes& b = p.state->plan.row_bytes;
        py::dict d;
        d["q"] = b.q;
        d["kv"] = b.kv;
        d["o"] = b.o;
        d["lse"] = b.lse;
        return d;
      }, "bytes per row of q, kv (K and V), o and lse in the plan's byte accounting")
      .def("exchange", [](const PyPlan& p, int64_t rank, const std::string& kind) {
        checked_rank(*p.state, rank);
        return PyExchange{p.state, rank, parse_kind(kind)};
      }, py::arg("rank"), py::arg("kind"), "The layout of exchange `kind` (q, kv, o_lse, do, dq, dkv) on `rank`.")
      .def("server", [](const PyPlan& p, int64_t rank) {
        checked_rank(*p.state, rank);
        return PyServer{p.state, rank};
      }, py::arg("rank"), "The fused attention call of server `rank`.")
      .def("validate", [](const PyPlan& p) {
        Status st;
        {
          py::gil_scoped_release release;
          st = validate_plan(p.state->plan, *p.state->input, p.state->cost());
        }
        if (!st.ok()) throw std::runtime_error("the plan failed validation: " + st.message());
      }, "Checks the plan against its input batch with the independent validator (plan/validate.h).")
      .def("to_dict", [](const PyPlan& p) {
        // The JSON, its text and the Python objects made of it: three times `--full`'s estimate.
        check(check_memory(3 * plan_json_bytes(static_cast<double>(p.state->ranks())),
                           "Plan.to_dict of " + std::to_string(p.state->ranks()) + " ranks"));
        return json_to_python(plan_to_json(p.state->plan).dump());
      },
           "The whole plan as `distca plan --json --full` prints it under \"plan\" (large: dense per peer).")
      .def("__repr__", [](const PyPlan& p) {
        return "<distca.Plan scheduler=" + p.state->plan.scheduler.name() + " ranks=" + std::to_string(p.state->ranks()) +
               " tasks=" + std::to_string(p.state->plan.num_tasks()) + ">";
      });
  m.def("plan", &make, py::arg("batch"), py::kw_only(), py::arg("model") = "llama-8b", py::arg("scheduler") = "cad",
        py::arg("tolerance") = 0.05, py::arg("align_rows") = 1, py::arg("wlb_mem_cap") = 1.2, py::arg("dtype") = "bf16",
        py::arg("cost_table") = "", R"doc(
Plans `batch` as `distca plan` does (make_plan; the GIL is released while it runs).

model: a preset name (model_presets()) or a ModelSpec, for the byte counts.
scheduler: colocated | wlb | percp:C | cad | cad-symmetric.
tolerance: cad, every server within tolerance * mean load, in [0, 1].
align_rows: cad, cut documents only at multiples of this many positions.
wlb_mem_cap: wlb's per-rank token cap over the mean (>= 1).
dtype: bf16 | fp32, the activation type of the byte counts.
cost_table: a `distca profile` table to balance predicted seconds ("" = causal pairs).
Bad arguments raise ValueError with the CLI's message; the plan is not validated here
(call Plan.validate(), which `distca plan` runs on every plan).
)doc");
  m.def("_time_make_plan", &time_make_plan, py::arg("batch"), py::arg("model"), py::arg("scheduler"),
        py::arg("tolerance"), py::arg("repeats"),
        "Benchmark helper: (wall, process CPU) seconds of each of `repeats` make_plan calls timed in C++ alone.");
}

}  // namespace distca::python
