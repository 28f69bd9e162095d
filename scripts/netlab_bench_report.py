#!/usr/bin/env python3
"""Collects scripts/netlab-bench.sh's runs (OUT/runs/*.json) into OUT/results.json and
OUT/results.md (docs/netlab.md, "The measurement sweep"). Standard library only.

Usage: netlab_bench_report.py OUT

Run names: train-RATE-2xK-tT, step-RATE-2xK-tT, profile-RATE-2xK and link-RATE (RATE a tc rate
such as 250mbit, or shm: one host, shared memory). A run without its JSON is listed as missing,
with its .failed file's reason where there is one.
"""
import json
import os
import re
import sys

NAME = re.compile(r"^(train|step)-(?P<rate>[0-9a-z.]+)-2x(?P<k>[0-9]+)-t(?P<tol>[0-9.]+)$")


def rate_mbit(rate):
    """Mbit/s of a tc rate; None for shared memory."""
    m = re.fullmatch(r"([0-9.]+)(kbit|mbit|gbit)", rate)
    if not m:
        return None
    return float(m.group(1)) * {"kbit": 1e-3, "mbit": 1.0, "gbit": 1e3}[m.group(2)]


def order(row):
    mbit = rate_mbit(row["rate"])
    return (mbit is None, mbit or 0.0, row["ranks_per_host"], row["tolerance"])


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def link_of(runs, rate):
    """Measured Mbit/s of the lab's link at RATE (netlab.sh measure), or None."""
    try:
        with open(os.path.join(runs, "link-%s.txt" % rate)) as f:
            m = re.search(r"measured_mbit_per_s=([0-9.]+)", f.read())
        return float(m.group(1)) if m else None
    except OSError:
        return None


def train_row(j):
    modes = {m["name"]: m for m in j["modes"]}
    row = {"step_s": {n: m["median_s"] for n, m in modes.items()},
           "exposed_comm": {n: m.get("mean_exposed") for n, m in modes.items()},
           "sent_mib": modes["cad pingpong"]["bytes_sent"] / 2**20 if "cad pingpong" in modes else None,
           "speedup_paired": j.get("speedup_paired", {}),
           "exposed": j.get("exposed_paired"),
           "single_stream_penalty": j.get("single_stream_slowdown"),
           "ideal_speedup": j.get("ideal_speedup")}
    sim = {n: m["sim"]["step_s"] for n, m in modes.items() if m.get("sim", {}).get("ok")}
    if sim:
        row["sim_step_s"] = sim
    return row


def step_row(j):
    res = {}
    for r in j["results"]:
        name = r["scheduler"] + (" (stateless)" if r.get("servers") == "stateless" else "") + " " + r["mode"]
        res[name] = r["median_s"]
    return {"step_s": res, "speedup_paired": j.get("speedup_paired"), "exposed": j.get("exposed"),
            "ideal_speedup": j.get("ideal_speedup")}


def fmt(x, spec=".3f"):
    return "-" if x is None else format(x, spec)


def pct(x):
    return "-" if x is None else "%.1f%%" % (100 * x)


def markdown(doc):
    out = ["# netlab-bench results", "",
           "2 hosts (network namespaces) joined by links limited to the rate by tbf; `shm`: one host, "
           "shared memory. K ranks per host; btl %s between hosts, %s on one host."
           % (doc["config"]["btl_lab"], doc["config"]["btl_host"]), ""]
    train = [r for r in doc["runs"] if r["bench"] == "train" and "step_s" in r]
    if train:
        out += ["## bench train", "",
                "| rate | link Mbit/s | ranks | tol | colocated s | cad single-stream | cad pingpong | cad signal "
                "| speedup pingpong | exposed | single-stream penalty | sent MiB | sim pingpong s | sim / measured |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in train:
            s, sim = r["step_s"], r.get("sim_step_s", {})
            pp, sim_pp = s.get("cad pingpong"), sim.get("cad pingpong")
            out.append("| %s | %s | 2x%d | %g | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                r["rate"], fmt(r.get("link_mbit"), ".0f"), r["ranks_per_host"], r["tolerance"],
                fmt(s.get("colocated")), fmt(s.get("cad single-stream")), fmt(pp), fmt(s.get("cad signal")),
                fmt(r["speedup_paired"].get("pingpong")), pct(r["exposed"]), pct(r["single_stream_penalty"]),
                fmt(r["sent_mib"], ".1f"), fmt(sim_pp), fmt(sim_pp / pp if sim_pp and pp else None, ".2f")))
        out.append("")
    step = [r for r in doc["runs"] if r["bench"] == "step" and "step_s" in r]
    if step:
        out += ["## bench step", "",
                "| rate | link Mbit/s | ranks | tol | colocated pingpong s | cad pingpong | cad single-stream "
                "| cad signal | speedup (paired) | exposed |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in step:
            s = r["step_s"]
            out.append("| %s | %s | 2x%d | %g | %s | %s | %s | %s | %s | %s |" % (
                r["rate"], fmt(r.get("link_mbit"), ".0f"), r["ranks_per_host"], r["tolerance"],
                fmt(s.get("colocated pingpong")), fmt(s.get("cad pingpong")), fmt(s.get("cad single-stream")),
                fmt(s.get("cad signal")), fmt(r["speedup_paired"]), pct(r["exposed"])))
        out.append("")
    missing = [r for r in doc["runs"] if "step_s" not in r]
    if missing:
        out += ["## Missing runs", ""] + ["- %s: %s" % (r["name"], r.get("failed", "not run")) for r in missing] + [""]
    return "\n".join(out)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    runs = os.path.join(out, "runs")
    config = load(os.path.join(out, "config.json")) or {}
    names = set(config.get("planned", []))
    names |= {f[:-5] for f in os.listdir(runs) if f.endswith(".json")}
    names |= {f[:-7] for f in os.listdir(runs) if f.endswith(".failed")}
    rows = []
    for name in names:
        m = NAME.match(name)
        if not m:
            continue
        row = {"name": name, "bench": name.split("-")[0], "rate": m["rate"], "ranks_per_host": int(m["k"]),
               "tolerance": float(m["tol"]), "link_mbit": link_of(runs, m["rate"])}
        j = load(os.path.join(runs, name + ".json"))
        if j is not None:
            row.update(train_row(j) if row["bench"] == "train" else step_row(j))
        elif os.path.exists(os.path.join(runs, name + ".failed")):
            with open(os.path.join(runs, name + ".failed")) as f:
                row["failed"] = f.read().strip()
        rows.append(row)
    rows.sort(key=lambda r: (r["bench"],) + order(r))
    doc = {"format": "distca-netlab-bench", "config": config, "runs": rows}
    for path, text in (("results.json", json.dumps(doc, indent=1) + "\n"), ("results.md", markdown(doc) + "\n")):
        tmp = os.path.join(out, path + ".tmp")
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, os.path.join(out, path))
    done = sum("step_s" in r for r in rows)
    print("netlab-bench: %d of %d runs in %s/results.md and results.json" % (done, len(rows), out))


if __name__ == "__main__":
    main()
