#!/usr/bin/env bash
# The simulator against the runtime: runs each schedule x vocabulary mode for real on the CPU runtime,
# then simulates the same graph with the op times just measured, and prints both iteration times.
# Usage: tools/sim-vs-run.sh [RANKS (default: cores, at most 4)] [extra pipesim run options...]
# Ranks should not exceed the cores: with more ranks than cores they take turns and the measurement
# is no longer of a pipeline with one device per rank.
set -euo pipefail
cd "$(dirname "$0")/.."
cores=$(nproc)
ranks=${1:-$((cores < 4 ? cores : 4))}
shift || true
pipesim=build/tools/pipesim
[[ -x $pipesim ]] || tools/setup.sh
model=(--set model.hidden=128 --set model.ffn_hidden=512 --set model.seq_len=64 --set parallel.microbatches=8)
echo "| schedule | vocab | measured ms | simulated ms | difference |"
echo "|---|---|---:|---:|---:|"
for schedule in gpipe 1f1b interleaved-1f1b zb-h1 v-half v-min zb-v dualpipe-v; do
  for vocab in baseline vocab-1 vocab-2; do
    if ! out=$($pipesim run configs/tiny.json --ranks "$ranks" --schedule "$schedule" --vocab "$vocab" --steps 3 \
      "${model[@]}" "$@" 2>&1); then
      echo "| $schedule | $vocab | refused: ${out#pipesim: error: } | | |"
      continue
    fi
    echo "$out" | awk -v s="$schedule" -v v="$vocab" '
      /^step time:/ { measured = $3 }
      /^simulated with the measured op times:/ { simulated = $7; diff = $9; sub(/^\(/, "", diff) }
      END { printf "| %s | %s | %s | %s | %s |\n", s, v, measured, simulated, diff }'
  done
done
