#!/usr/bin/env bash
# The NCCL path on one GPU: `mpirun -np N pipesim run --backend cuda --ranks-share-gpu`, one process
# per rank sharing the GPU, NCCL over sockets. Every schedule × vocabulary mode with --check on 4
# ranks, every schedule on 2, then faults: a rank that hangs at an op, one that hangs before it creates
# its NCCL communicators, and one killed mid-run must each end every rank within the timeout, with an
# error naming the rank. Exits 77 (SKIP) without a CUDA device, mpirun or a CUDA build.
# Environment (tests/meson.build): PIPESIM, PIPESIM_SOURCE, PIPESIM_MPIRUN, PIPESIM_CUDA_BUILT.
set -u

pipesim=${PIPESIM:?PIPESIM names the pipesim binary}
config=${PIPESIM_SOURCE:?PIPESIM_SOURCE names the source tree}/configs/tiny.json
mpirun=${PIPESIM_MPIRUN:-}  # may carry options: split on spaces

skip() { echo "skipped: $1"; exit 77; }
[ -n "$mpirun" ] || skip "pipesim was built without MPI, or no mpirun was found (PIPESIM_MPIRUN is empty)"
[ "${PIPESIM_CUDA_BUILT:-0}" = 1 ] || skip "pipesim was built without CUDA (meson setup -Dcuda=enabled)"
nvidia-smi -L 2>/dev/null | grep -q '^GPU ' || skip "no CUDA device (nvidia-smi -L lists none)"

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# `pipesim list`'s names: the lines under a heading, up to the blank line after it.
names() { "$pipesim" list | awk -v h="$1" '$0 == h {on = 1; next} /^$/ {on = 0} on {print $1}'; }
schedules=$(names "schedules:")
vocabs=$(names "vocabulary modes:")
if [ -z "$schedules" ] || [ -z "$vocabs" ]; then
  echo "FAIL: pipesim list named no schedules or vocabulary modes"
  exit 1
fi

# mpirun -np $1 pipesim run tiny.json --backend cuda --ranks-share-gpu ARGS...; sets $out, $rc, $secs.
# `timeout` is the net under the run's own --timeout: 124 means pipesim did not end itself.
launch() {
  local np=$1 limit=$2
  shift 2
  local start=$SECONDS
  # shellcheck disable=SC2086  # $mpirun may hold options
  out=$(timeout "$limit" $mpirun -np "$np" "$pipesim" run "$config" --backend cuda --ranks-share-gpu "$@" 2>&1)
  rc=$?
  secs=$((SECONDS - start))
}

checked() {  # np schedule vocab
  launch "$1" 180 --schedule "$2" --vocab "$3" --check --timeout 60 --format json
  if [ "$rc" -ne 0 ] || ! grep -q '"check_passed": true' <<<"$out"; then
    fail "-np $1 --schedule $2 --vocab $3: exit $rc after ${secs}s"
    tail -n 20 <<<"$out"
  else
    echo "ok: -np $1 $2 / $3 (${secs}s)"
  fi
}

for schedule in $schedules; do
  for vocab in $vocabs; do checked 4 "$schedule" "$vocab"; done
done
for schedule in $schedules; do checked 2 "$schedule" vocab-1; done

# A fault must end every rank, non-zero, within the run's --timeout (plus start-up), naming the rank:
# never the outer `timeout` (124), which would mean a rank was left waiting.
faulted() {  # what, expected text, args...
  local what=$1 expect=$2
  shift 2
  launch 4 120 --timeout 10 "$@"
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$secs" -gt 60 ] || ! grep -qF -- "$expect" <<<"$out"; then
    fail "$what: exit $rc after ${secs}s, expected a non-zero exit within 60 s saying '$expect'"
    tail -n 20 <<<"$out"
  else
    echo "ok: $what ends the job (exit $rc, ${secs}s): $(grep -F -m1 -- "$expect" <<<"$out")"
  fi
}
faulted "a rank hanging at an op" "no progress for 10 s; waiting on" --inject-fault 1:F:2:hang
faulted "a rank hanging before its NCCL communicators" "no progress for 10 s" --inject-fault 1:setup:hang
faulted "a rank killed mid-run" "rank 2" --inject-fault 2:F:1:kill
faulted "a rank killed before its NCCL communicators" "rank 3" --inject-fault 3:setup:kill

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "all passed"
