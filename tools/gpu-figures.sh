#!/usr/bin/env bash
# The GPU figures docs/benchmark.md records, in one go on a machine with a GPU (build with CUDA first:
# meson setup build -Dcuda=enabled && ninja -C build):
#   1. the GPU test suite: every CUDA kernel against the CPU one, the CUDA backend against the CPU
#      reference for every schedule x vocabulary mode (fp32) and in bf16;
#   2. the runtime's GEMM path, bf16 8192^3;
#   3. one transformer layer (h 4096, 32 heads, FFN 16384, seq 2048, micro-batch 1, bf16), forward and
#      forward + backward, through the CUDA backend;
#   4. configs/examples/gpt-small-gpu.json on 4 ranks sharing the GPU, each schedule predicted from
#      another schedule's profile (tools/sim-vs-run.sh; gpt-1b takes minutes a run until the bf16
#      attention uses tensor cores).
# Usage: tools/gpu-figures.sh [OUTPUT_DIR (default .)]; each step's output also goes to OUTPUT_DIR.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-.}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
date -u +%F | tee -a "$out/gpu.txt"
meson test -C build --suite gpu --print-errorlogs 2>&1 | tee "$out/gpu-tests.txt"
build/runtime/cuda/bench/gpu-bench --size 8192 --iterations 50 2>&1 | tee "$out/gemm.txt"
build/runtime/cuda/bench/gpu-bench --layer --iterations 20 2>&1 | tee "$out/layer.txt"
tools/sim-vs-run.sh --ranks 4 --rounds 2 --config configs/examples/gpt-small-gpu.json -- --backend cuda --dtype bf16 2>&1 | tee "$out/sim-vs-run.txt"
