#!/usr/bin/env bash
# The simulator against the runtime, honestly: each schedule x vocabulary mode is run for real, and
# the simulator predicts its iteration time from the op times of a *different* run (the calibration
# schedule, zb-h1, whose split backward gives F, B and W apart; zb-h1 itself is predicted from zb-v).
# Each target runs 6 steps; the measured time is the median of steps 2-6 (the first warms caches and
# allocators up), and their spread, (max - min) / median, is printed beside the prediction's error so
# that noise is not mistaken for error.
#
# Usage: tools/sim-vs-run.sh [--ranks N] [--config FILE] [--schedules a,b,..] [--vocabs x,y,..]
#                            [-- extra `pipesim run` options, e.g. --backend cuda --dtype bf16]
# Defaults: configs/tiny.json widened to ops of milliseconds (hidden 128, FFN 512, seq 64), ranks = cores
# (at most 4: with more ranks than cores they take turns and the pipeline is no longer measured),
# schedules 1f1b, interleaved-1f1b, v-half, zb-v, zb-h1, vocabularies baseline and vocab-1.
set -euo pipefail
cd "$(dirname "$0")/.."
cores=$(nproc)
ranks=$((cores < 4 ? cores : 4))
config=configs/tiny.json
schedules=1f1b,interleaved-1f1b,v-half,zb-v,zb-h1
vocabs=baseline,vocab-1
while (($#)); do
  case $1 in
    --ranks) ranks=$2; shift 2 ;;
    --config) config=$2; shift 2 ;;
    --schedules) schedules=$2; shift 2 ;;
    --vocabs) vocabs=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "sim-vs-run: unknown option $1 (see the usage at the top of $0)" >&2; exit 1 ;;
  esac
done
pipesim=build/tools/pipesim
[[ -x $pipesim ]] || tools/setup.sh
model=()
[[ $config == configs/tiny.json ]] &&
  model=(--set model.hidden=128 --set model.ffn_hidden=512 --set model.seq_len=64 --set parallel.microbatches=8)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# "median spread" in ms and percent, from a run's JSON report: steps 2.. of step_times_s.
steps_ms() {
  python3 -c 'import json, statistics, sys
t = [1e3 * s for s in json.load(sys.stdin)["step_times_s"][1:]]
m = statistics.median(t)
print(f"{m:.3f} {100 * (max(t) - min(t)) / m:.1f}")'
}
sim_ms() { awk '/^iteration / { print $2; exit }'; }
run() { $pipesim run "$config" --ranks "$ranks" "${model[@]}" "$@"; }

echo "| schedule | vocab | measured ms (median of 5 steps) | spread | predicted ms | from | error |"
echo "|---|---|---:|---:|---:|---|---:|"
total=0 count=0
for vocab in ${vocabs//,/ }; do
  for calibration in zb-h1 zb-v; do
    run --schedule "$calibration" --vocab "$vocab" --steps 3 --profile "$work/$calibration.json" "$@" >/dev/null
  done
  for schedule in ${schedules//,/ }; do
    from=zb-h1
    [[ $schedule == zb-h1 ]] && from=zb-v
    if ! report=$(run --schedule "$schedule" --vocab "$vocab" --steps 6 --format json "$@" 2>&1); then
      echo "| $schedule | $vocab | refused: ${report#pipesim: error: } | | | | |"
      continue
    fi
    read -r measured spread < <(steps_ms <<<"$report")
    p=$($pipesim simulate "$config" --schedule "$schedule" --vocab "$vocab" --set parallel.pp="$ranks" "${model[@]}" \
      --profile "$work/$from.json" | sim_ms)
    error=$(awk -v m="$measured" -v p="$p" 'BEGIN { printf "%+.1f", 100 * (p - m) / m }')
    echo "| $schedule | $vocab | $measured | ${spread}% | $p | $from | ${error}% |"
    total=$(awk -v t="$total" -v e="$error" 'BEGIN { if (e < 0) e = -e; print t + e }')
    count=$((count + 1))
  done
done
((count)) && awk -v t="$total" -v n="$count" 'BEGIN { printf "\nmean |error| over %d rows: %.1f%%\n", n, t / n }'
