#!/usr/bin/env bash
# The GPU figures docs/benchmark.md records, in one go on a machine with a GPU (build with CUDA first:
# meson setup build -Dcuda=enabled && ninja -C build):
#   1. the GPU test suite: every CUDA kernel against the CPU one (cuDNN attention and the GEMM
#      epilogues included), the CUDA backend against the CPU reference for every schedule x vocabulary
#      mode, and the NCCL path: 2 and 4 MPI processes sharing the GPU, with --check and faults;
#   2. bf16 8192^3 GEMM through the runtime's cuBLASLt path, and cuBLAS's own through PyTorch;
#   3. one transformer layer (h 4096, 32 heads, FFN 16384, seq 2048, micro-batch 1, bf16), forward and
#      forward + backward, through the CUDA backend, with cuDNN attention and with the unfused one;
#   4. attention alone, GPT's and Llama-3-8B's (32 query, 8 key/value heads);
#   5. PyTorch eager on the same GPU: the GPT and Llama-3-8B layers (tools/measure-ops.py --reference);
#   6. configs/examples/gpt-small-gpu.json on 4 MPI processes sharing the GPU over NCCL, each schedule
#      predicted from another schedule's profile (tools/sim-vs-run.sh --mpirun);
#   7. Llama-3-8B's layers (configs/default.json cut to 8 layers, bf16) on the CUDA backend: 4 ranks
#      sharing the GPU in one process, with the memory table beside the simulator's.
# Usage: tools/gpu-figures.sh [OUTPUT_DIR (default .)]; each step's output also goes to OUTPUT_DIR.
# PIPESIM_BUILD names another build folder (default build).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-.}
build=${PIPESIM_BUILD:-build}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
date -u +%F | tee -a "$out/gpu.txt"
meson test -C "$build" --suite gpu --print-errorlogs 2>&1 | tee "$out/gpu-tests.txt"
bench=$build/runtime/cuda/bench/gpu-bench
{
  "$bench" --size 8192 --iterations 50
  python3 tools/torch-gemm.py
} 2>&1 | tee "$out/gemm.txt"
{
  "$bench" --layer --iterations 20
  PIPESIM_ATTENTION=gemm "$bench" --layer --iterations 20
} 2>&1 | tee "$out/layer.txt"
{
  "$bench" --attention --query-heads 32 --kv-heads 32 --iterations 20
  "$bench" --attention --query-heads 32 --kv-heads 8 --iterations 20
} 2>&1 | tee "$out/attention.txt"
python3 tools/measure-ops.py --reference -o "$out/pytorch-layers.json" 2>&1 | tee "$out/pytorch-layers.txt"
tools/sim-vs-run.sh --ranks 4 --rounds 2 --config configs/examples/gpt-small-gpu.json --mpirun mpirun \
  -- --backend cuda --dtype bf16 --ranks-share-gpu 2>&1 | tee "$out/sim-vs-run.txt"
"$build/tools/pipesim" run configs/default.json --set model.layers=8 --set parallel.pp=4 --backend cuda --dtype bf16 --steps 5 \
  2>&1 | tee "$out/llama-8-layers.txt"
