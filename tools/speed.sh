#!/usr/bin/env bash
# End-to-end speed at scale: `pipesim simulate --format json` on tools/speed-p64-m1024.json (64 devices,
# 1024 microbatches) for every schedule x vocabulary mode, each run RUNS times (default 3). Prints per
# row the wall time of the whole process (start to JSON; min and median) and its peak resident memory.
# With OTHER (another pipesim build), each row is also timed with it, the two builds' runs
# interleaved so that a slow spell of the machine falls on both alike, and the ratio of medians
# (this build / OTHER) is printed.
#
# Usage: tools/speed.sh [PIPESIM] [RUNS] [OTHER]      (PIPESIM defaults to build/tools/pipesim)
set -euo pipefail
cd "$(dirname "$0")/.."
pipesim=${1:-build/tools/pipesim}
runs=${2:-3}
other=${3:-}
for binary in "$pipesim" ${other:+"$other"}; do
  if [[ ! -x "$binary" ]]; then
    echo "speed.sh: $binary is not an executable pipesim; build it first (tools/setup.sh builds build/tools/pipesim)," \
         "or give the path of one: tools/speed.sh [PIPESIM] [RUNS] [OTHER]" >&2
    exit 1
  fi
done
if ! [[ "$runs" =~ ^[1-9][0-9]*$ ]]; then
  echo "speed.sh: RUNS must be a whole number of runs, 1 or more (got '$runs')" >&2
  exit 1
fi
exec python3 - "$pipesim" "$runs" "$other" <<'PY'
import os, statistics, subprocess, sys, tempfile, time

pipesim, runs, other = sys.argv[1], int(sys.argv[2]), sys.argv[3]
config = "tools/speed-p64-m1024.json"
def names(section):
    out = subprocess.run([pipesim, "list"], capture_output=True, text=True, check=True).stdout.split("\n\n")
    block = next(b for b in out if b.startswith(section))
    return [line.split()[0] for line in block.splitlines()[1:] if line.strip()]

def run(binary, schedule, vocab):
    """Wall ms and peak RSS MiB of one process, or the last line of its error."""
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        child = subprocess.Popen([binary, "simulate", config, "--schedule", schedule, "--vocab", vocab,
                                  "--format", "json"], stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        wall = (time.perf_counter() - start) * 1e3
        if status != 0:
            err.seek(0)
            return None, None, err.read().decode().strip().splitlines()[-1]
        return wall, usage.ru_maxrss / 1024, ""

binaries = [pipesim] + ([other] if other else [])
header = f"{'schedule':<17} {'vocab':<13} {'min_ms':>8} {'median_ms':>10} {'rss_mib':>8}"
print(header + (f" {'other_min':>10} {'other_median':>13} {'other_rss':>10} {'ratio':>6}" if other else ""))
for schedule in names("schedules:"):
    for vocab in names("vocabulary modes:"):
        walls = {b: [] for b in binaries}
        rss = {b: 0.0 for b in binaries}
        error = ""
        for _ in range(runs):
            for b in binaries:
                wall, peak, error = run(b, schedule, vocab)
                if error:
                    break
                walls[b].append(wall)
                rss[b] = max(rss[b], peak)
            if error:
                break
        if error:
            print(f"{schedule:<17} {vocab:<13} refused: {error}")
            continue
        row = f"{schedule:<17} {vocab:<13}"
        for b, widths in zip(binaries, [(8, 10, 8), (10, 13, 10)]):
            cells = (min(walls[b]), statistics.median(walls[b]), rss[b])
            row += "".join(f" {cell:>{width}.1f}" for cell, width in zip(cells, widths))
        if other:
            row += f" {statistics.median(walls[pipesim]) / statistics.median(walls[other]):>6.2f}"
        print(row, flush=True)
PY
