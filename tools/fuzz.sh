#!/usr/bin/env bash
# Builds the libFuzzer targets in tests/fuzz/ with clang (ASan + UBSan, any report is fatal) and
# runs each for SECONDS (default 60) from the seed corpus in tests/fuzz/<target>/. New inputs go to
# build-fuzz/corpus/, crashes to build-fuzz/<target>-crash-*; the exit status is non-zero on a finding.
# Needs clang++ and libFuzzer (Debian 12: apt-get install clang libclang-rt-14-dev).
#   tools/fuzz.sh 600        # 10 minutes per target
#   tools/fuzz.sh 600 config # one target
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
targets=("${@:2}")
((${#targets[@]})) || targets=(config schedule_csv overrides)
out=build-fuzz

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
         tools/formats/schedule_csv_cells.cpp)
mkdir -p "$out/obj"
echo "fuzz.sh: compiling ${#sources[@]} files" >&2
printf '%s\n' "${sources[@]}" | xargs -P "$(nproc)" -I{} sh -c \
  'clang++ "$@" -fsanitize=fuzzer-no-link -c {} -o '"$out"'/obj/$(echo {} | tr / _).o' sh "${flags[@]}"

status=0
for target in "${targets[@]}"; do
  clang++ "${flags[@]}" -fsanitize=fuzzer "tests/fuzz/${target}_fuzz.cpp" "$out"/obj/*.o -lfmt -o "$out/${target}_fuzz"
  mkdir -p "$out/corpus/$target"
  dict=()
  [[ -f "tests/fuzz/$target.dict" ]] && dict=(-dict="tests/fuzz/$target.dict")
  echo "fuzz.sh: $target for $seconds s (log: $out/$target.log)" >&2
  if ! "$out/${target}_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$out/$target-" "${dict[@]}" "$out/corpus/$target" "tests/fuzz/$target" >"$out/$target.log" 2>&1; then
    status=1
    echo "fuzz.sh: $target found a problem; see $out/$target.log and $out/$target-*" >&2
  fi
  # The last status line (inputs, coverage, execs/s) and the final statistics.
  grep -E '^#[0-9]+' "$out/$target.log" | tail -1
  grep -E '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$out/$target.log" || true
done
exit "$status"
