#!/usr/bin/env bash
# Builds the libFuzzer targets in tests/fuzz/ with clang (ASan + UBSan, any report is fatal) and
# runs each for SECONDS (default 60) from the seed corpus in tests/fuzz/<target>/. New inputs go to
# build-fuzz/corpus/, crashes to build-fuzz/<target>-crash-*; the exit status is non-zero on a finding.
# Targets: config, schedule_csv, overrides, cli (docs/hardening.md says what each drives).
# Needs clang++ and libFuzzer (Debian 12: apt-get install clang libclang-rt-14-dev).
#   tools/fuzz.sh 600        # 10 minutes per target
#   tools/fuzz.sh 600 config # one target
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
targets=("${@:2}")
((${#targets[@]})) || targets=(config schedule_csv overrides cli)
root=$PWD
out=$root/build-fuzz  # absolute: the cli target works in a folder of its own

if ! command -v clang++ >/dev/null ||
   ! echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' |
     clang++ -x c++ - -fsanitize=fuzzer -o /dev/null 2>/dev/null; then
  echo "fuzz.sh: needs clang++ with libFuzzer; on Debian 12: apt-get install clang libclang-rt-14-dev" >&2
  exit 1
fi

# The library code the targets reach, as the Meson build compiles it (minus the runtime and the CLI).
flags=(-std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
       -Isrc -Ischedules -Isim -Iplan -Itools/formats)
sources=(src/*.cpp schedules/*.cpp sim/simulator.cpp plan/*.cpp tools/formats/config_json.cpp
         tools/formats/config_includes.cpp tools/formats/config_files.cpp tools/formats/files.cpp tools/formats/schedule_csv.cpp
         tools/formats/schedule_csv_cells.cpp tools/formats/output_file.cpp)
# The cli target drives the whole command line (tools/cli/command_line.h), so it needs the rest of the
# tools and the runtime too (whose commands it parses but never runs); no plugin path, as without CUDA
# and MPI.
cli_flags=(-Itools/simulate -Itools/tune -Itools/calibrate -Itools/jobs -Itools/cli -Iruntime -Iruntime/base
           -Iruntime/cpu -DPIPESIM_VERSION='"fuzz"' -DPIPESIM_CUDA_PLUGIN_PATH='""' -DPIPESIM_MPI_PLUGIN_PATH='""')
cli_sources=(tools/formats/chrome_trace.cpp tools/formats/report.cpp tools/formats/svg_timeline.cpp
             tools/formats/svg_parts.cpp tools/formats/svg_memory.cpp tools/formats/svg_scatter.cpp
             tools/formats/html_report.cpp tools/formats/config_writer.cpp tools/formats/profile.cpp
             tools/simulate/*.cpp tools/tune/*.cpp tools/calibrate/*.cpp tools/jobs/*.cpp runtime/*.cpp
             runtime/cpu/kernels.cpp runtime/cpu/llama_kernels.cpp runtime/cpu/model.cpp runtime/cpu/vocab.cpp
             runtime/cuda/cuda_loader.cpp)
for f in tools/cli/*.cpp; do [[ $f == tools/cli/main.cpp || $f == tools/cli/huge_pages.cpp ]] || cli_sources+=("$f"); done
# Compiles what changed: a file whose object is missing or older than it, than any header, or than
# this script (whose flags it was built with). An instrumented build takes minutes on two cores.
compile() {  # OBJECT-FOLDER FILE...
  local dir=$1 file object stale=(); shift
  mkdir -p "$dir"
  for file in "$@"; do
    object=$dir/$(echo "$file" | tr / _).o
    if [[ ! "$object" -nt "$file" || -n $(find src schedules sim plan tools runtime tools/fuzz.sh \
          \( -name '*.h' -o -name fuzz.sh \) -newer "$object" -print -quit) ]]; then
      stale+=("$file")
    fi
  done
  echo "fuzz.sh: compiling ${#stale[@]} of $# files" >&2
  ((${#stale[@]})) || return 0
  printf '%s\n' "${stale[@]}" | xargs -P "$(nproc)" -I{} sh -c \
    'clang++ "$@" -fsanitize=fuzzer-no-link -c {} -o '"$dir"'/$(echo {} | tr / _).o' sh "${flags[@]}" "${cli_flags[@]}"
}
compile "$out/obj" "${sources[@]}"
[[ " ${targets[*]} " == *" cli "* ]] && compile "$out/obj-cli" "${cli_sources[@]}"
# The objects of the files listed above, not every object in the folders: one left from a file that
# moved between the lists would be linked twice.
objects_of() {  # OBJECT-FOLDER FILE...
  local dir=$1 file; shift
  for file in "$@"; do echo "$dir/$(echo "$file" | tr / _).o"; done
}
mapfile -t base_objects < <(objects_of "$out/obj" "${sources[@]}")
mapfile -t cli_objects < <(objects_of "$out/obj-cli" "${cli_sources[@]}")

status=0
for target in "${targets[@]}"; do
  objects=("${base_objects[@]}") extra=()
  # The command line prints a line or a report per input: its output goes nowhere (libFuzzer's own,
  # and any sanitizer report, still reach the log).
  [[ $target == cli ]] && objects+=("${cli_objects[@]}" -ldl -pthread) extra=(-close_fd_mask=3)
  clang++ "${flags[@]}" "${cli_flags[@]}" -fsanitize=fuzzer "tests/fuzz/${target}_fuzz.cpp" "${objects[@]}" -lfmt \
    -o "$out/${target}_fuzz"
  mkdir -p "$out/corpus/$target"
  [[ -f "tests/fuzz/$target.dict" ]] && extra+=(-dict="$root/tests/fuzz/$target.dict")
  echo "fuzz.sh: $target for $seconds s (log: $out/$target.log)" >&2
  if ! "$out/${target}_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$out/$target-" "${extra[@]}" "$out/corpus/$target" "$root/tests/fuzz/$target" \
       >"$out/$target.log" 2>&1; then
    status=1
    echo "fuzz.sh: $target found a problem; see $out/$target.log and $out/$target-*" >&2
  fi
  # The last status line (inputs, coverage, execs/s) and the final statistics.
  grep -E '^#[0-9]+' "$out/$target.log" | tail -1
  grep -E '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$out/$target.log" || true
done
exit "$status"
