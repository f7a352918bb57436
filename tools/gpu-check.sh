#!/usr/bin/env bash
# The GPU check in one call, run from a folder tools/gpu-bundle.sh made (no meson, no source tree):
#   ./gpu-check.sh            (in the bundle; or PIPESIM_BUNDLE=DIR tools/gpu-check.sh)
# Runs, each under its own time limit (about 8 minutes in all): the kernel tests, the backend
# against the CPU reference, 2 and 4 NCCL processes sharing the GPU (--ranks-share-gpu) with
# --check, the bf16 GEMM 8192³ and one GPT layer through gpu-bench, and PyTorch's GEMM and layer in
# the same call when python3 has torch; then one table. Exit status: 0 every item that ran passed,
# 1 one failed, 77 none could run (no GPU: every item skipped).
# Environment: PIPESIM_BUNDLE (default: this script's folder), MPIRUN (default: mpirun, with
# --allow-run-as-root --oversubscribe when run as root), GPU_CHECK_OUT (logs; default: a temporary folder).
set -u
bundle=$(cd "${PIPESIM_BUNDLE:-$(dirname "$0")}" && pwd)
bin=$bundle/bin
export LD_LIBRARY_PATH=$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}  # fmt and toml++ (gpu-bundle.sh)
export PIPESIM_CUDA_PLUGIN=$bundle/lib/libpipesim_cuda.so
[ -f "$bundle/lib/libpipesim_mpi.so" ] && export PIPESIM_MPI_PLUGIN=$bundle/lib/libpipesim_mpi.so
export PIPESIM_SOURCE=$bundle  # the tests read configs/ from here
out=${GPU_CHECK_OUT:-$(mktemp -d)}
mkdir -p "$out"
mpirun=${MPIRUN:-mpirun}
[ "$(id -u)" = 0 ] && [ -z "${MPIRUN:-}" ] && mpirun="mpirun --allow-run-as-root --oversubscribe"

rows=()
failed=0 ran=0
row() { rows+=("$1|$2|$3"); }  # item, status, figure

gpu=yes
nvidia-smi -L 2>/dev/null | grep -q '^GPU ' || gpu=
[ -n "$gpu" ] && nvidia-smi -L | head -1

# item NAME LIMIT_S COMMAND...: runs it; 77 is a skip. Its output goes to $out/NAME.log.
item() {
  local name=$1 limit=$2; shift 2
  if [ -z "$gpu" ]; then row "$name" "skipped" "no CUDA device (nvidia-smi -L lists none)"; return 77; fi
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  case $rc in
    0) ran=$((ran + 1)); row "$name" "pass" "$(figure "$name")" ;;
    77) row "$name" "skipped" "$(tail -1 "$out/$name.log")" ;;
    124) ran=$((ran + 1)) failed=1; row "$name" "FAIL" "over ${limit} s" ;;
    *) ran=$((ran + 1)) failed=1; row "$name" "FAIL" "exit $rc: $(grep -v '^\s*$' "$out/$name.log" | tail -1 | cut -c1-100)" ;;
  esac
  return $rc
}
figure() {
  case $1 in
    cuda-kernels) grep -E "^[0-9]+ checks" "$out/$1.log" | tail -1 ;;
    runtime-cuda) grep -E "passed|assertions" "$out/$1.log" | tail -1 ;;
    nccl-*) grep -iE "check|loss" "$out/$1.log" | tail -1 | cut -c1-100 ;;
    gemm-bench) grep -iE "TFLOP|ms" "$out/$1.log" | tail -2 | tr '\n' ' ' | cut -c1-120 ;;
    # The times and how the GEMMs were chosen, without the shape (the command line's defaults).
    layer-bench) grep -E "^one layer" "$out/$1.log" | tail -1 | sed 's/^one layer ([^)]*): //' | cut -c1-120 ;;
    *) tail -1 "$out/$1.log" | cut -c1-100 ;;
  esac
}

item cuda-kernels 90 "$bin/cuda_kernels_test"
item runtime-cuda 150 "$bin/runtime_cuda_test"
if ! command -v "${mpirun%% *}" >/dev/null 2>&1 || [ ! -f "$bundle/lib/libpipesim_mpi.so" ]; then
  for n in 2 4; do row "nccl-$n" "skipped" "no mpirun here, or the bundle has no MPI plugin"; done
else
  for n in 2 4; do
    item "nccl-$n" 60 $mpirun -np $n "$bin/pipesim" run "$bundle/configs/tiny.json" --ranks $n --backend cuda \
      --ranks-share-gpu --check --timeout 30
  done
fi
item gemm-bench 40 "$bin/gpu-bench" --size 8192 --iterations 50
item layer-bench 40 "$bin/gpu-bench" --layer --iterations 20
if [ -z "$gpu" ]; then
  row "pytorch" "skipped" "no CUDA device"
elif ! python3 -c "import torch; assert torch.cuda.is_available()" >/dev/null 2>&1; then
  row "pytorch" "skipped" "python3 with CUDA torch not found here: no PyTorch figures in this call"
else
  item pytorch 90 python3 "$bundle/tools/torch-gemm.py"
  [ -f "$bundle/tools/measure-ops.py" ] &&
    item pytorch-layers 120 python3 "$bundle/tools/measure-ops.py" --reference -o "$out/pytorch-layers.json"
fi

printf '\n%-15s %-8s %s\n' item status figure
printf '%-15s %-8s %s\n' ---- ------ ------
for r in "${rows[@]}"; do IFS='|' read -r name status fig <<<"$r"; printf '%-15s %-8s %s\n' "$name" "$status" "$fig"; done
echo "logs: $out"
[ "$failed" = 1 ] && exit 1
[ "$ran" = 0 ] && exit 77
exit 0
