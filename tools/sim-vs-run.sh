#!/usr/bin/env bash
# The simulator against the runtime, honestly: each schedule x vocabulary mode is run for real, and
# the simulator predicts its iteration time from the op times of a *different* run (the calibration
# schedule, zb-h1, whose split backward gives F, B and W apart; zb-h1 itself is predicted from zb-v).
# Each target runs twice, so the run-to-run spread is printed beside the prediction's error.
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

# Milliseconds of the last measured step of a run, or of a simulated iteration.
step_ms() { awk '/^step time:/ { print $3 }'; }
sim_ms() { awk '/^iteration / { print $2; exit }'; }
run() { $pipesim run "$config" --ranks "$ranks" --steps 3 "${model[@]}" "$@"; }

echo "| schedule | vocab | measured ms (run 1, run 2) | spread | predicted ms | from | error |"
echo "|---|---|---:|---:|---:|---|---:|"
total=0 count=0
for vocab in ${vocabs//,/ }; do
  for calibration in zb-h1 zb-v; do
    run --schedule "$calibration" --vocab "$vocab" --profile "$work/$calibration.json" "$@" >/dev/null
  done
  for schedule in ${schedules//,/ }; do
    from=zb-h1
    [[ $schedule == zb-h1 ]] && from=zb-v
    if ! first=$(run --schedule "$schedule" --vocab "$vocab" "$@" 2>&1); then
      echo "| $schedule | $vocab | refused: ${first#pipesim: error: } | | | | |"
      continue
    fi
    a=$(step_ms <<<"$first")
    b=$(run --schedule "$schedule" --vocab "$vocab" "$@" | step_ms)
    p=$($pipesim simulate "$config" --schedule "$schedule" --vocab "$vocab" --set parallel.pp="$ranks" "${model[@]}" \
      --profile "$work/$from.json" | sim_ms)
    read -r spread error < <(awk -v a="$a" -v b="$b" -v p="$p" 'BEGIN {
      m = (a + b) / 2; d = a - b; if (d < 0) d = -d
      printf "%.1f %+.1f\n", 100 * d / m, 100 * (p - m) / m }')
    echo "| $schedule | $vocab | $a, $b | ${spread}% | $p | $from | ${error}% |"
    total=$(awk -v t="$total" -v e="$error" 'BEGIN { if (e < 0) e = -e; print t + e }')
    count=$((count + 1))
  done
done
((count)) && awk -v t="$total" -v n="$count" 'BEGIN { printf "\nmean |error| over %d rows: %.1f%%\n", n, t / n }'
