#!/usr/bin/env bash
# prof.sh BIN OUT [NAME=VALUE...]: target 3's load (16 clients, small non-streamed
# requests) against `BIN serve -pprof` for 12 s; a CPU profile of 8 s of it in OUT/cpu.pprof.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd) # docs/benchmarks
BINP=$1; OUT=$2; shift 2
mkdir -p $OUT/logs $OUT/conf
. $HERE/lib.sh
start_stream_sim "$BINP" || exit 1
sluice_conf "$OUT/conf/sluice.yaml" own
wait_tw
( [[ $# -gt 0 ]] && export "$@"; exec "$BINP" serve -pprof -c "$OUT/conf/sluice.yaml" ) >"$OUT/logs/sluice.log" 2>&1 &
sp=$!; PIDS+=($sp)
wait_port $HTTP || exit 1
sleep 1
"$BINP" bench -target "http://127.0.0.1:$HTTP" -pid $sp -model sim-stream -no-stream -concurrency 16 -prompt-tokens 16 -output-tokens 1 -duration 12s -rounds 1 -api-key sk-bench-suite -progress never -json "$OUT/bench.json" >"$OUT/bench.log" 2>&1 &
bp=$!; PIDS+=($bp)
sleep 2
curl -s -o $OUT/cpu.pprof "http://127.0.0.1:$ADMIN/debug/pprof/profile?seconds=8"
wait $bp
python3 -c 'import json,sys; t=json.load(open(sys.argv[1]))["targets"][0]; print("cpu us/req %.2f" % (sum(c["cpu_ms"] for c in t["cpu"]) * 1000 / t["counts"]["sent"]), "rps", t["requests_per_s"])' $OUT/bench.json
