#!/usr/bin/python3
"""The TP collectives of `bench simulate --validate`'s tensor-parallel runs against the profile.

For every tp<T>x<D>-<workload>.json in DIR (bench train JSON, TP 2; and .launch<k>.json, a line each) and
the profile DIR/hw-<np>.json:
  measured  rank 0's TP collectives (StepMetrics::tp_comm_s, median step) as a share of the step;
  predicted the simulator's time blocked in communication as a share of its step (at TP x DP 1
            colocated that is the TP collectives alone);
  per coll. colocated only: the measured seconds per collective (tp_comm_s over the step's
            collectives: every mode runs a micro-batch as two nano-batches, each with its
            own 2 (4 L + 1) + 1 rows collectives and the cross-entropy's 2, plus the
            embedding's forward reduce-scatter once per side of the sequence cut: 2 (8 L + 6), 44 at L = 2) beside the
            profile's price of one (links.tp_collective, else links.all_to_all: latency + the
            rank's rows / rate), and what is left per collective;
  wait      the profile's TP wait (links.tp_wait: b seconds per second of compute) times the
            mode's measured compute (linear_s + attention_s): the wait the simulator charges
            a step, beside what the measured TP time leaves over the collectives' price.
Usage: scripts/tp_collective_report.py DIR
"""
import glob
import json
import os
import re
import sys


def price(hw, rows_bytes):
    links = hw.get("links", {})
    fit = links.get("tp_collective")
    name = "tp_collective"
    if fit is None:
        fit, name = links["all_to_all"], "all_to_all"
    return fit["latency_seconds"] + rows_bytes / fit["bytes_per_second"], name


def main(out):
    files = sorted(glob.glob(os.path.join(out, "tp*x*-*.json")))
    if not files:
        sys.exit(f"tp_collective_report: no tp<T>x<D>-*.json in {out}")
    for path in files:
        name = os.path.basename(path)[: -len(".json")]
        j = json.load(open(path))
        f = j["bench_flags"]
        hw = json.load(open(os.path.join(out, f"hw-{j['ranks']}.json")))
        tp, layers, width = f["tp"], f["layers"], f["width"]
        if not re.match(r"tp2x", name) or tp != 2:
            continue
        count = 2 * (8 * layers + 6)
        b = hw.get("links", {}).get("tp_wait", {}).get("seconds_per_compute_second", 0.0)
        rows_bytes = f["tokens_per_rank"] // tp * width * 4
        one, fit = price(hw, rows_bytes)
        for m in j["modes"]:
            step = m["median_s"]
            sim = m.get("sim", {})
            pred = sim["rank_blocked"][0] if sim.get("rank_blocked") else float("nan")
            line = (f"{name:24s} {m['name']:18s} step {step:.3f} s  TP measured {m['tp_comm_s'] / step:6.1%}"
                    f"  blocked predicted {pred:6.1%}")
            if m["name"] == "colocated":
                per = m["tp_comm_s"] / count
                line += (f"  per collective ({count}): measured {per * 1e3:.3f} ms, profile {fit} "
                         f"{one * 1e3:.3f} ms, left {(per - one) * 1e3:.3f} ms")
                compute = m["linear_s"] + m["attention_s"]
                line += (f"  wait: left {(m['tp_comm_s'] - count * one) * 1e3:.1f} ms a step, "
                         f"tp_wait {b:.4f} x compute {compute:.3f} s = {b * compute * 1e3:.1f} ms")
            print(line)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
