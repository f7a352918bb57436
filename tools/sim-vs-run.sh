#!/usr/bin/env bash
# The simulator against the runtime, honestly: each schedule x vocabulary mode is run for real, and
# the simulator predicts its iteration time from the op times of a *different* run (the calibration
# schedule, zb-h1, whose split backward gives F, B and W apart; zb-h1 itself is predicted from zb-v).
# Each target runs 6 steps; a round's measured time is the median of steps 2-6 (the first warms caches
# and allocators up). The whole measurement -- calibration runs and targets -- is repeated in ROUNDS
# rounds (default 3), so that a slow spell of the machine hits every row alike rather than one; each
# row reports the median over rounds of the measured and of the predicted time, and the spread of
# the measured one over the rounds' steps, (max - min) / median, beside the error so that noise is
# not mistaken for error.
#
# Usage: tools/sim-vs-run.sh [--ranks N] [--rounds R] [--config FILE] [--schedules a,b,..] [--vocabs x,y,..]
#                            [--mpirun 'COMMAND'] [--set KEY=VALUE ...]
#                            [-- extra `pipesim run` options, e.g. --backend cuda --dtype bf16]
# --set: the model and layout of every run and prediction (e.g. --set parallel.tp=2), in place of the default's widening.
# --mpirun: one process per rank, launched by COMMAND (e.g. 'mpirun --allow-run-as-root --oversubscribe';
# add --ranks-share-gpu after -- for NCCL ranks sharing one GPU) instead of threads in one process.
# Defaults: configs/tiny.json widened to ops of milliseconds (hidden 128, FFN 512, seq 64), ranks = cores
# (at most 4: with more ranks than cores they take turns and the pipeline is no longer measured),
# schedules 1f1b, interleaved-1f1b, v-half, zb-v, zb-h1, vocabularies baseline and vocab-1.
set -euo pipefail
cd "$(dirname "$0")/.."
cores=$(nproc)
ranks=$((cores < 4 ? cores : 4))
rounds=3
mpirun=
config=configs/tiny.json
schedules=1f1b,interleaved-1f1b,v-half,zb-v,zb-h1
vocabs=baseline,vocab-1
sets=()
while (($#)); do
  case $1 in
    --ranks) ranks=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --config) config=$2; shift 2 ;;
    --schedules) schedules=$2; shift 2 ;;
    --vocabs) vocabs=$2; shift 2 ;;
    --mpirun) mpirun=$2; shift 2 ;;
    --set) sets+=(--set "$2"); shift 2 ;;
    --) shift; break ;;
    *) echo "sim-vs-run: unknown option $1 (see the usage at the top of $0)" >&2; exit 1 ;;
  esac
done
pipesim=build/tools/pipesim
[[ -x $pipesim ]] || { tools/setup.sh && ninja -C build >/dev/null; }  # with the MPI plugin mpirun loads
# The model both the runs and the predictions take: --set's, or tiny.json widened.
model=("${sets[@]}")
[[ $config == configs/tiny.json && ${#sets[@]} == 0 ]] &&
  model=(--set model.hidden=128 --set model.ffn_hidden=512 --set model.seq_len=64 --set parallel.microbatches=8)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The times of steps 2.. in ms, one line, from a run's JSON report.
steps_ms() {
  python3 -c 'import json, sys
print(" ".join(f"{1e3 * s:.3f}" for s in json.load(sys.stdin)["step_times_s"][1:]))'
}
sim_ms() { awk '/^iteration / { print $2; exit }'; }
# shellcheck disable=SC2086  # $mpirun holds the launcher and its options
run() { ${mpirun:+$mpirun -np "$ranks"} $pipesim run "$config" --ranks "$ranks" "${model[@]}" "$@"; }

# One line per round and row: schedule vocab from predicted_ms step_ms..., or schedule vocab refused why.
for ((round = 1; round <= rounds; round++)); do
  echo "sim-vs-run: round $round of $rounds" >&2
  for vocab in ${vocabs//,/ }; do
    for calibration in zb-h1 zb-v; do
      run --schedule "$calibration" --vocab "$vocab" --steps 3 --profile "$work/$calibration.json" "$@" >/dev/null
    done
    for schedule in ${schedules//,/ }; do
      from=zb-h1
      [[ $schedule == zb-h1 ]] && from=zb-v
      if ! report=$(run --schedule "$schedule" --vocab "$vocab" --steps 6 --format json "$@" 2>&1); then
        echo "$schedule $vocab refused ${report#pipesim: error: }"
        continue
      fi
      p=$($pipesim simulate "$config" --schedule "$schedule" --vocab "$vocab" --set parallel.pp="$ranks" \
        "${model[@]}" --profile "$work/$from.json" | sim_ms)
      echo "$schedule $vocab $from $p $(steps_ms <<<"$report")"
    done
  done
done >"$work/rows"

python3 - "$work/rows" "$rounds" <<'PY'
import statistics, sys
rows, order = {}, []
for line in open(sys.argv[1]):
    schedule, vocab, rest = line.split(" ", 2)
    key = (schedule, vocab)
    if key not in rows:
        order.append(key)
        rows[key] = {"predicted": [], "measured": [], "steps": [], "refused": None}
    if rest.startswith("refused "):
        rows[key]["refused"] = rest[len("refused "):].strip()
        continue
    source, predicted, *steps = rest.split()
    steps = [float(s) for s in steps]
    rows[key].update(source=source)
    rows[key]["predicted"].append(float(predicted))
    rows[key]["measured"].append(statistics.median(steps))
    rows[key]["steps"] += steps
print(f"| schedule | vocab | measured ms (median of {sys.argv[2]} rounds) | spread | predicted ms | from | error |")
print("|---|---|---:|---:|---:|---|---:|")
errors = []
for key in order:
    r = rows[key]
    if not r["measured"]:
        print(f"| {key[0]} | {key[1]} | refused: {r['refused']} | | | | |")
        continue
    measured, predicted = statistics.median(r["measured"]), statistics.median(r["predicted"])
    spread = 100 * (max(r["steps"]) - min(r["steps"])) / statistics.median(r["steps"])
    error = 100 * (predicted - measured) / measured
    errors.append(abs(error))
    print(f"| {key[0]} | {key[1]} | {measured:.1f} | {spread:.1f}% | {predicted:.1f} | {r['source']} | {error:+.1f}% |")
if errors:
    print(f"\nmean |error| over {len(errors)} rows: {statistics.mean(errors):.1f}%")
PY
