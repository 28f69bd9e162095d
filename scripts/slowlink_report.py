#!/usr/bin/env python3
"""The table of scripts/slowlink-bench.sh: per link, tolerance, K/V-once setting and repeat,
bench train's medians, pingpong's paired speedup over colocated and its exposed share; then,
with several K/V-once settings, each setting's pingpong step over the first setting's, per
repeat (the runs of one repeat ran back to back: a paired A/B on a noisy machine).

Usage: slowlink_report.py OUT REPEATS RATES... -- TOLERANCES... -- KV_ONCE..."""
import json
import sys


def load(out, name):
    try:
        with open(f"{out}/{name}.json") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main(argv):
    out, repeats, rest = argv[1], int(argv[2]), argv[3:]
    a = rest.index("--")
    b = rest.index("--", a + 1)
    rates, tols, kvs = rest[:a], rest[a + 1:b], rest[b + 1:]
    print("| link | tolerance | kv once | repeat | colocated s | pingpong s | signal s | pingpong x colocated (paired) | exposed (paired) |")
    print("|---|---|---|---|---|---|---|---|---|")
    pp = {}
    for r in rates:
        for t in tols:
            for k in kvs:
                for i in range(1, repeats + 1):
                    name = f"train-{r}-t{t}-kv{k}-{i}"
                    j = load(out, name)
                    if j is None:
                        print(f"| {r} | {t} | {k} | {i} | missing: see {out}/{name}.log |||||")
                        continue
                    m = {x["name"]: x["median_s"] for x in j["modes"]}
                    sp = j.get("speedup_paired", {}).get("pingpong")
                    ex = j.get("exposed_paired")
                    pp[(r, t, k, i)] = m.get("cad pingpong")
                    print(f"| {r} | {t} | {k} | {i} | {m.get('colocated', 0):.3f} | {m.get('cad pingpong', 0):.3f} "
                          f"| {m.get('cad signal', 0):.3f} | {'-' if sp is None else f'{sp:.3f}'} "
                          f"| {'-' if ex is None else f'{100 * ex:.1f}%'} |")
    if len(kvs) < 2:
        return 0
    print()
    print(f"pingpong step with each K/V-once setting over --kv-once {kvs[0]}'s, per repeat (< 1: faster):")
    for r in rates:
        for t in tols:
            for k in kvs[1:]:
                ratios = [pp[(r, t, k, i)] / pp[(r, t, kvs[0], i)] for i in range(1, repeats + 1)
                          if pp.get((r, t, k, i)) and pp.get((r, t, kvs[0], i))]
                shown = " ".join(f"{x:.3f}" for x in ratios) or "none"
                print(f"  {r} tolerance {t}: {k} / {kvs[0]} = {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
