#!/usr/bin/env bash
# pgo.sh OUT: the CPU profile cmd/sluice/default.pgo is made from (Go's
# profile-guided optimisation: `go build` of ./cmd/sluice reads it by
# itself). A `sluice serve` built without PGO (so the profile describes
# code as the compiler left it without one) serves the benchmark config
# (auth, limiter, routing, timing, access log on, as in run.sh) against one
# simulator, and a CPU profile of PROF seconds is taken under each of four
# loads in turn: target 3's small non-streamed requests (16 clients), and
# target 1's shape (64 streams of 200 tokens at 10 ms) over h1, h2 (TLS)
# and h3. The four are merged into OUT/default.pgo; copy it to
# cmd/sluice/default.pgo to use it. Loopback only; every process it starts
# is stopped on exit.
#
#   flock /work/bench.lock bash docs/benchmarks/pgo.sh /tmp/pgo && cp /tmp/pgo/default.pgo cmd/sluice/
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd) # docs/benchmarks
ROOT=$(cd "$HERE/../.." && pwd)
OUT=${1:?OUT}
PROF=${PROF:-8}
mkdir -p "$OUT/logs" "$OUT/conf"
OUT=$(cd "$OUT" && pwd)
. "$HERE/lib.sh" # log, PIDS killed on exit, free_port, wait_port, start_stream_sim, sluice_conf

BINP=$OUT/sluice-nopgo
(cd "$ROOT" && go build -pgo=off -o "$BINP" ./cmd/sluice) || exit 1
start_stream_sim "$BINP" || exit 1
sluice_conf "$OUT/conf/sluice.yaml" own
wait_tw
"$BINP" serve -pprof -c "$OUT/conf/sluice.yaml" >"$OUT/logs/sluice.log" 2>&1 &
sp=$!
PIDS+=($sp)
wait_port "$HTTP" || exit 1
wait_port "$HTTPS" || exit 1
sleep 1

KEY=sk-bench-suite
STREAM=(-model sim-stream -concurrency 64 -prompt-tokens 16 -output-tokens 200 -ramp 1s)
SMALL=(-model sim-stream -no-stream -concurrency 16 -prompt-tokens 16 -output-tokens 1)
profile() { # profile NAME BENCH-ARGS...: PROF seconds of CPU profile under that load
	local name=$1
	shift
	"$BINP" bench -api-key "$KEY" -duration "$((PROF + 4))s" -rounds 1 -progress never "$@" >"$OUT/logs/bench-$name.log" 2>&1 &
	local bp=$!
	PIDS+=($bp)
	sleep 2
	curl -s -o "$OUT/$name.pprof" "http://127.0.0.1:$ADMIN/debug/pprof/profile?seconds=$PROF"
	wait "$bp"
	log "profile $name: $(stat -c %s "$OUT/$name.pprof") bytes"
}
profile small -target "http://127.0.0.1:$HTTP" "${SMALL[@]}"
profile h1 -target "http://127.0.0.1:$HTTP" "${STREAM[@]}"
profile h2 -target "https://127.0.0.1:$HTTPS" -protocol h2 -insecure "${STREAM[@]}"
profile h3 -target "https://127.0.0.1:$HTTPS" -protocol h3 -insecure "${STREAM[@]}"
go tool pprof -proto "$OUT"/small.pprof "$OUT"/h1.pprof "$OUT"/h2.pprof "$OUT"/h3.pprof >"$OUT/default.pgo" 2>"$OUT/logs/merge.log" || exit 1
log "wrote $OUT/default.pgo ($(stat -c %s "$OUT/default.pgo") bytes)"
