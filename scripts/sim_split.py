#!/usr/bin/env python3
"""Where the simulator's step differs from the measured one, per mode and rank.

Reads a `distca bench train --compare --hardware FILE --json OUT.json` result and prints, for
every mode, the measured and simulated step, then per rank the compute (busy: the step less
the rank's idle share; measured from the run's rank_idle, simulated from the prediction's
rank_busy_s) and the idle share, so a miss reads as compute under-predicted (busy sim/meas
below 1 on every rank) or waiting under-predicted (idle measured above simulated).

    /usr/bin/python3 scripts/sim_split.py OUT/dp2-prolong.json
"""
import json
import sys


def split(doc):
    """Rows (label, measured s, sim s, [(rank, busy meas, busy sim, idle meas, idle sim)])."""
    rows = []
    for m in doc["modes"]:
        sim = m.get("sim") or {}
        if not sim.get("ok"):
            rows.append((m["label"], m["median_s"], None, []))
            continue
        step = m["median_s"]
        ranks = []
        for r, idle in enumerate(m["rank_idle"]):
            if isinstance(idle, list):  # bench train --compare: one figure per stage of the rank
                idle = sum(idle) / len(idle) if idle else 0.0
            busy_sim = sim["rank_busy_s"][r] if r < len(sim["rank_busy_s"]) else None
            idle_sim = sim["rank_idle"][r] if r < len(sim["rank_idle"]) else None
            ranks.append((r, step * (1.0 - idle), busy_sim, idle, idle_sim))
        rows.append((m["label"], step, sim["step_s"], ranks))
    return rows


def main(argv):
    if len(argv) != 2:
        print("usage: sim_split.py BENCH_TRAIN_COMPARE.json", file=sys.stderr)
        return 2
    try:
        with open(argv[1], encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        print(f"distca: error: {argv[1]}: {e}", file=sys.stderr)
        return 2
    print("mode | step meas s | step sim s | sim/meas | rank: busy meas s, busy sim s, busy sim/meas, idle meas, idle sim")
    for label, step, sim, ranks in split(doc):
        if sim is None:
            print(f"{label} | {step:.3f} | refused | - |")
            continue
        parts = []
        for r, bm, bs, im, is_ in ranks:
            ratio = f"{bs / bm:.2f}" if bs is not None and bm > 0 else "-"
            parts.append(f"{r}: {bm:.3f}, {bs:.3f}, {ratio}, {im:.1%}, {is_:.1%}")
        print(f"{label} | {step:.3f} | {sim:.3f} | {sim / step:.2f} | " + "; ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
