#!/usr/bin/env python3
"""Collects scripts/netlab-bench.sh's runs (OUT/runs/*.json) into OUT/results.json and
OUT/results.md (docs/netlab.md, "The measurement sweep"). Standard library only.

Usage: netlab_bench_report.py OUT              the report of the runs so far
       netlab_bench_report.py --estimate CONFIG OUT   the runtime estimate of CONFIG's plan (the
                                               runs OUT holds are done); stored in CONFIG

Run names: train-RATE-2xK-tT, step-RATE-2xK-tT, profile-RATE-2xK and link-RATE (RATE a tc rate
such as 250mbit, or shm: one host, shared memory; T a tolerance or `auto`). A run without its
JSON is listed as missing, with its .failed file's reason where there is one; NAME.seconds holds
a run's wall time.
"""
import json
import os
import re
import sys

NAME = re.compile(r"^(?P<bench>train|step|profile)-(?P<rate>[0-9a-z.]+)-2x(?P<k>[0-9]+)(-t(?P<tol>[0-9.]+|auto))?$")


def rate_mbit(rate):
    """Mbit/s of a tc rate; None for shared memory."""
    m = re.fullmatch(r"([0-9.]+)(kbit|mbit|gbit)", rate)
    if not m:
        return None
    return float(m.group(1)) * {"kbit": 1e-3, "mbit": 1.0, "gbit": 1e3}[m.group(2)]


def order(row):
    mbit = rate_mbit(row["rate"])
    tol = row["tolerance"]
    return (mbit is None, mbit or 0.0, row["ranks_per_host"], tol == "auto", 0.0 if tol == "auto" else tol)


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


def links_of(runs, rate, k):
    """What the link at RATE carried (Mbit/s): one way, each way with both sending
    (netlab.sh measure --both; the slower direction), and the p2p and all-to-all fits of the
    lab's profile for K ranks per host (`distca profile`: every rank sends at once)."""
    out = {"one_way": link_of(runs, rate), "both_ways": None, "profile_p2p": None, "profile_all_to_all": None}
    try:
        with open(os.path.join(runs, "link-%s.txt" % rate)) as f:
            both = [float(x) for x in re.findall(r"measured_mbit_per_s_h\d_h\d=([0-9.]+)", f.read())]
        out["both_ways"] = min(both) if both else None
    except OSError:
        pass
    prof = load(os.path.join(runs, "profile-%s-2x%d.json" % (rate, k))) or {}
    for key in ("p2p", "all_to_all"):
        bps = prof.get("links", {}).get(key, {}).get("bytes_per_second")
        out["profile_" + key] = bps * 8 / 1e6 if bps else None
    return out


def seconds_of(runs, name):
    """A run's wall time (NAME.seconds, written by netlab-bench.sh), or None."""
    try:
        with open(os.path.join(runs, name + ".seconds")) as f:
            return float(f.read().strip())
    except (OSError, ValueError):
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
        row["sim_buckets"] = {n: sim_buckets(modes[n]) for n in sim}
    return row


def sim_buckets(m):
    """Where the simulator misses one mode's measured step: the step, rank 0's compute (the
    simulator's busy seconds over the measured linear + attention seconds) and the exposed
    communication (mean over ranks, a fraction of each one's own step; the difference in
    points): measured, the communication the rank waited for (StepMetrics::comm_s, waits for a
    slower peer inside an exchange included); simulated, the same quantity (rank_blocked:
    UnitStats::comm_blocked), not the link time alone (rank_exposed), which leaves those waits
    in idle. The issue's goals: the step within 15%, exposed within 5 points."""
    s = m["sim"]
    busy = s.get("rank_busy_s") or []
    compute = (m.get("linear_s") or 0) + (m.get("attention_s") or 0)
    out = {"step": ratio(s["step_s"], m["median_s"]),
           "compute": ratio(busy[0], compute) if busy else None,
           "exposed_measured": m.get("mean_exposed"), "exposed_sim": s.get("mean_blocked")}
    both = out["exposed_measured"] is not None and out["exposed_sim"] is not None
    out["exposed_points"] = 100 * (out["exposed_sim"] - out["exposed_measured"]) if both else None
    out["within_goals"] = (out["step"] is not None and abs(out["step"] - 1) <= 0.15 and both
                           and abs(out["exposed_points"]) <= 5)
    return out


def sim_table(doc):
    """The simulator against every bench train row, mode by mode (sim_buckets)."""
    out = ["## The simulator against the lab (bench train)", "",
           "sim/meas: the simulated over the measured step; compute: rank 0's simulated busy seconds "
           "over its measured linear + attention seconds (below the step's ratio: the miss is compute); "
           "exposed: communication waited for over the step (waits for a slower peer inside an exchange "
           "included), mean over ranks, measured and simulated, and their difference in points; ok: within "
           "15% and 5 points.", "",
           "| rate | ranks | tol | mode | sim/meas | compute | exposed meas | exposed sim | points | ok |",
           "|" + "---|" * 10]
    for r in doc["runs"]:
        for mode, b in sorted(r.get("sim_buckets", {}).items()):
            out.append("| %s | 2x%d | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                r["rate"], r["ranks_per_host"], r["tolerance"], mode, fmt(b["step"], ".2f"), fmt(b["compute"], ".2f"),
                pct(b["exposed_measured"]), pct(b["exposed_sim"]), fmt(b["exposed_points"], "+.1f"),
                "yes" if b["within_goals"] else "no"))
    return out + [""]


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


def ratio(a, b):
    return a / b if a and b else None


def auto_against_fixed(rows):
    """Per (rate, ranks per host) with an auto train run: cad pingpong's step at auto over the
    best fixed tolerance's and over 0.05's (the issue's goal: within 2% of the best)."""
    out = []
    train = [r for r in rows if r["bench"] == "train" and "step_s" in r]
    for a in (r for r in train if r["tolerance"] == "auto"):
        fixed = [r for r in train if r["rate"] == a["rate"] and r["ranks_per_host"] == a["ranks_per_host"]
                 and r["tolerance"] != "auto" and r["step_s"].get("cad pingpong")]
        auto_s = a["step_s"].get("cad pingpong")
        if not fixed or not auto_s:
            continue
        best = min(fixed, key=lambda r: r["step_s"]["cad pingpong"])
        default = [r for r in fixed if r["tolerance"] == 0.05]
        entry = {"rate": a["rate"], "ranks_per_host": a["ranks_per_host"], "auto_s": auto_s,
                 "best_fixed_tolerance": best["tolerance"], "best_fixed_s": best["step_s"]["cad pingpong"],
                 "auto_over_best": auto_s / best["step_s"]["cad pingpong"],
                 "auto_over_default": auto_s / default[0]["step_s"]["cad pingpong"] if default else None}
        entry["within_2_percent"] = entry["auto_over_best"] <= 1.02
        a["auto_over_best"] = entry["auto_over_best"]
        out.append(entry)
    return out


def markdown(doc):
    """One table: a row per rate, layout and tolerance, bench train's figures then bench step's."""
    cfg = doc["config"]
    out = ["# netlab-bench results", "",
           "2 hosts (network namespaces) joined by links limited to the rate by tbf; `shm`: one host, "
           "shared memory. K ranks per host; btl %s between hosts, %s on one host. bench train `%s`; "
           "bench step `%s`. Step times in seconds, medians; `pp` cad pingpong, `ss` single-stream, "
           "`sig` signal; speedup: pingpong over colocated, paired; exposed: (pingpong - signal) / "
           "pingpong; ss penalty: single-stream over pingpong - 1; sim/meas: the simulator's step "
           "(the run's lab profile) over the measured one, per mode (col, ss, pp, sig); auto/best: "
           "cad pingpong at `--tolerance auto` over the best fixed tolerance's."
           % (cfg.get("btl_lab"), cfg.get("btl_host"), cfg.get("train_args") or "defaults",
              cfg.get("step_args") or "defaults"), "",
           "| rate | link Mbit/s | ranks | tol | train col | ss | pp | sig | speedup | exposed | ss penalty "
           "| sent MiB | sim/meas col, ss, pp, sig | auto/best | step col pp | step cad pp | step ss | step sig "
           "| step speedup | step exposed |",
           "|" + "---|" * 20]
    keyed = {}
    for r in doc["runs"]:
        if r["bench"] in ("train", "step"):
            keyed.setdefault((r["rate"], r["ranks_per_host"], r["tolerance"]), {})[r["bench"]] = r
    for key in sorted(keyed, key=lambda k: order({"rate": k[0], "ranks_per_host": k[1], "tolerance": k[2]})):
        t, st = keyed[key].get("train", {}), keyed[key].get("step", {})
        s, sim, ss = t.get("step_s", {}), t.get("sim_step_s", {}), st.get("step_s", {})
        sims = ", ".join(fmt(ratio(sim.get(m), s.get(m)), ".2f")
                         for m in ("colocated", "cad single-stream", "cad pingpong", "cad signal"))
        link = t.get("link_mbit") or st.get("link_mbit")
        out.append("| %s | %s | 2x%d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            key[0], fmt(link, ".0f"), key[1], key[2] if key[2] == "auto" else "%g" % key[2], fmt(s.get("colocated")), fmt(s.get("cad single-stream")),
            fmt(s.get("cad pingpong")), fmt(s.get("cad signal")), fmt(t.get("speedup_paired", {}).get("pingpong")),
            pct(t.get("exposed")), pct(t.get("single_stream_penalty")), fmt(t.get("sent_mib"), ".1f"),
            sims if sim else "-", fmt(t.get("auto_over_best"), ".3f"), fmt(ss.get("colocated pingpong")),
            fmt(ss.get("cad pingpong")), fmt(ss.get("cad single-stream")), fmt(ss.get("cad signal")),
            fmt(st.get("speedup_paired")), pct(st.get("exposed"))))
    out.append("")
    if doc["auto"]:
        out += ["`--tolerance auto` against the fixed tolerances (cad pingpong): " + "; ".join(
            "%s 2x%d: %.3f s, best fixed %g at %.3f s (%+.1f%%)%s" % (
                a["rate"], a["ranks_per_host"], a["auto_s"], a["best_fixed_tolerance"], a["best_fixed_s"],
                100 * (a["auto_over_best"] - 1), "" if a["auto_over_default"] is None
                else ", %+.1f%% against 0.05" % (100 * (a["auto_over_default"] - 1))) for a in doc["auto"]), ""]
    if any(r.get("sim_buckets") for r in doc["runs"]):
        out += sim_table(doc)
    links = sorted({(r["rate"], r["ranks_per_host"]): r["links"] for r in doc["runs"] if r.get("links")}.items(),
                   key=lambda kv: order({"rate": kv[0][0], "ranks_per_host": kv[0][1], "tolerance": 0.0}))
    if links:
        out += ["Links, Mbit/s (one way; each way with both sending, the slower; the profile's p2p and "
                "all-to-all fits, which the simulator and `--tolerance auto` price bytes at): " + "; ".join(
                    "%s 2x%d: %s, %s, %s, %s" % (rate, k, fmt(v["one_way"], ".0f"), fmt(v["both_ways"], ".0f"),
                                                 fmt(v["profile_p2p"], ".0f"), fmt(v["profile_all_to_all"], ".0f"))
                    for (rate, k), v in links), ""]
    wall = sum(r.get("run_seconds") or 0 for r in doc["runs"])
    out.append("Wall time of the runs: %.0f s (estimated before the start: %s s)." % (
        wall, fmt(cfg.get("estimate_s"), ".0f")))
    missing = [r for r in doc["runs"] if "step_s" not in r and r["bench"] != "profile"]
    missing += [r for r in doc["runs"] if r["bench"] == "profile" and "failed" in r]
    if missing:
        out += ["", "## Missing runs", ""] + ["- %s: %s" % (r["name"], r.get("failed", "not run")) for r in missing]
    return "\n".join(out)


# ---- the runtime estimate ---------------------------------------------------------------------

def flag_values(args, defaults):
    """The integer flags of a command line over their defaults (--name value pairs)."""
    words, out = args.split(), dict(defaults)
    for i, w in enumerate(words[:-1]):
        key = w.lstrip("-").replace("-", "_")
        if w.startswith("--") and key in out:
            out[key] = int(words[i + 1])
    return out


def payload_bytes_per_s(rate):
    """What a lab link carries: 0.95 of its rate (tbf counts whole frames), at most about 1.7
    Gbit/s (where this kind of machine's CPU, not tbf, limits TCP); shm: 2 GB/s."""
    mbit = rate_mbit(rate)
    return 2e9 if mbit is None else 0.95 * min(mbit, 1700.0) * 1e6 / 8


def estimate_run(name, cfg, gflops, cores):
    """Seconds one run is expected to take (a rough model: compute at `gflops` per rank with a
    core of its own, shared when ranks outnumber cores; every exchange waited for in full)."""
    m = NAME.match(name)
    k = int(m["k"])
    # More ranks than cores: each gets its share, and time slicing and the kernel's TCP work
    # cost more (the default 2 x 2 run at 250mbit took over 784 s on 2 cores, 1.35x this model
    # without the factor).
    share = min(1.0, cores / (2.0 * k)) * (1.0 if 2 * k <= cores else 1.0 / 1.5)
    rate = gflops * 1e9 * share
    link = payload_bytes_per_s(m["rate"])
    if m["bench"] == "profile":
        return 60.0
    if m["bench"] == "train":
        f = flag_values(cfg.get("train_args", ""), {"tokens_per_rank": 8192, "width": 512, "layers": 2, "vocab": 512,
                                                   "long_doc": 0, "short_doc": 512, "rounds": 3, "steps": 3})
        tokens, h, layers = f["tokens_per_rank"], f["width"], f["layers"]
        long_doc = f["long_doc"] or tokens
        ffn = max(64, (8 * h // 3 + 32) // 64 * 64)
        linear = 3 * (6 * h * (h + ffn) * layers + 2 * h * f["vocab"]) * tokens
        attn = lambda doc: 3.5 * 4 * h * layers * (tokens // doc) * doc * doc / 2.0
        colocated = (linear + attn(long_doc)) / rate
        cad = (linear + (attn(long_doc) + (2 * k - 1) * attn(f["short_doc"])) / (2 * k)) / rate
        params = layers * (3 * h * h + 3 * h * ffn) + 2 * h * f["vocab"]
        all_reduce = 4.0 * params / link
        exchange = 24.5 * 2**20 * (tokens / 8192.0) * (h / 512.0) * layers / link
        per_round = f["steps"] * (colocated + 3 * cad + 2 * exchange + 4 * all_reduce)
        return 20.0 + f["rounds"] * per_round
    f = flag_values(cfg.get("step_args", ""), {"long_doc": 16384, "layers": 1, "reps": 3, "heads": 2,
                                              "head_dim": 64, "linear_width": 256})
    width = f["heads"] * f["head_dim"]
    attn = 3.5 * 4 * width * f["layers"] * f["long_doc"] ** 2 / 2.0
    linear = 2 * 2 * f["long_doc"] * f["linear_width"] ** 2 * f["layers"]
    exchange = 4 * f["long_doc"] * width * 4 * f["layers"] / link
    return 10.0 + 5 * (f["reps"] + 1) * ((attn + linear) / rate + exchange)


def estimate(path, out):
    """Prints the estimated runtime of the plan in config file `path` (the runs not yet done
    under `out`) and stores it in that file as estimate_s."""
    cfg = load(path) or sys.exit("netlab-bench: no plan in %s" % path)
    gflops, cores = float(cfg.get("gflops_per_rank", 75)), int(cfg.get("cores") or 1)
    runs = os.path.join(out, "runs")
    todo = [n for n in cfg.get("planned", []) if not os.path.exists(os.path.join(runs, n + ".json"))]
    total = sum(estimate_run(n, cfg, gflops, cores) for n in todo) + 15.0 * len(
        {NAME.match(n)["rate"] for n in todo})  # lab up, link measurement, down
    cfg["estimate_s"] = total
    with open(path + ".tmp", "w") as f:
        json.dump(cfg, f, indent=1)
    os.replace(path + ".tmp", path)
    print("netlab-bench: %d of %d runs to do, estimated %.0f s (%.1f h; a rough model: %g GFLOP/s per rank "
          "with a core, %d cores, every exchange waited for; --gflops sets the rate)"
          % (len(todo), len(cfg.get("planned", [])), total, total / 3600.0, gflops, cores))
    print("estimate_s=%.0f" % total)


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--estimate":
        estimate(sys.argv[2], sys.argv[3])
        return
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
        tol = m["tol"]
        row = {"name": name, "bench": m["bench"], "rate": m["rate"], "ranks_per_host": int(m["k"]),
               "tolerance": None if tol is None else tol if tol == "auto" else float(tol),
               "link_mbit": link_of(runs, m["rate"]), "run_seconds": seconds_of(runs, name)}
        j = load(os.path.join(runs, name + ".json"))
        if m["bench"] == "profile":
            if j is None and os.path.exists(os.path.join(runs, name + ".failed")):
                with open(os.path.join(runs, name + ".failed")) as f:
                    row["failed"] = f.read().strip()
            rows.append(row)
            continue
        if row["bench"] == "train" and rate_mbit(m["rate"]) is not None:
            row["links"] = links_of(runs, m["rate"], row["ranks_per_host"])
        if j is not None:
            row.update(train_row(j) if row["bench"] == "train" else step_row(j))
        elif os.path.exists(os.path.join(runs, name + ".failed")):
            with open(os.path.join(runs, name + ".failed")) as f:
                row["failed"] = f.read().strip()
        rows.append(row)
    rows.sort(key=lambda r: (r["bench"],) + order(dict(r, tolerance=r["tolerance"] or 0.0)))
    doc = {"format": "distca-netlab-bench", "config": config, "runs": rows}
    doc["auto"] = auto_against_fixed(rows)
    for path, text in (("results.json", json.dumps(doc, indent=1) + "\n"), ("results.md", markdown(doc) + "\n")):
        tmp = os.path.join(out, path + ".tmp")
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, os.path.join(out, path))
    rows = [r for r in rows if r["bench"] != "profile"]
    done = sum("step_s" in r for r in rows)
    print("netlab-bench: %d of %d runs in %s/results.md and results.json" % (done, len(rows), out))


if __name__ == "__main__":
    main()
