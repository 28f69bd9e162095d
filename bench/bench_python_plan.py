#!/usr/bin/python3
"""distca.plan() called from Python against C++ make_plan on the same batch, in one run.

Both sides plan the same batch with the same options, alternately (Python first on even
repeats, C++ first on odd ones, so drift hits both alike); each side's figure is the median
of its repeats. "python" is the whole distca.plan(...) call as a training loop sees it
(argument conversion, option checks, make_plan with the GIL released, the Plan object);
"c++" is make_plan alone, timed inside the module (distca._distca._time_make_plan). Both
are measured as wall time and as process CPU time: on a shared machine a call of a few
milliseconds is often preempted for a whole time slice, which CPU time leaves out. The
previous plan is freed outside the timed region.

  PYTHONPATH=build/release/python /usr/bin/python3 bench/bench_python_plan.py
  ... --ranks 512 --tokens-per-rank 524288 --dist prolong --scheduler cad --repeats 15 [--json]
docs/benchmarks.md ("Python planner") has a measured run.
"""

import argparse
import gc
import json
import statistics
import sys
import time

import distca
from distca import _distca


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=512)
    ap.add_argument("--tokens-per-rank", type=int, default=524288)
    ap.add_argument("--dist", default="prolong")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--scheduler", default="cad")
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--model", default="llama-8b")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args()
    if a.repeats < 1:
        ap.error("--repeats must be positive")
    try:
        batch = distca.workload(dist=a.dist, ranks=a.ranks, tokens_per_rank=a.tokens_per_rank, seed=a.seed)
    except ValueError as e:
        sys.exit(f"bench_python_plan: error: {e}")

    def python_once():
        t0, c0 = time.perf_counter(), time.process_time()
        p = distca.plan(batch, model=a.model, scheduler=a.scheduler, tolerance=a.tolerance)
        c1, t1 = time.process_time(), time.perf_counter()
        tasks = p.num_tasks
        del p  # freed outside the timed region
        return (t1 - t0, c1 - c0), tasks

    def cpp_once():
        return tuple(_distca._time_make_plan(batch, a.model, a.scheduler, a.tolerance, 1)[0])

    python_once()  # warm-up (page faults of the first large allocation), not counted
    cpp_once()
    py, cpp = [], []
    gc.disable()
    for i in range(a.repeats):
        if i % 2 == 0:
            t, tasks = python_once()
            py.append(t)
            cpp.append(cpp_once())
        else:
            cpp.append(cpp_once())
            t, tasks = python_once()
            py.append(t)
    gc.enable()
    med = lambda xs, j: statistics.median(x[j] for x in xs)  # noqa: E731
    out = {
        "ranks": a.ranks, "tokens_per_rank": a.tokens_per_rank, "dist": a.dist, "seed": a.seed,
        "scheduler": a.scheduler, "tolerance": a.tolerance, "model": a.model, "documents": batch.num_documents,
        "tasks": tasks, "repeats": a.repeats,
        "python_wall_median_s": med(py, 0), "cpp_wall_median_s": med(cpp, 0),
        "python_cpu_median_s": med(py, 1), "cpp_cpu_median_s": med(cpp, 1),
        "python_s": py, "cpp_s": cpp,
    }
    out["wall_ratio"] = out["python_wall_median_s"] / out["cpp_wall_median_s"]
    out["cpu_ratio"] = out["python_cpu_median_s"] / out["cpp_cpu_median_s"]
    if a.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{a.ranks} servers, {a.dist}, {a.tokens_per_rank} tokens per rank, {batch.num_documents} documents, "
          f"scheduler {a.scheduler}, {tasks} tasks; medians of {a.repeats}")
    print(f"  {'':28s} {'wall ms':>9s} {'CPU ms':>9s}")
    print(f"  {'distca.plan() from Python':28s} {1e3 * out['python_wall_median_s']:9.2f} "
          f"{1e3 * out['python_cpu_median_s']:9.2f}")
    print(f"  {'make_plan in C++':28s} {1e3 * out['cpp_wall_median_s']:9.2f} {1e3 * out['cpp_cpu_median_s']:9.2f}")
    print(f"  {'ratio':28s} {out['wall_ratio']:9.3f} {out['cpu_ratio']:9.3f}")


if __name__ == "__main__":
    main()
