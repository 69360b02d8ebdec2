#!/usr/bin/env bash
# Instructions per latest-20 read / per append, plain vs encrypted, counted by callgrind
# (all threads). Usage: bash benchmarks/encryption_instructions.sh [OUTDIR] [MODES]
# Each (mode, op) runs with a small and a large N; per-op = (Ir_large - Ir_small) / dN.
set -euo pipefail
out=${1:-/tmp/enc_callgrind}
modes=${2:-"plain enc enc0"}
py=${PYTHON:-python}
export PYTHONHASHSEED=0  # dict probe counts otherwise differ run to run
mkdir -p "$out"
run() {  # mode op n
  valgrind --tool=callgrind --callgrind-out-file="$out/$1.$2.$3.out" \
    "$py" -m benchmarks.encryption_callgrind "$1" "$2" "$3" >/dev/null 2>"$out/$1.$2.$3.log"
}
total() { grep -m1 '^summary:\|^totals:' "$1" | awk '{print $2}'; }
for mode in $modes; do
  run "$mode" read 20 & run "$mode" read 220; wait
  run "$mode" append 10 & run "$mode" append 110; wait
done
printf '| store | Ir per latest-20 read | Ir per append (4 items) |\n|---|---:|---:|\n'
for mode in $modes; do
  r=$(( ($(total "$out/$mode.read.220.out") - $(total "$out/$mode.read.20.out")) / 200 ))
  a=$(( ($(total "$out/$mode.append.110.out") - $(total "$out/$mode.append.10.out")) / 100 ))
  printf '| %s | %s | %s |\n' "$mode" "$r" "$a"
done
