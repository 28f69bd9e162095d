#!/usr/bin/env python3
"""Where each mode's step goes, per rank, from `distca bench train --compare --json OUT.json`.

For every mode and timed step: the step (rank 0's, which ends behind the slowest rank), and per
rank its compute (linear, attention: kernels with packing and assembling rows, optimizer), the
communication it waited for (exposed; attention's part beside it), the end-of-step barrier
(idle behind the slowest rank), the time it was blocked for its plan, and the rest of the step
(the step less all of these: bookkeeping outside the timed phases). Then the step against the
ideal, the mean over ranks of compute (the step's work spread evenly at the rates this run
measured), and against the busiest rank's compute (what balance alone cannot beat).

    /usr/bin/python3 scripts/time_split.py OUT/dp4-pretrain.json
"""
import json
import sys


def rows(doc):
    """Yields (label, step index, step s, [per-rank dict], ideal s, busiest s)."""
    for m in doc["modes"]:
        split = m.get("rank_time_split")
        if not split:
            continue
        for i in range(len(split[0])):
            ranks = []
            for steps in split:
                s = steps[i]
                busy = s["linear_s"] + s["attention_s"] + s["optimizer_s"]
                rest = s["step_s"] - busy - s["comm_s"] - s["wait_s"] - s["plan_wait_s"]
                ranks.append(dict(s, busy_s=busy, rest_s=rest))
            busy = [r["busy_s"] for r in ranks]
            yield m["label"], i, split[0][i]["step_s"], ranks, sum(busy) / len(busy), max(busy)


def main(argv):
    if len(argv) != 2:
        print("usage: time_split.py BENCH_TRAIN_COMPARE.json", file=sys.stderr)
        return 2
    try:
        with open(argv[1], encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        print(f"distca: error: {argv[1]}: {e}", file=sys.stderr)
        return 2
    print("mode, step | step s | ideal s (mean compute) | step/ideal | busiest compute s | "
          "rank: linear, attention, optimizer, exposed (attention's), barrier, plan wait, rest")
    for label, i, step, ranks, ideal, busiest in rows(doc):
        parts = [f"{k}: {r['linear_s']:.3f}, {r['attention_s']:.3f}, {r['optimizer_s']:.3f}, "
                 f"{r['comm_s']:.3f} ({r['attention_comm_s']:.3f}), {r['wait_s']:.3f}, {r['plan_wait_s']:.4f}, "
                 f"{r['rest_s']:.3f}" for k, r in enumerate(ranks)]
        print(f"{label}, {i} | {step:.3f} | {ideal:.3f} | {step / ideal:.3f} | {busiest:.3f} | " + "; ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
