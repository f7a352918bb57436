#!/usr/bin/env bash
# Copies what tools/gpu-check.sh runs into one relocatable folder, stripped, to carry to a GPU
# machine that has no meson (and whose meson would refuse this build folder anyway):
#   tools/gpu-bundle.sh [BUILD] [OUT]     (defaults: build, gpu-bundle)
# OUT gets bin/ (pipesim, cuda_kernels_test, runtime_cuda_test, gpu-bench), lib/ (the CUDA and MPI
# plugins, which pipesim finds through PIPESIM_CUDA_PLUGIN and PIPESIM_MPI_PLUGIN, and fmt and toml++), configs/,
# tools/measure-ops.py, tools/torch-gemm.py and gpu-check.sh. Nothing in it names the build folder:
# gpu-check.sh sets the paths from where it lies. Prints the folder's size; fails above 64 MiB (what a device call carries).
set -euo pipefail
build=${1:-build}
out=${2:-gpu-bundle}
src=$(cd "$(dirname "$0")/.." && pwd)
limit_mib=64

need() { [ -f "$build/$1" ] || { echo "gpu-bundle: $build/$1 is missing: build it first (ninja -C $build)" >&2; exit 1; }; }
for f in tools/pipesim tests/cuda_kernels_test tests/runtime_cuda_test runtime/cuda/bench/gpu-bench \
         runtime/cuda/libpipesim_cuda.so; do need "$f"; done

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/tools"
cp "$build/tools/pipesim" "$build/tests/cuda_kernels_test" "$build/tests/runtime_cuda_test" \
   "$build/runtime/cuda/bench/gpu-bench" "$out/bin/"
cp "$build/runtime/cuda/libpipesim_cuda.so" "$out/lib/"
[ -f "$build/runtime/mpi/libpipesim_mpi.so" ] && cp "$build/runtime/mpi/libpipesim_mpi.so" "$out/lib/"
# The libraries of this machine's packages that the GPU machine may lack (toml++ is not on it); CUDA,
# NCCL, MPI and the C and C++ runtimes stay the GPU machine's own. gpu-check.sh puts lib/ first on
# the loader's path.
ldd "$out"/bin/* "$out"/lib/*.so | awk '$1 ~ /^lib(fmt|tomlplusplus)\./ && $3 ~ /^\// {print $3}' | sort -u |
  while read -r lib; do cp -L "$lib" "$out/lib/"; done
cp -r "$src/configs" "$out/"
cp "$src/tools/measure-ops.py" "$src/tools/torch-gemm.py" "$out/tools/"
cp "$src/tools/gpu-check.sh" "$out/"
strip --strip-unneeded "$out"/bin/* "$out"/lib/*.so
bytes=$(du -sb "$out" | cut -f1)
mib=$(( (bytes + 1048575) / 1048576 ))
echo "gpu-bundle: $out: $mib MiB ($bytes bytes)"
du -b "$out"/bin/* "$out"/lib/* | awk '{printf "  %6.1f MiB  %s\n", $1 / 1048576, $2}'
if [ "$mib" -gt "$limit_mib" ]; then
  echo "gpu-bundle: over $limit_mib MiB: too large to carry" >&2
  exit 1
fi
