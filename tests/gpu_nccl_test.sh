#!/usr/bin/env bash
# The NCCL path on one GPU: `mpirun -np N pipesim run --backend cuda --ranks-share-gpu`, one process
# per rank sharing the GPU, NCCL over sockets. Every schedule × vocabulary mode with --check on 4
# ranks, every schedule on 2, data-parallel replicas (dp = 2 × pp = 2 on 4 ranks, ZeRO 0 and 1),
# tensor-parallel ranks (tp = 2 × pp = 2, sequence-parallel or not) and the Llama-family config (llama-tiny.json), then faults: a rank that hangs at an op, one that hangs before it creates
# its NCCL communicators, and one killed mid-run or before them must each end every rank within the
# timeout, with an error naming the rank. Exits 77 (SKIP) without a CUDA device, mpirun or a CUDA build.
# Environment (tests/meson.build): PIPESIM, PIPESIM_SOURCE, PIPESIM_MPIRUN, PIPESIM_CUDA_BUILT;
# PIPESIM_GPU_NCCL_JOBS: runs at a time (default 4).
set -u

pipesim=${PIPESIM:?PIPESIM names the pipesim binary}
config=${PIPESIM_SOURCE:?PIPESIM_SOURCE names the source tree}/configs/tiny.json
llama_config=$PIPESIM_SOURCE/configs/llama-tiny.json
mpirun=${PIPESIM_MPIRUN:-}  # may carry options: split on spaces

skip() { echo "skipped: $1"; exit 77; }
[ -n "$mpirun" ] || skip "pipesim was built without MPI, or no mpirun was found (PIPESIM_MPIRUN is empty)"
[ "${PIPESIM_CUDA_BUILT:-0}" = 1 ] || skip "pipesim was built without CUDA (meson setup -Dcuda=enabled)"
nvidia-smi -L 2>/dev/null | grep -q '^GPU ' || skip "no CUDA device (nvidia-smi -L lists none)"

jobs=${PIPESIM_GPU_NCCL_JOBS:-4}  # runs at a time: start-up (MPI, CUDA, NCCL) dominates a tiny run
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# `pipesim list`'s names: the lines under a heading, up to the blank line after it.
names() { "$pipesim" list | awk -v h="$1" '$0 == h {on = 1; next} /^$/ {on = 0} on {print $1}'; }
schedules=$(names "schedules:")
vocabs=$(names "vocabulary modes:")
if [ -z "$schedules" ] || [ -z "$vocabs" ]; then
  echo "FAIL: pipesim list named no schedules or vocabulary modes"
  exit 1
fi

# Run NAME LIMIT NP ARGS...: mpirun -np NP pipesim run CONFIG --backend cuda --ranks-share-gpu ARGS
# in the background (CONFIG: $run_config, else tiny.json),
# under `timeout LIMIT` (the net under the run's own --timeout: exit 124 means
# pipesim did not end itself); its output, exit status and seconds land in $scratch/NAME.*.
names_run=()
launch() {
  local name=$1 limit=$2 np=$3
  shift 3
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
  names_run+=("$name")
  (
    start=$SECONDS
    # shellcheck disable=SC2086  # $mpirun may hold options
    timeout "$limit" $mpirun -np "$np" "$pipesim" run "${run_config:-$config}" --backend cuda --ranks-share-gpu "$@" \
      >"$scratch/$name.out" 2>&1
    echo $? >"$scratch/$name.rc"
    echo $((SECONDS - start)) >"$scratch/$name.secs"
  ) &
}
result() { out=$(cat "$scratch/$1.out"); rc=$(cat "$scratch/$1.rc"); secs=$(cat "$scratch/$1.secs"); }

failures=0
fail() {
  echo "FAIL: $*"
  tail -n 20 <<<"$out"
  failures=$((failures + 1))
}

# Every schedule × vocabulary mode on 4 ranks, every schedule on 2, each checked against the reference.
for schedule in $schedules; do
  for vocab in $vocabs; do launch "np4-$schedule-$vocab" 300 4 --schedule "$schedule" --vocab "$vocab" --check --timeout 60 --format json; done
done
for schedule in $schedules; do
  launch "np2-$schedule-vocab-1" 300 2 --set parallel.pp=2 --schedule "$schedule" --vocab vocab-1 --check --timeout 60 --format json
done
# Two replicas of a 2-device pipeline: a pipeline group and a data-parallel group per rank.
dp="--set parallel.dp=2 --set parallel.pp=2 --set parallel.microbatches=4"
for zero in 0 1; do
  for schedule in 1f1b zb-v; do
    # shellcheck disable=SC2086  # $dp is several options
    launch "np4-dp2-zero$zero-$schedule" 300 4 $dp --set "training.zero_stage=$zero" --schedule "$schedule" \
      --vocab vocab-1 --check --timeout 60 --format json
  done
done
# Two tensor-parallel ranks per device, with and without sequence parallelism.
for sp in true false; do
  # shellcheck disable=SC2086  # several options
  launch "np4-tp2-sp-$sp-1f1b" 300 4 --set parallel.tp=2 --set parallel.pp=2 --set "parallel.sequence_parallel=$sp" \
    --schedule 1f1b --vocab vocab-1 --check --timeout 60 --format json
done
for vocab in $vocabs; do
  run_config=$llama_config launch "np4-llama-1f1b-$vocab" 300 4 --schedule 1f1b --vocab "$vocab" --check \
    --timeout 60 --format json
done
wait
for name in "${names_run[@]}"; do
  result "$name"
  if [ "$rc" -ne 0 ] || ! grep -q '"check_passed": true' <<<"$out"; then
    fail "$name: exit $rc after ${secs}s, expected the check to pass"
  else
    echo "ok: $name (${secs}s)"
  fi
done

# A fault must end every rank, non-zero, within the run's --timeout plus start-up, naming the rank:
# never by the outer `timeout` (124), which would mean a rank was left waiting.
names_run=()
launch fault-hang 120 4 --timeout 10 --inject-fault 1:F:2:hang
launch fault-setup-hang 120 4 --timeout 10 --inject-fault 1:setup:hang
launch fault-kill 120 4 --timeout 10 --inject-fault 2:F:1:kill
launch fault-setup-kill 120 4 --timeout 10 --inject-fault 3:setup:kill
wait
faulted() {  # name, what, expected text
  result "$1"
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$secs" -gt 60 ] || ! grep -qF -- "$3" <<<"$out"; then
    fail "$2: exit $rc after ${secs}s, expected a non-zero exit within 60 s saying '$3'"
  else
    echo "ok: $2 ends the job (exit $rc, ${secs}s): $(grep -F -m1 -- "$3" <<<"$out")"
  fi
}
faulted fault-hang "a rank hanging at an op" "no progress for 10 s; waiting on"
faulted fault-setup-hang "a rank hanging before its NCCL communicators" "no progress for 10 s"
faulted fault-kill "a rank killed mid-run" "rank 2"
faulted fault-setup-kill "a rank killed before its NCCL communicators" "rank 3"

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "all passed"
