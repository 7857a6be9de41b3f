#!/usr/bin/env bash
# strace -f -c of `sluice serve` per side during a short small-request bench (CONC clients, DUR):
# exact calls (and errors: EAGAIN reads, the liveness peek's EAGAIN) per request. strace slows the
# process several-fold, so the share of reads that meet EAGAIN differs from an untraced run's.
#   BINS="base=/tmp/base new=/tmp/new" bash docs/benchmarks/smallreq4/stracecount.sh OUT
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd) # docs/benchmarks
OUT=${1:?OUT}; BINS=${BINS:?}; DUR=${DUR:-2s}; CONC=${CONC:-4}
mkdir -p "$OUT/raw" "$OUT/logs" "$OUT/conf"; OUT=$(cd "$OUT" && pwd)
ulimit -n "$(ulimit -Hn)" 2>/dev/null
. "$HERE/lib.sh"
names=(); declare -A BIN
for b in $BINS; do names+=("${b%%=*}"); BIN[${b%%=*}]=${b#*=}; done
first=${BIN[${names[0]}]}
start_stream_sim "$first" || exit 1
sluice_conf "$OUT/conf/sluice.yaml" own
for name in "${names[@]}"; do
  envname=ENV_$name
  ( [[ -n ${!envname:-} ]] && export ${!envname}; exec "${BIN[$name]}" serve -c "$OUT/conf/sluice.yaml" ) >"$OUT/logs/sluice-$name.log" 2>&1 &
  sp=$!; PIDS+=($sp); wait_port $HTTP || exit 1; sleep 1
  strace -f -c -p $sp -o "$OUT/raw/strace-$name.txt" & st=$!; sleep 0.5
  "$first" bench -target "http://127.0.0.1:$HTTP" -model sim-stream -no-stream -concurrency $CONC -prompt-tokens 16 -output-tokens 1 \
    -duration "$DUR" -api-key sk-bench-suite -progress never -json "$OUT/raw/$name.json" >"$OUT/logs/bench-$name.log" 2>&1
  sleep 0.3; kill -INT $st; wait $st
  sent=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["targets"][0]["counts"]["sent"])' "$OUT/raw/$name.json")
  echo "== $name: $sent requests" | tee -a "$OUT/summary.txt"
  awk -v n="$sent" '$1 ~ /^[0-9.]+$/ && (NF == 5 || NF == 6) && $NF != "total" {e = (NF == 6) ? $5 : 0; printf "%-16s %8d %7.3f  errors %7.3f\n", $NF, $4, $4/n, e/n}' \
    "$OUT/raw/strace-$name.txt" | sort -k3 -nr | head -12 | tee -a "$OUT/summary.txt"
  kill "$sp"; wait "$sp" 2>/dev/null
done
