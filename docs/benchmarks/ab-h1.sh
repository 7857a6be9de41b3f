#!/usr/bin/env bash
# A/B of Sluice binaries on target 1's workload (64 h1 streams of 200 tokens
# at 10 ms per token), with nginx in every round: CPU per 1,000 tokens per
# binary, and its ratio to nginx's of the same round. SHAPE=small runs
# target 3's instead (16 clients of small non-streamed requests, no warm-up),
# each side interleaved with the direct simulator (`-compare`, 2 rounds of
# DUR each): CPU per request (µs), requests/s ÷ direct, and the side's peak
# RSS (VmHWM, all its pids) in the log. In each round every
# binary gets a fresh `sluice serve` (and nginx a fresh master), the order
# rotating round by round (A B N, B N A, N A B, ...), against one simulator
# started once.
#
#   BINS="base=/tmp/base/sluice new=/tmp/new/sluice" ROUNDS=3 DUR=14s \
#     bash docs/benchmarks/ab-h1.sh OUTDIR
#   BINS="g100=/tmp/s g400=/tmp/s" ENV_g400="GOGC=400" SHAPE=small DUR=5s ...
#
# CONC and OTOK set target 1's concurrency and output tokens (64, 200).
# ENV_<name> (names are shell identifiers then) is the environment of that
# side's `sluice serve`, e.g. "GOGC=400 GOMEMLIMIT=1GiB".
#
# Prints per round and side the CPU per 1,000 tokens and the added
# per-token delay P50/P99 (client-measured: token delay minus the
# simulator's emit stamp), then the medians and the median of the per-round
# ratios to nginx. Loopback only; every process it starts is stopped by
# its pid on exit. (PERF=1: `perf stat` of syscalls per token for the
# Sluice sides.)
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=${1:?OUTDIR}
ROUNDS=${ROUNDS:-3}
DUR=${DUR:-14s}
BINS=${BINS:?BINS=\"name=path ...\"}
NGINX=${NGINX:-1}
SHAPE=${SHAPE:-h1}
mkdir -p "$OUT/raw" "$OUT/logs" "$OUT/conf"
OUT=$(cd "$OUT" && pwd)
ulimit -n "$(ulimit -Hn)" 2>/dev/null
NOFILE=$(ulimit -n)

. "$HERE/lib.sh" # log, PIDS killed on exit, free_port, wait_port, wait_tw

names=()
declare -A BIN
for b in $BINS; do
	names+=("${b%%=*}")
	BIN[${b%%=*}]=${b#*=}
done
first=${BIN[${names[0]}]}
((NGINX)) && names+=(nginx)
# NGINXBUF=1 adds a side "nginxbuf": nginx.conf with its access log
# buffered (buffer=64k flush=1s, as Sluice's node.access_log {buffer: 64KiB,
# flush: 1s}) on ports of its own.
((${NGINXBUF:-0})) && names+=(nginxbuf)

start_stream_sim "$first" || exit 1
sluice_conf "$OUT/conf/sluice.yaml" own
free_port NG1
free_port NG2
free_port NG3
mkdir -p "$OUT/conf/nginx"
sed -e "s|@PREFIX@|$OUT/conf/nginx|g; s/@NOFILE@/$NOFILE/g; s/@SIM_STREAM@/$SIM/g; s/@SIM_SPARSE@/$SIM/g" \
	-e "s/@SIM_IDLE@/$SIM/g; s/@PORT_STREAM@/$NG1/g; s/@PORT_SPARSE@/$NG2/g; s/@PORT_IDLE@/$NG3/g" \
	"$HERE/nginx.conf" >"$OUT/conf/nginx/nginx.conf"
free_port NB1
free_port NB2
free_port NB3
mkdir -p "$OUT/conf/nginxbuf"
sed -e "s|@PREFIX@|$OUT/conf/nginxbuf|g; s/@NOFILE@/$NOFILE/g; s/@SIM_STREAM@/$SIM/g; s/@SIM_SPARSE@/$SIM/g" \
	-e "s/@SIM_IDLE@/$SIM/g; s/@PORT_STREAM@/$NB1/g; s/@PORT_SPARSE@/$NB2/g; s/@PORT_IDLE@/$NB3/g" \
	-e 's|access_log \(.*\);|access_log \1 combined buffer=64k flush=1s;|' \
	"$HERE/nginx.conf" >"$OUT/conf/nginxbuf/nginx.conf"

# cpu JSON: the proxy's CPU per 1,000 tokens (all its pids); delay JSON:
# the client-measured token delay P50 and P99 (ms).
cpu() { python3 -c 'import json,sys; t=json.load(open(sys.argv[1]))["targets"][0]; print("%.2f" % sum(c["ms_per_1k_tokens"] for c in t["cpu"]))' "$1" 2>/dev/null; }
delay() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))["targets"][0]["token_delay"]; print("%.3f %.3f" % (d["p50_ms"], d["p99_ms"]))' "$1" 2>/dev/null; }
export UNIT="ms per 1,000 tokens"
if [[ $SHAPE == small ]]; then
	# cpu: µs per request sent (target 3's figure); delay: requests/s ÷ direct
	cpu() { python3 -c 'import json,sys; t=json.load(open(sys.argv[1]))["targets"][0]; print("%.2f" % (sum(c["cpu_ms"] for c in t["cpu"]) * 1000 / t["counts"]["sent"]))' "$1" 2>/dev/null; }
	delay() { python3 -c 'import json,sys; t=json.load(open(sys.argv[1]))["targets"]; print("%.3f" % (t[0]["requests_per_s"] / t[1]["requests_per_s"]))' "$1" 2>/dev/null; }
	export UNIT="µs per request"
fi

# USRSYS=1: the side's user and system CPU (utime and stime of all its
# pids, /proc/PID/stat, clock ticks, over the bench run): the side's CPU
# figure split by their shares, in the log.
ticks() { for p in ${1//,/ }; do awk '{print $14, $15}' "/proc/$p/stat" 2>/dev/null; done | awk '{u+=$1; s+=$2} END {print u+0, s+0}'; }
usrsys() { # usrsys T0 T1 JSON: the side's figure split by the ticks' user and system shares
	awk -v a="$1" -v b="$2" -v c="$(cpu "$3")" 'BEGIN {split(a, x, " "); split(b, y, " "); u = y[1] - x[1]; s = y[2] - x[2]
		if (u + s > 0) printf "%.2f user + %.2f system %s (%d + %d ticks)", c * u / (u + s), c * s / (u + s), ENVIRON["UNIT"], u, s}'
}

n=${#names[@]}
for r in $(seq "$ROUNDS"); do
	for i in $(seq 0 $((n - 1))); do
		name=${names[$(((i + r - 1) % n))]}
		wait_tw
		if [[ $name == nginx || $name == nginxbuf ]]; then
			nginx -p "$OUT/conf/$name" -c "$OUT/conf/$name/nginx.conf" -g 'daemon off;' >"$OUT/logs/$name-$r.log" 2>&1 &
			sp=$!
			PIDS+=($sp)
			port=$NG1
			[[ $name == nginxbuf ]] && port=$NB1
			wait_port "$port" || exit 1
			sleep 0.5
			pids=$(echo $sp $(pgrep -P $sp) | tr ' ' ,)
		else
			envname=ENV_$name
			(
				[[ -n ${!envname:-} ]] && export ${!envname}
				exec "${BIN[$name]}" serve -c "$OUT/conf/sluice.yaml"
			) >"$OUT/logs/sluice-$r-$name.log" 2>&1 &
			sp=$!
			PIDS+=($sp)
			port=$HTTP
			wait_port "$port" || exit 1
			sleep 1
			pids=$sp
			# CHILD_PIDS=1: a side's binary may be a wrapper that starts
			# several processes (smallreq5/workers.sh); count them all.
			((${CHILD_PIDS:-0})) && pids=$(echo $sp $(pgrep -P $sp) | tr ' ' ,)
		fi
		if [[ ${PERF:-0} == 1 ]]; then
			(sleep 5; perf stat -e 'raw_syscalls:sys_enter,syscalls:sys_enter_read,syscalls:sys_enter_write,syscalls:sys_enter_epoll_pwait,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_futex,syscalls:sys_enter_nanosleep,context-switches' -p "$pids" -o "$OUT/raw/perf-$r-$name.txt" -- sleep 5) &
		fi
		((${USRSYS:-0})) && t0=$(ticks "$pids")
		if [[ $SHAPE == small ]]; then
			"${BIN[${names[0]}]}" bench -target "http://127.0.0.1:$port" -pid "$pids" -compare "http://127.0.0.1:$SIM" \
				-model sim-stream -no-stream -concurrency 16 -prompt-tokens 16 -output-tokens 1 -duration "$DUR" -rounds 2 \
				-api-key sk-bench-suite -progress never -json "$OUT/raw/$r-$name.json" >"$OUT/logs/bench-$r-$name.log" 2>&1
			hwm=0
			for p in ${pids//,/ }; do hwm=$((hwm + $(awk '/^VmHWM:/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0))); done
			log "round $r, $name: $(cpu "$OUT/raw/$r-$name.json") µs per request; requests/s ÷ direct $(delay "$OUT/raw/$r-$name.json"); peak RSS $hwm KiB"
		else
			"${BIN[${names[0]}]}" bench -target "http://127.0.0.1:$port" -pid "$pids" -model sim-stream -concurrency "${CONC:-64}" \
				-prompt-tokens 16 -output-tokens "${OTOK:-200}" -duration "$DUR" -ramp 1s -api-key sk-bench-suite -progress never \
				-json "$OUT/raw/$r-$name.json" >"$OUT/logs/bench-$r-$name.log" 2>&1
			log "round $r, $name: $(cpu "$OUT/raw/$r-$name.json") ms per 1,000 tokens; token delay P50/P99 $(delay "$OUT/raw/$r-$name.json") ms"
		fi
		if ((${USRSYS:-0})); then
			t1=$(ticks "$pids")
			log "round $r, $name: user/system CPU $(usrsys "$t0" "$t1" "$OUT/raw/$r-$name.json")"
		fi
		kill "$sp"
		wait "$sp" 2>/dev/null
	done
done

median() { sort -n | awk '{v[NR]=$1} END {if (NR==0) print "-"; else if (NR%2) printf "%.2f\n", v[(NR+1)/2]; else printf "%.2f\n", (v[NR/2]+v[NR/2+1])/2}'; }
{
	echo "side | rounds ($UNIT) | median | median of round ratios to nginx"
	for name in "${names[@]}"; do
		vals=$(for r in $(seq "$ROUNDS"); do cpu "$OUT/raw/$r-$name.json"; echo; done | grep .)
		ratios=-
		if ((NGINX)); then
			ratios=$(for r in $(seq "$ROUNDS"); do
				awk -v a="$(cpu "$OUT/raw/$r-$name.json")" -v b="$(cpu "$OUT/raw/$r-nginx.json")" 'BEGIN {if (b>0) printf "%.3f\n", a/b}'
			done | median)
		fi
		echo "$name | $(paste -sd/ <<<"$vals") | $(median <<<"$vals") | $ratios"
	done
	if [[ $SHAPE == small ]]; then
		echo "side | rounds (requests/s ÷ direct) | median"
		for name in "${names[@]}"; do
			vals=$(for r in $(seq "$ROUNDS"); do delay "$OUT/raw/$r-$name.json"; echo; done | grep .)
			echo "$name | $(paste -sd/ <<<"$vals") | $(median <<<"$vals")"
		done
	fi
} | tee "$OUT/summary.txt"
if [[ $SHAPE == h1 ]]; then
	# The latency figures of each round (OUT/raw/*.json): token delay P99 and
	# TTFT P50 (ms), and each side's TTFT P50 minus nginx's of the same round.
	python3 - "$OUT" "$ROUNDS" "${names[@]}" <<'PY' | tee -a "$OUT/summary.txt"
import json, statistics, sys
out, rounds, names = sys.argv[1], range(1, int(sys.argv[2]) + 1), sys.argv[3:]
def get(r, n):
    try:
        t = json.load(open(f"{out}/raw/{r}-{n}.json"))["targets"][0]
        return t["token_delay"]["p99_ms"], t["ttft"]["p50_ms"]
    except (OSError, KeyError, ValueError, IndexError):
        return None
print("side | token delay P99 per round (ms) | median | TTFT P50 per round (ms) | median | median of TTFT P50 - nginx's")
for n in names:
    v = {r: get(r, n) for r in rounds}
    v = {r: x for r, x in v.items() if x}
    if not v:
        continue
    d = [x[1] - get(r, "nginx")[1] for r, x in v.items() if "nginx" in names and get(r, "nginx")]
    print(f"{n} | {'/'.join('%.2f' % x[0] for x in v.values())} | {statistics.median(x[0] for x in v.values()):.2f} | "
          f"{'/'.join('%.3f' % x[1] for x in v.values())} | {statistics.median(x[1] for x in v.values()):.3f} | "
          + ("%+.3f" % statistics.median(d) if d else "-"))
PY
fi
if [[ ${PERF:-0} == 1 ]]; then
	echo "side | per round, 5 s: syscalls, read, write, epoll_(p)wait, futex, nanosleep, context switches"
	for name in "${names[@]}"; do
		for r in $(seq "$ROUNDS"); do
			echo "$name | $r | $(awk '/raw_syscalls|sys_enter|context-switches/ {gsub(",", "", $1); printf "%s ", $1}' "$OUT/raw/perf-$r-$name.txt")"
		done
	done | tee -a "$OUT/summary.txt"
fi
