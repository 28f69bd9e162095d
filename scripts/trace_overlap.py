#!/usr/bin/python3
"""How much of each exchange a `distca train --trace` (or `bench step --trace`) run hid.

For every rank and exchange name ("ping q", "pong o_lse", ...), over the traced step:
  in flight  sum of the exchange's "comm" spans: from its post to the moment its completion
             was seen (by the progress thread for "<name> transfer" events of the mpi
             backend, else by the dispatcher's test/wait);
  exposed    sum of its "<name> wait" spans: time the rank was blocked on it;
  hidden     1 - exposed / in flight.
Usage: scripts/trace_overlap.py TRACE.json [--json]
"""
import collections
import json
import sys


def summarize(path):
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    flight = collections.defaultdict(float)
    exposed = collections.defaultdict(float)
    transfer = collections.defaultdict(float)
    linear = collections.defaultdict(float)
    for e in events:
        rank, name, dur = e["tid"], e["name"], e["dur"]
        if e["cat"] == "comm" and name.endswith(" transfer"):
            transfer[(rank, name[: -len(" transfer")])] += dur
        elif e["cat"] == "comm":
            flight[(rank, name)] += dur
        elif e["cat"] == "wait" and name.endswith(" wait"):
            exposed[(rank, name[: -len(" wait")])] += dur
        elif "linear" in name:
            linear[rank] += dur
    rows = []
    for key in sorted(flight):
        rank, name = key
        total = flight[key]
        rows.append({
            "rank": rank,
            "exchange": name,
            "in_flight_us": round(total, 1),
            "transfer_us": round(transfer.get(key, 0.0), 1),
            "exposed_us": round(exposed.get(key, 0.0), 1),
            "hidden": round(1 - exposed.get(key, 0.0) / total, 4) if total > 0 else 1.0,
        })
    return rows, dict(linear)


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(sys.argv) >= 2 else 2
    try:
        rows, linear = summarize(sys.argv[1])
    except (OSError, ValueError, KeyError) as err:
        print(f"trace_overlap: error: {sys.argv[1]}: {err}", file=sys.stderr)
        return 2
    if "--json" in sys.argv[2:]:
        print(json.dumps({"exchanges": rows, "linear_us": linear}, indent=1))
        return 0
    print(f"{'rank':>4} {'exchange':<12} {'in flight us':>13} {'transfer us':>12} {'exposed us':>11} {'hidden':>7}")
    for r in rows:
        print(f"{r['rank']:>4} {r['exchange']:<12} {r['in_flight_us']:>13.1f} {r['transfer_us']:>12.1f} "
              f"{r['exposed_us']:>11.1f} {100 * r['hidden']:>6.1f}%")
    for rank in sorted(linear):
        print(f"rank {rank}: linear work {linear[rank]:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
