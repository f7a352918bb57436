#!/usr/bin/env bash
# Predicted MFU and peak memory for every setup of the Vocabulary Parallelism paper (configs/paper/)
# x method x vocabulary size, as one Markdown table. Usage: tools/paper-table.sh [path/to/pipesim]
set -euo pipefail
cd "$(dirname "$0")/.."
pipesim=${1:-build/tools/pipesim}

echo "| setup | seq | vocab | method | MFU % | peak memory GiB | fits | speedup vs baseline |"
echo "|---|---:|---:|---|---:|---:|---|---:|"
for setup in 1f1b-8gpu 1f1b-16gpu 1f1b-32gpu v-half-16gpu v-half-24gpu v-half-32gpu; do
 for seq in 2048 4096; do
  config=configs/paper/$setup-seq$seq.json
  case "$setup" in
    1f1b-*) schedule=1f1b methods=baseline,redistribute,vocab-1,vocab-2,interlaced ;;
    *) schedule=v-half methods=baseline,vocab-1,vocab-2 ;;
  esac
  for vocab in 32000 64000 128000 256000; do
    "$pipesim" compare "$config" --schedules "$schedule" --vocab "$methods" --set "model.vocab=$vocab" --format csv |
      awk -F, -v setup="$setup" -v seq="$seq" -v vocab="$vocab" \
        'NR > 1 { printf "| %s | %s | %dk | %s | %s | %s | %s | %s |\n", setup, seq, vocab / 1000, $3, $6, $8, $11, $9 }'
  done
 done
done
