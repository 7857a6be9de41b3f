#!/usr/bin/env bash
# startsys.sh BIN OUT: stream starts' system calls. One simulator and one
# `BIN serve` as run.sh configures them (lib.sh), `sluice bench` with CONC
# (1) streams of OTOK (5) tokens at 10 ms for 12 s, and 3 s in, `perf stat`
# of EVENTS (every system call's entry, and context switches) of the
# serving process for 6 s; prints each count per stream, the process's CPU
# per stream (bench -pid) and the client's TTFT P50. STRACE=1 takes
# `strace -f -tt -T` of 0.5 s instead (OUT/strace.txt). FLOOR=1 serves
# with docs/benchmarks/h1floor (FLOOR_BIN, built by
# `go build -o /tmp/h1floor ./docs/benchmarks/h1floor`) instead of Sluice.
# Tracing every system call slows each one: compare counts, and CPU or
# TTFT only between runs traced alike (docs/BENCHMARKS.md, "start19").
#
#   flock /work/bench.lock bash docs/benchmarks/startsys.sh /tmp/sluice /tmp/ss1
#
# Loopback only; every process it starts is stopped on exit (lib.sh).
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN=$1 OUT=$2
. "$HERE/lib.sh" # log, PIDS killed on exit, free_port, wait_port
one_sluice_setup "$BIN" || exit 1
if [[ ${FLOOR:-0} == 1 ]]; then
	bash "$HERE/h1floor/serve.sh" serve -c "$OUT/conf/sluice.yaml" >"$OUT/logs/sluice.log" 2>&1 &
else
	"$BIN" serve -c "$OUT/conf/sluice.yaml" >"$OUT/logs/sluice.log" 2>&1 &
fi
sp=$!
PIDS+=($sp)
wait_port "$HTTP" || exit 1
sleep 1
"$BIN" bench -target "http://127.0.0.1:$HTTP" -pid $sp -model sim-stream -api-key sk-bench-suite \
	-concurrency "${CONC:-1}" -output-tokens "${OTOK:-5}" -duration 12s -rounds 1 -progress never \
	-json "$OUT/bench.json" >"$OUT/bench.txt" 2>&1 &
bp=$!
PIDS+=($bp)
sleep 3
if [[ ${STRACE:-0} == 1 ]]; then
	timeout 0.5 strace -f -tt -T -p $sp -o "$OUT/strace.txt" 2>/dev/null
else
	ev=(-e 'syscalls:sys_enter_*' -e context-switches)
	[[ -n ${EVENTS:-} ]] && read -ra ev <<<"$EVENTS" # e.g. EVENTS="-e syscalls:sys_enter_nanosleep -e task-clock"
	perf stat "${ev[@]}" -p $sp -- sleep 6 2>"$OUT/perfstat.txt"
fi
wait $bp
python3 - "$OUT" <<'PY'
import json, re, sys
out = sys.argv[1]
t = json.load(open(out + "/bench.json"))["targets"][0]
sent = t["counts"]["sent"]
cpu = sum(c["cpu_ms"] for c in t.get("cpu", []))
print("streams %d, CPU per stream %.1f us, client TTFT P50 %.3f ms" % (sent, cpu * 1000 / sent, t["ttft"]["p50_ms"]))
try:
    lines = open(out + "/perfstat.txt").read().splitlines()
except OSError:
    lines = []
per = sent / 12.0 * 6  # streams in perf's 6 s
for l in lines:
    m = re.match(r"\s*([\d,]+)\s+(\S+)", l)
    if m and int(m.group(1).replace(",", "")) > 0:
        n = int(m.group(1).replace(",", ""))
        print("%-40s %8d  per stream %.2f" % (m.group(2), n, n / per))
PY
