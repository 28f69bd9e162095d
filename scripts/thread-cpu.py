#!/usr/bin/python3
"""CPU seconds per thread of a command's processes (docs/runtime.md, "progress").

Usage: scripts/thread-cpu.py [--match NAME] -- COMMAND...

Runs COMMAND, samples /proc/<pid>/task/<tid>/stat of every process whose command name is
NAME (default: distca) under COMMAND every 0.1 s while it runs, and prints, per process, the CPU seconds
(user + system) of its main thread, of the progress thread (named "distca-progress") and of
every other thread together, as last seen before the thread ended. The command's own output
passes through; the table goes to stderr at the end. The command's exit status is returned.
"""
import os
import subprocess
import sys
import time


def read_threads(pid, tick):
    out = {}
    base = f"/proc/{pid}/task"
    try:
        tids = os.listdir(base)
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"{base}/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        cpu = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
        out[int(tid)] = (name, cpu)
    return out


def parent(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return 0
    return int(stat[stat.rindex(")") + 2:].split()[1])


def processes(match, root):
    """Descendants of `root` named `match` (other users' processes of the name are skipped)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as f:
                if f.read().strip() != match:
                    continue
        except OSError:
            continue
        p = int(entry)
        while p > 1 and p != root:
            p = parent(p)
        if p == root:
            pids.append(int(entry))
    return pids


def main():
    args = sys.argv[1:]
    match = "distca"
    if args[:1] == ["--match"]:
        match, args = args[1], args[2:]
    if args[:1] != ["--"] or len(args) < 2:
        sys.stderr.write(__doc__)
        return 2
    tick = os.sysconf("SC_CLK_TCK")
    seen = {}  # pid -> tid -> (name, cpu)
    proc = subprocess.Popen(args[1:])
    while proc.poll() is None:
        for pid in processes(match, proc.pid):
            seen.setdefault(pid, {}).update(read_threads(pid, tick))
        time.sleep(0.1)
    for pid in sorted(seen):
        threads = seen[pid]
        main_cpu = threads.get(pid, ("", 0.0))[1]
        prog = sum(c for t, (n, c) in threads.items() if t != pid and n == "distca-progress")
        other = sum(c for t, (n, c) in threads.items() if t != pid and n != "distca-progress")
        sys.stderr.write(f"thread-cpu: pid {pid} main {main_cpu:.2f} s, progress {prog:.2f} s, "
                         f"other threads {other:.2f} s\n")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
