#!/usr/bin/env bash
# End-to-end speed at scale: `pipesim simulate --format json` on tools/speed-p64-m1024.json (64 devices,
# 1024 microbatches) for every schedule x vocabulary mode, each run RUNS times (default 3). Prints per
# row the wall time of the whole process (start to JSON; min and median) and its peak resident memory.
#
# Usage: tools/speed.sh [PIPESIM] [RUNS]      (PIPESIM defaults to build/tools/pipesim)
set -euo pipefail
cd "$(dirname "$0")/.."
pipesim=${1:-build/tools/pipesim}
runs=${2:-3}
exec python3 - "$pipesim" "$runs" <<'PY'
import os, statistics, subprocess, sys, tempfile, time

pipesim, runs = sys.argv[1], int(sys.argv[2])
config = "tools/speed-p64-m1024.json"
def names(section):
    out = subprocess.run([pipesim, "list"], capture_output=True, text=True, check=True).stdout.split("\n\n")
    block = next(b for b in out if b.startswith(section))
    return [line.split()[0] for line in block.splitlines()[1:] if line.strip()]

print(f"{'schedule':<17} {'vocab':<13} {'min_ms':>8} {'median_ms':>10} {'rss_mib':>8}")
for schedule in names("schedules:"):
    for vocab in names("vocabulary modes:"):
        walls, rss, error = [], 0.0, ""
        for _ in range(runs):
            with tempfile.TemporaryFile() as err:
                start = time.perf_counter()
                child = subprocess.Popen([pipesim, "simulate", config, "--schedule", schedule, "--vocab", vocab,
                                          "--format", "json"], stdout=subprocess.DEVNULL, stderr=err)
                _, status, usage = os.wait4(child.pid, 0)
                walls.append((time.perf_counter() - start) * 1e3)
                rss = max(rss, usage.ru_maxrss / 1024)
                if status != 0:
                    err.seek(0)
                    error = err.read().decode().strip().splitlines()[-1]
                    break
        if error:
            print(f"{schedule:<17} {vocab:<13} refused: {error}")
        else:
            print(f"{schedule:<17} {vocab:<13} {min(walls):>8.1f} {statistics.median(walls):>10.1f} {rss:>8.1f}",
                  flush=True)
PY
