// The runtime under mpirun (label `mpi`): the same checks as the local test, one process per
// rank. Every rank draws the same batch and computes the same whole-document reference from
// the seed, runs the dispatcher and the runner for every scheduler (and CAD's mixed-direction
// pipeline ticks), and compares its own rows. A failed check ends the job through
// Communicator::fail (MPI_Abort), so a failure never hangs the other ranks. Rank 0 prints one
// line per plan and "OK" at the end. With --disagree the ranks' plans differ and the job must
// fail on the first exchange (test runtime_mpi_disagree).
#include <cstdio>
#include <string>

#include "distca/comm/mpi.h"
#include "distca/plan/validate.h"
#include "runtime_check.h"

using namespace distca;
using namespace distca::runtime;
using namespace distca::runtime::testing;

namespace {

void check(comm::Communicator& comm, const Status& st, const std::string& what) {
  if (!st.ok()) comm.fail(Status::internal(what + ": " + st.message()));
}

// Max of every rank's comparison (for rank 0's report); all ranks call it.
Comparison reduce(comm::Communicator& comm, const Comparison& mine) {
  std::vector<double> v = {mine.o.max_abs, mine.lse.max_abs, mine.dq.max_abs, mine.dk.max_abs, mine.dv.max_abs,
                           static_cast<double>(mine.o.unequal), static_cast<double>(mine.dq.unequal),
                           static_cast<double>(mine.dk.unequal), mine.dk_err_runtime, mine.dk_err_kernel,
                           static_cast<double>(mine.dv.unequal), static_cast<double>(mine.lse.unequal)};
  Comparison out;
  for (size_t i = 0; i < v.size(); ++i) {
    auto g = comm.all_gather_value(v[i]);
    check(comm, g.status(), "all_gather");
    double m = 0;
    for (double x : g.value()) m = std::max(m, x);
    v[i] = m;
  }
  out.o.max_abs = v[0], out.lse.max_abs = v[1], out.dq.max_abs = v[2], out.dk.max_abs = v[3], out.dv.max_abs = v[4];
  out.o.unequal = static_cast<int64_t>(v[5]), out.dq.unequal = static_cast<int64_t>(v[6]);
  out.dk.unequal = static_cast<int64_t>(v[7]);
  out.dk_err_runtime = v[8], out.dk_err_kernel = v[9];
  out.dv.unequal = static_cast<int64_t>(v[10]), out.lse.unequal = static_cast<int64_t>(v[11]);
  return out;
}

// --disagree: every rank plans its own batch, so the ranks' plans disagree on what they
// exchange. The first exchange must end the job with the receiving rank's count mismatch
// ("... which expects ..."), never deliver another plan's rows into a buffer sized by this one.
int disagree(comm::Communicator& comm, const AttentionDims& dims) {
  const Batch batch = random_batch(comm.size(), 256, 700 + static_cast<uint64_t>(comm.rank()));
  auto plan = make_plan(batch, parse_scheduler("cad").value(), schedule_options(dims));
  check(comm, plan.status(), "plan");
  const int64_t rows = plan->ranks[static_cast<size_t>(comm.rank())].tokens;
  std::vector<float> q(static_cast<size_t>(rows * dims.q_floats()), 0.5f), kv(static_cast<size_t>(rows * dims.kv_floats()), 0.5f);
  std::vector<float> o(q.size()), lse(static_cast<size_t>(rows * dims.n_heads));
  auto d = CaDispatcher::create(comm, plan.value(), dims);
  check(comm, d.status(), "dispatcher");
  check(comm, d.value()->forward(0, q, kv, kv, o, lse), "disagreeing plans");
  std::printf("no mismatch detected\n");
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  auto made = comm::make_mpi_communicator(&argc, &argv);
  if (!made.ok()) {
    std::fprintf(stderr, "mpi_runtime_test: %s\n", made.status().to_string().c_str());
    return 1;
  }
  comm::Communicator& comm = *made.value();
  const int n = comm.size();
  const AttentionDims dims{4, 2, 16, 0};
  if (argc > 1 && std::string(argv[1]) == "--disagree") return disagree(comm, dims);
  const Batch batch = random_batch(n, 512, 300 + static_cast<uint64_t>(n));
  const Problem pr = make_problem(batch, dims, 13, true);
  const ScheduleOptions opt = schedule_options(dims);
  const std::vector<Problem> layers = layer_problems(batch, dims, 23, 2, true);  // the runner's, each layer its own
  for (const std::string& name : scheduler_names(n)) {
    auto spec = parse_scheduler(name);
    check(comm, spec.status(), name);
    auto plan = make_plan(batch, spec.value(), opt);
    check(comm, plan.status(), name);
    check(comm, validate_plan(plan.value(), batch, nullptr), name + " validate_plan");
    RankOutputs out;
    check(comm, run_dispatcher(comm, pr, plan.value(), &out), name + " dispatcher");
    const Comparison c = compare(pr, plan->batch, comm.rank(), out);
    check(comm, check_close(c), name + " rank " + std::to_string(comm.rank()));
    const Comparison all = reduce(comm, c);
    if (comm.rank() == 0) std::printf("%-14s dispatcher: %s\n", name.c_str(), describe(all).c_str());

    // Ping-pong against single-stream (O and LSE bitwise; single-stream runs the whole plan in
    // one call, so its gradients only within rounding) and against the kernel, every layer its
    // own inputs; signal runs.
    auto np = plan_nano_batches(batch, spec.value(), opt);
    check(comm, np.status(), name + " nano plans");
    std::vector<RankOutputs> pp, ss, sig, sl;
    bool valid = false;
    check(comm, run_runner(comm, layers, np.value(), OverlapMode::kPingPong, nullptr, &pp, &valid), name + " pingpong");
    if (!valid) comm.fail(Status::internal(name + ": pingpong outputs flagged invalid"));
    check(comm, run_runner(comm, layers, np.value(), OverlapMode::kSingleStream, nullptr, &ss, &valid), name + " single-stream");
    for (size_t l = 0; l < layers.size(); ++l) {
      if (!(pp[l].o == ss[l].o && pp[l].lse == ss[l].lse)) {
        comm.fail(Status::internal(name + ": pingpong and single-stream forward differ on rank " + std::to_string(comm.rank())));
      }
    }
    check(comm, check_close(compare_layers(layers, np->full.batch, comm.rank(), ss)), name + " single-stream rank " + std::to_string(comm.rank()));
    // Stateless servers: the same bits.
    check(comm, run_runner(comm, layers, np.value(), OverlapMode::kPingPong, nullptr, &sl, &valid, true), name + " stateless");
    for (size_t l = 0; l < layers.size(); ++l) {
      if (!(pp[l].o == sl[l].o && pp[l].lse == sl[l].lse && pp[l].dq == sl[l].dq && pp[l].dk == sl[l].dk && pp[l].dv == sl[l].dv)) {
        comm.fail(Status::internal(name + ": stateless servers differ on rank " + std::to_string(comm.rank())));
      }
    }
    const Comparison cp = compare_layers(layers, np->full.batch, comm.rank(), pp);
    check(comm, check_close(cp), name + " pingpong rank " + std::to_string(comm.rank()));
    check(comm, run_runner(comm, layers, np.value(), OverlapMode::kSignal, nullptr, &sig, &valid), name + " signal");
    if (valid) comm.fail(Status::internal(name + ": signal outputs not flagged invalid"));
    const Comparison allp = reduce(comm, cp);
    if (comm.rank() == 0) std::printf("%-14s pingpong:   %s\n", name.c_str(), describe(allp).c_str());
  }
  // Mixed-direction pipeline ticks over two stages (on an even number of ranks): cad keeps a
  // stage's rows on its ranks, wlb re-packs them onto the idle stage's ranks too.
  for (const char* scheduler : {"cad", "wlb"}) {
    for (OverlapMode mode : {OverlapMode::kPingPong, OverlapMode::kSingleStream}) {
      if (n % 2 != 0) break;
      const std::string what = std::string("pipeline ticks, ") + scheduler + ", " + overlap_mode_name(mode);
      Comparison mine;
      check(comm, run_pipeline_ticks(comm, 2, 3, 2, dims, mode, scheduler, &mine), what);
      check(comm, check_close(mine), what + " rank " + std::to_string(comm.rank()));
      const Comparison all = reduce(comm, mine);
      if (comm.rank() == 0) std::printf("%-40s %s\n", what.c_str(), describe(all).c_str());
    }
  }
  check(comm, comm.barrier(), "barrier");
  if (comm.rank() == 0) std::printf("OK (%d ranks)\n", n);
  return 0;
}
