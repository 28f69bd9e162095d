#!/usr/bin/python3
"""A hardware profile derived from a measured one, for planning a lab the profile was not
measured in (docs/netlab.md, "250 Mbit/s with two ranks per host"): every compute figure
(GEMMs, element-wise, attention) times --compute-scale (2 for ranks capped at half the core the
profile's ranks had), and both link fits (p2p, all-to-all) replaced by --mbit megabits per
second of payload with --latency seconds per message (their points rewritten on that line).

Usage: scripts/profile_derive.py IN OUT --compute-scale K --mbit R [--latency S]
"""
import argparse
import json
import sys


def scaled(x, k):
    if isinstance(x, list):
        return [scaled(y, k) for y in x]
    return None if x is None else x * k


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inp")
    ap.add_argument("out")
    ap.add_argument("--compute-scale", type=float, required=True)
    ap.add_argument("--mbit", type=float, required=True)
    ap.add_argument("--latency", type=float, default=5e-4)
    a = ap.parse_args()
    if not (a.compute_scale > 0 and a.mbit > 0 and 0 <= a.latency <= 1):
        print("profile_derive: error: --compute-scale and --mbit must be > 0, --latency in [0, 1]", file=sys.stderr)
        sys.exit(2)
    try:
        p = json.load(open(a.inp))
        k = a.compute_scale
        for g in p["gemm"]:
            g["seconds_alone"] *= k
            g["seconds_concurrent"] *= k
        for fig in p.get("elementwise", {}).values():
            for key in fig:
                fig[key] *= k
        att = p["attention"]
        att["forward_seconds"] = scaled(att["forward_seconds"], k)
        att["backward_seconds"] = scaled(att["backward_seconds"], k)
        rate = a.mbit * 1e6 / 8
        for name in ("p2p", "all_to_all"):
            link = p["links"][name]
            link["bytes_per_second"] = rate
            link["latency_seconds"] = a.latency
            link["points"] = [{"bytes": q["bytes"], "seconds": a.latency + q["bytes"] / rate} for q in link["points"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"profile_derive: error: {a.inp}: {e}", file=sys.stderr)
        sys.exit(2)
    p["machine"]["derived"] = f"from {a.inp}: compute x{k}, link {a.mbit} Mbit/s, {a.latency} s per message"
    with open(a.out, "w") as f:
        json.dump(p, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
