#!/usr/bin/env bash
# firsttoken.sh BIN OUT: target 1's shape (64 h1 streams of 200 tokens at 10 ms,
# ramp 1 s) through `BIN serve` against the simulator directly (`-compare`,
# interleaved rounds), and the first token's figures from `sluice bench`'s
# report: Sluice's hold (the final timing's `hold`: the first token read →
# its first write to the client returned), the header's ttft (arrival → first
# token read), "network" (client TTFT − ttft), the first token's delay (the
# simulator's write stamp → the client has it) and the client's TTFT, each
# P50 (hold also P99), Sluice / direct where both exist.
#
#   flock /work/bench.lock bash docs/benchmarks/firsttoken.sh /tmp/sluice /tmp/ft1
#
# Env: CONC (64), OTOK (200), DUR (12s), SLUICE_ENV (Sluice's environment).
# Loopback only; every process it starts is stopped on exit (lib.sh).
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN=$1 OUT=$2
. "$HERE/lib.sh" # log, PIDS killed on exit, free_port, wait_port
one_sluice_setup "$BIN" || exit 1
env ${SLUICE_ENV:-} "$BIN" serve -c "$OUT/conf/sluice.yaml" >"$OUT/logs/sluice.log" 2>&1 &
PIDS+=($!)
wait_port "$HTTP" || exit 1
"$BIN" bench -target "http://127.0.0.1:$HTTP" -compare "http://127.0.0.1:$SIM" -api-key sk-bench-suite -model sim-stream \
	-concurrency "${CONC:-64}" -output-tokens "${OTOK:-200}" -prompt-tokens 16 -duration "${DUR:-12s}" -ramp 1s \
	-progress never -json "$OUT/bench.json" >"$OUT/bench.txt" 2>&1
python3 - "$OUT/bench.json" <<'PY'
import json, sys
t, d = json.load(open(sys.argv[1]))["targets"]
st = {s["name"]: s for s in t.get("stages", [])}
def p(name, q="p50"):
    return st.get(name, {}).get(q, float("nan"))
print("hold P50 %.3f P99 %.3f | ttft (server) P50 %.3f | network P50 %.3f | first-token delay P50 %.3f / %.3f | client TTFT P50 %.3f / %.3f ms" % (
    p("hold"), p("hold", "p99"), p("ttft"), p("network"),
    t["token_delay_first"]["p50_ms"], d["token_delay_first"]["p50_ms"], t["ttft"]["p50_ms"], d["ttft"]["p50_ms"]))
PY
