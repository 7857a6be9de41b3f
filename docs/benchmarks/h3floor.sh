#!/usr/bin/env bash
# quic-go's floor per token against Sluice (docs/BENCHMARKS.md, "h3cpu8").
# Target 1's workload (64 streams of 200 tokens at 10 ms, `sluice bench`
# with one connection per protocol) in alternating rounds against:
#   sluice-h1 / sluice-h3: a fresh Sluice per round (sluice.yaml, as
#     settings.sh) relaying one simulator; its CPU per 1,000 tokens;
#   floor-h1 / floor-h3: h3floor (docs/benchmarks/h3floor), the simulator's
#     handler served in one process over TCP HTTP/1.1 and over quic-go's own
#     http3.Server, no proxy; its CPU per 1,000 tokens.
# With COUNT=1 each bench also runs under `perf stat` on the measured
# process (system calls by kind, context switches) and reads the UDP
# counters of /proc/net/snmp before and after (loopback: InDatagrams are the
# packets of both directions, OutDatagrams the sends, a GSO send counting
# once); per-token figures go to OUTDIR/counts.txt. perf's tracepoints cost
# CPU: keep COUNT runs apart from the CPU figures. PPROF=SECONDS takes a CPU
# profile of the measured process during every bench, into
# OUTDIR/prof/ROUND-SIDE.pb.gz (Sluice serves with -pprof, h3floor with its
# own -pprof address).
#
#   ROUNDS=3 DUR=6s [ENV_SLUICE="A=1,B=2"] [COUNT=1] bash docs/benchmarks/h3floor.sh [OUTDIR]
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT=${1:-${TMPDIR:-/tmp}/sluice-h3floor-$(date -u +%Y%m%dT%H%M%SZ)}
ROUNDS=${ROUNDS:-3}
DUR=${DUR:-6s}
SIDES=${SIDES:-sluice-h1 sluice-h3 floor-h1 floor-h3}
COUNT=${COUNT:-}
PPROF=${PPROF:-}
pprof_flag=()
[[ -n $PPROF ]] && pprof_flag=(-pprof) && mkdir -p "$OUT/prof"
mkdir -p "$OUT/raw" "$OUT/logs" "$OUT/bin"
OUT=$(cd "$OUT" && pwd)

. "$HERE/lib.sh"

log "building sluice and h3floor into $OUT/bin"
(cd "$ROOT" && go build -o "$OUT/bin/sluice" ./cmd/sluice && go build -o "$OUT/bin/h3floor" ./docs/benchmarks/h3floor) || exit 1
SLUICE=$OUT/bin/sluice

start_stream_sim "$SLUICE" || exit 1
sluice_conf "$OUT/sluice.yaml" own
free_port FH1
free_port FH3
free_port FPP
"$OUT/bin/h3floor" -pprof "127.0.0.1:$FPP" -h1 "127.0.0.1:$FH1" -h3 "127.0.0.1:$FH3" -model sim-stream -pace 10ms -prefill-base -1ns \
	-prefill-per-token -1ns -max-batch 100000 -kv-cache-tokens 1000000000 -stamp-tokens >"$OUT/logs/floor.log" 2>&1 &
FP=$!
PIDS+=($FP)
wait_port "$FH1" || exit 1

cpu() { grep -o '"ms_per_1k_tokens": *[0-9.]*' "$1" | head -1 | sed 's/.*: *//' | xargs -r printf '%.1f\n'; }
tokens() { grep -o '"output_tokens": *[0-9]*' "$1" | head -1 | sed 's/.*: *//'; }
udp() { awk '/^Udp: [0-9]/ {print $2, $5}' /proc/net/snmp; } # InDatagrams OutDatagrams
EVENTS=raw_syscalls:sys_enter,syscalls:sys_enter_sendmsg,syscalls:sys_enter_sendmmsg,syscalls:sys_enter_recvmsg,syscalls:sys_enter_recvmmsg,syscalls:sys_enter_read,syscalls:sys_enter_write,syscalls:sys_enter_futex,syscalls:sys_enter_epoll_pwait,syscalls:sys_enter_nanosleep,context-switches

for r in $(seq "$ROUNDS"); do
	wait_tw # fewer than 2,000 TIME_WAIT sockets
	IFS=, read -ra envs <<<"${ENV_SLUICE:-}"
	env "${envs[@]}" "$SLUICE" serve "${pprof_flag[@]}" -c "$OUT/sluice.yaml" >"$OUT/logs/sluice-$r.log" 2>&1 &
	sp=$!
	PIDS+=($sp)
	wait_port "$HTTP" || exit 1
	sleep 1
	for side in $SIDES; do
		case $side in
		sluice-h1) pid=$sp target=(-target "http://127.0.0.1:$HTTP") ;;
		sluice-h3) pid=$sp target=(-target "https://127.0.0.1:$HTTPS" -protocol h3 -insecure) ;;
		floor-h1) pid=$FP target=(-target "http://127.0.0.1:$FH1") ;;
		floor-h3) pid=$FP target=(-target "https://127.0.0.1:$FH3" -protocol h3 -insecure) ;;
		esac
		if [[ -n $PPROF ]]; then # after the ramp, within the bench
			pp=$ADMIN
			[[ $side == floor-* ]] && pp=$FPP
			(sleep 2 && curl -s -o "$OUT/prof/$r-$side.pb.gz" \
				"http://127.0.0.1:$pp/debug/pprof/profile?seconds=$PPROF") &
		fi
		if [[ -n $COUNT ]]; then
			# after the 1 s ramp, for the bench's duration less 2 s
			d=${DUR%s}
			(sleep 1.5 && u0=$(udp) && perf stat -x, -e "$EVENTS" -p "$pid" -o "$OUT/raw/$r-$side.perf" sleep $((d - 2)) &&
				u1=$(udp) && echo "$u0 $u1" >"$OUT/raw/$r-$side.udp") &
			cp=$!
		fi
		"$SLUICE" bench "${target[@]}" -pid "$pid" -model sim-stream -concurrency 64 -prompt-tokens 16 \
			-output-tokens 200 -duration "$DUR" -ramp 1s -api-key sk-bench-suite -progress never \
			-json "$OUT/raw/$r-$side.json" >"$OUT/logs/bench-$r-$side.log" 2>&1
		[[ -n $COUNT ]] && wait "$cp"
		log "round $r, $side: $(cpu "$OUT/raw/$r-$side.json") ms per 1,000 tokens"
	done
	kill "$sp"
	wait "$sp" 2>/dev/null
done

median() { sort -n | awk '{v[NR]=$1} END {if (NR==0) print "-"; else if (NR%2) printf "%.1f\n", v[(NR+1)/2]; else printf "%.1f\n", (v[NR/2]+v[NR/2+1])/2}'; }
echo "side | median ms per 1,000 tokens | rounds" | tee "$OUT/summary.txt"
for side in $SIDES; do
	vals=$(for f in "$OUT"/raw/*-"$side".json; do cpu "$f"; done)
	echo "$side | $(median <<<"$vals") | $(paste -sd' ' <<<"$vals")"
done | tee -a "$OUT/summary.txt"
if [[ -n $COUNT ]]; then
	# per 1,000 tokens: the bench's token rate times perf's window
	for f in "$OUT"/raw/*.perf; do
		b=${f%.perf}
		python3 - "$f" "$b.json" "$b.udp" "${DUR%s}" <<'PY'
import json, sys
perf, bj, uf, dur = sys.argv[1:]
t = json.load(open(bj))['targets'][0]
rate = t['output_tokens_per_s']
secs = int(dur) - 2
toks = rate * secs
c = {}
for line in open(perf):
    p = line.strip().split(',')
    if len(p) > 3 and p[0].replace('.', '').isdigit():
        c[p[2].split(':')[-1].replace('sys_enter_', '')] = float(p[0])
u = open(uf).read().split()
ind, outd = int(u[2]) - int(u[0]), int(u[3]) - int(u[1])
print(sys.argv[1].split('/')[-1], 'per 1,000 tokens (%.0f tokens):' % toks,
      ' '.join('%s %.0f' % (k, v * 1000 / toks) for k, v in c.items()),
      '| udp in %.0f out %.0f' % (ind * 1000 / toks, outd * 1000 / toks))
PY
	done | tee "$OUT/counts.txt"
fi
