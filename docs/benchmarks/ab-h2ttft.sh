#!/usr/bin/env bash
# ab-h2ttft.sh OUT A B [ROUNDS]: target 2's h2 shape (64 TLS h2 streams of 200 tokens at 10 ms,
# 8 s x 2 rounds against the direct simulator per side) against Sluice binaries A and B
# alternately, each a fresh `sluice serve` per round; prints per round the TTFT P50, the
# direct side's and their difference, and the CPU per 1,000 tokens. Loopback only; wrap it
# in flock /work/bench.lock. (framed16 in docs/BENCHMARKS.md)
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=$1; A=$2; B=$3; R=${4:-3}
mkdir -p $OUT/logs $OUT/conf $OUT/raw
. $HERE/lib.sh
start_stream_sim "$A" || exit 1
sluice_conf "$OUT/conf/sluice.yaml" own
for r in $(seq $R); do
 for s in a b; do
  bin=$A; [[ $s == b ]] && bin=$B
  wait_tw
  ( exec "$bin" serve -c "$OUT/conf/sluice.yaml" ) >"$OUT/logs/sluice-$r-$s.log" 2>&1 &
  sp=$!; PIDS+=($sp); wait_port $HTTPS || exit 1; sleep 1
  "$A" bench -target https://127.0.0.1:$HTTPS -protocol h2 -insecure -compare http://127.0.0.1:$SIM -compare-protocol h1 -pid $sp -model sim-stream -concurrency 64 -prompt-tokens 16 -output-tokens 200 -duration 8s -rounds 2 -ramp 1s -api-key sk-bench-suite -json $OUT/raw/$r-$s.json -progress never > $OUT/logs/bench-$r-$s.log 2>&1
  python3 -c "
import json,sys
t=json.load(open(sys.argv[1]))['targets']
print('round $r $s ttft p50 %.3f direct %.3f added %+.3f  cpu/1k %.2f' % (t[0]['ttft']['p50_ms'], t[1]['ttft']['p50_ms'], t[0]['ttft']['p50_ms']-t[1]['ttft']['p50_ms'], sum(c['ms_per_1k_tokens'] for c in t[0]['cpu'])))" $OUT/raw/$r-$s.json
  kill $sp; wait $sp 2>/dev/null
 done
done
