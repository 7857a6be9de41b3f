#!/usr/bin/env bash
# Sluice benchmark suite: see docs/BENCHMARKS.md.
#
#   bash docs/benchmarks/run.sh [OUTDIR]     # everything (~20 min on 2 cores)
#   QUICK=1 bash docs/benchmarks/run.sh      # smoke version (~4-5 min)
#   ONLY=1,3 bash docs/benchmarks/run.sh     # some targets (1 2 3 4 5 5b 6; 1r only when named)
#   REFS=0 ...                               # no nginx/Caddy references
#   SLUICE_ENV="GOMAXPROCS=1 GOGC=400" ...   # environment for the Sluice processes only
#   H1CLIENT=net_http ...                    # Sluice's pools on net/http: streams on goroutines, not the event loops
#
# Every figure is measured against a direct connection to the simulator in
# the same run (`sluice bench -compare`, interleaved rounds). Raw JSON, CSV
# and SVG go to OUTDIR/raw, logs to OUTDIR/logs, the exact commands to
# OUTDIR/commands.txt and the summary table to OUTDIR/results.md.
#
# Everything listens on free 127.0.0.1 ports. nginx and Caddy (Debian
# packages) run in the foreground with the configs in this directory, never
# as system services; when they cannot be installed they are skipped with a
# note. Every process this script starts is stopped on exit, by its pid.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT=${1:-${TMPDIR:-/tmp}/sluice-bench-$(date -u +%Y%m%dT%H%M%SZ)}
QUICK=${QUICK:-0}
ONLY=${ONLY:-1,2,3,4,5,5b,6}
REFS=${REFS:-1}
KEY=sk-bench-suite

mkdir -p "$OUT"/raw "$OUT"/logs "$OUT"/conf "$OUT"/bin
OUT=$(cd "$OUT" && pwd)
CMDS=$OUT/commands.txt
: >"$CMDS"

log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*" | tee -a "$OUT/logs/run.log" >&2; }
want() { [[ ",$ONLY," == *",$1,"* ]]; }

# ---- sizes: full and QUICK ------------------------------------------------
# (IDLE_N and SPARSE_N may be set in the environment.)
if [[ $QUICK == 1 ]]; then
	D_STREAM=4s ROUNDS=2 D_SMALL=3s IDLE_N=${IDLE_N:-1000} IDLE_TOKENS=6 IDLE_RAMP=3s
	SPARSE_N=${SPARSE_N:-200} SPARSE_TOKENS=3 D_SPARSE=6s SWEEP_RATES=8,24,48 D_SWEEP=3s D_REDIS=4s
else
	D_STREAM=16s ROUNDS=4 D_SMALL=10s IDLE_N=${IDLE_N:-10000} IDLE_TOKENS=20 IDLE_RAMP=20s
	SPARSE_N=${SPARSE_N:-2000} SPARSE_TOKENS=6 D_SPARSE=24s SWEEP_RATES=4,8,12,16,24,32,48 D_SWEEP=8s D_REDIS=12s
fi

# ---- processes --------------------------------------------------------------
PIDS=()
cleanup() {
	local p
	for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
		p=${PIDS[i]}
		kill "$p" 2>/dev/null
	done
	sleep 0.5
	for p in "${PIDS[@]}"; do
		kill -0 "$p" 2>/dev/null && kill -9 "$p" 2>/dev/null
	done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

stop_pid() { # stop_pid PID: stop one process started here and forget it
	local p=$1 i
	kill "$p" 2>/dev/null
	for i in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
	kill -9 "$p" 2>/dev/null
	forget "$p"
}

forget() { # forget PID: a process that has exited
	local i
	for i in "${!PIDS[@]}"; do [[ ${PIDS[i]} == "$1" ]] && unset 'PIDS[i]'; done
	PIDS=("${PIDS[@]}")
}

. "$HERE/lib.sh" # free_port, wait_port, wait_tw

rss_kib() { # rss_kib PID...: summed VmRSS in KiB
	local s=0 p v
	for p in "$@"; do
		v=$(awk '/^VmRSS:/ {print $2}' "/proc/$p/status" 2>/dev/null)
		s=$((s + ${v:-0}))
	done
	echo "$s"
}

established() { # established PORT: client connections held on a listener
	ss -Htn state established "( sport = :$1 )" 2>/dev/null | wc -l
}

# ---- build ------------------------------------------------------------------
log "building sluice and benchreport into $OUT/bin"
(cd "$ROOT" && go build -o "$OUT/bin/sluice" ./cmd/sluice && go build -o "$OUT/bin/benchreport" ./internal/benchsuite/cmd/benchreport) || {
	log "build failed"
	exit 1
}
SLUICE=$OUT/bin/sluice

# ---- file descriptors ---------------------------------------------------------
ulimit -n "$(ulimit -Hn)" 2>/dev/null
NOFILE=$(ulimit -n)
[[ $NOFILE == unlimited ]] && NOFILE=1048576
log "open-file limit: $NOFILE"
# Sluice with an HTTP/1.1 upstream holds two sockets per stream; when the
# limit cannot hold that for IDLE_N streams the idle pool uses h2c upstream
# (a few multiplexed connections), and the references run with as many
# streams as the limit allows.
IDLE_H2C=false
if ((NOFILE < 2 * IDLE_N + 512)); then IDLE_H2C=true; fi
REF_IDLE_N=$(((NOFILE - 512) / 2))
((REF_IDLE_N > IDLE_N)) && REF_IDLE_N=$IDLE_N

# ---- references: nginx and Caddy ---------------------------------------------
HAVE_NGINX=0 HAVE_CADDY=0
if [[ $REFS == 1 ]]; then
	missing=()
	command -v nginx >/dev/null || missing+=(nginx)
	command -v caddy >/dev/null || missing+=(caddy)
	if ((${#missing[@]})); then
		log "installing ${missing[*]} (apt-get)"
		SUDO=
		[[ $(id -u) != 0 ]] && SUDO="sudo -n"
		if $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}" >"$OUT/logs/apt.log" 2>&1; then
			# Debian may start the packaged services; the suite never uses them.
			for s in "${missing[@]}"; do
				if command -v systemctl >/dev/null && systemctl is-active --quiet "$s" 2>/dev/null; then
					$SUDO systemctl stop "$s" && $SUDO systemctl disable "$s" 2>/dev/null
					log "stopped the $s service the package started"
				elif command -v service >/dev/null && service "$s" status >/dev/null 2>&1; then
					$SUDO service "$s" stop && log "stopped the $s service the package started"
				fi
			done
		else
			log "could not install ${missing[*]} (see logs/apt.log); skipping them"
		fi
	fi
	command -v nginx >/dev/null && HAVE_NGINX=1
	command -v caddy >/dev/null && HAVE_CADDY=1
fi

# ---- meta -------------------------------------------------------------------------
{
	echo "{"
	echo "  \"date\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\","
	echo "  \"nproc\": $(nproc),"
	echo "  \"cpu\": \"$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)\","
	echo "  \"kernel\": \"$(uname -r)\","
	echo "  \"go\": \"$(go env GOVERSION)\","
	echo "  \"commit\": \"$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null)\","
	echo "  \"quick\": $([[ $QUICK == 1 ]] && echo true || echo false),"
	echo "  \"only\": \"$ONLY\","
	echo "  \"nginx\": \"$( ((HAVE_NGINX)) && nginx -v 2>&1 | sed 's/.*: //')\","
	echo "  \"caddy\": \"$( ((HAVE_CADDY)) && caddy version 2>/dev/null | cut -d' ' -f1)\","
	echo "  \"nofile\": $NOFILE,"
	echo "  \"idle_h2c\": $IDLE_H2C"
	echo "}"
} >"$OUT/raw/meta.json"

# ---- simulators -----------------------------------------------------------------
# stream: each request's tokens on their own 10 ms timer (no batch steps,
# no prefill), stamped with their emit time for the per-token delay.
start_sim() { # start_sim NAME ARGS...: sets SIM_PORT
	local name=$1
	shift
	free_port SIM_PORT
	echo "$SLUICE sim -addr 127.0.0.1:$SIM_PORT $*" >>"$CMDS"
	"$SLUICE" sim -addr "127.0.0.1:$SIM_PORT" "$@" >"$OUT/logs/sim-$name.log" 2>&1 &
	PIDS+=($!)
	wait_port "$SIM_PORT"
}
NOPREFILL=(-prefill-base -1ns -prefill-per-token -1ns -max-batch 100000 -kv-cache-tokens 1000000000 -stamp-tokens)
start_sim stream -model sim-stream -pace 10ms "${NOPREFILL[@]}"
SIM_STREAM=$SIM_PORT
start_sim sparse -model sim-sparse -pace 1s "${NOPREFILL[@]}"
SIM_SPARSE=$SIM_PORT
start_sim idle -model sim-idle -pace 2s "${NOPREFILL[@]}"
SIM_IDLE=$SIM_PORT

# ---- Sluice -----------------------------------------------------------------------
start_sluice() { # start_sluice NAME TEMPLATE [EXTRA-YAML-FILE]: sets SL_HTTP SL_HTTPS SL_PID
	local name=$1 tmpl=$2 extra=${3:-}
	free_port SL_HTTP
	free_port SL_HTTPS
	free_port SL_ADMIN
	sed -e "s/@HTTP@/$SL_HTTP/g; s/@HTTPS@/$SL_HTTPS/g; s/@ADMIN@/$SL_ADMIN/g" \
		-e "s/@SIM_STREAM@/$SIM_STREAM/g; s/@SIM_SPARSE@/$SIM_SPARSE/g; s/@SIM_IDLE@/$SIM_IDLE/g" \
		-e "s/@SIM_A@/${SIM_A:-0}/g; s/@SIM_B@/${SIM_B:-0}/g; s/@IDLE_H2C@/$IDLE_H2C/g" \
		-e "s/@H1CLIENT@/${H1CLIENT:-own}/g" \
		-e "/@QUEUE@/{r ${QUEUE_FILE:-/dev/null}" -e 'd}' \
		"$tmpl" >"$OUT/conf/$name.yaml"
	[[ -n $extra ]] && cat "$extra" >>"$OUT/conf/$name.yaml"
	echo "${SLUICE_ENV:+env $SLUICE_ENV }$SLUICE serve -c $OUT/conf/$name.yaml" >>"$CMDS"
	# (not `env $SLUICE_ENV $SLUICE`: env takes any argument with a '=',
	# such as an OUTDIR path, for an assignment)
	(
		[[ -n ${SLUICE_ENV:-} ]] && export ${SLUICE_ENV?}
		exec "$SLUICE" serve -c "$OUT/conf/$name.yaml"
	) >"$OUT/logs/sluice-$name.log" 2>&1 &
	SL_PID=$!
	PIDS+=($SL_PID)
	wait_port "$SL_HTTP" || return 1
	if grep -q @HTTPS@ "$tmpl"; then wait_port "$SL_HTTPS"; fi
}
start_sluice main "$HERE/sluice.yaml" || {
	log "sluice did not start (logs/sluice-main.log)"
	exit 1
}
MAIN_HTTP=$SL_HTTP MAIN_HTTPS=$SL_HTTPS MAIN_PID=$SL_PID MAIN_ADMIN=$SL_ADMIN

# ---- references ------------------------------------------------------------------------
NGINX_PIDS= CADDY_PID= NGINX_PORTS=() CADDY_PORTS=()
ref_conf() { # ref_conf TEMPLATE OUT PREFIX STREAM SPARSE IDLE
	sed -e "s|@PREFIX@|$3|g; s/@NOFILE@/$NOFILE/g" \
		-e "s/@SIM_STREAM@/$SIM_STREAM/g; s/@SIM_SPARSE@/$SIM_SPARSE/g; s/@SIM_IDLE@/$SIM_IDLE/g" \
		-e "s/@PORT_STREAM@/$4/g; s/@PORT_SPARSE@/$5/g; s/@PORT_IDLE@/$6/g" "$1" >"$2"
}
if ((HAVE_NGINX)); then
	free_port a; free_port b; free_port c
	NGINX_PORTS=("$a" "$b" "$c")
	prefix=$OUT/conf/nginx
	mkdir -p "$prefix"
	ref_conf "$HERE/nginx.conf" "$prefix/nginx.conf" "$prefix" "${NGINX_PORTS[@]}"
	echo "nginx -p $prefix -c $prefix/nginx.conf -g 'daemon off;'" >>"$CMDS"
	nginx -p "$prefix" -c "$prefix/nginx.conf" -g 'daemon off;' >"$OUT/logs/nginx.log" 2>&1 &
	NGINX_MASTER=$!
	PIDS+=($NGINX_MASTER)
	if wait_port "${NGINX_PORTS[0]}"; then
		sleep 0.5
		NGINX_PIDS=$(echo $NGINX_MASTER $(pgrep -P "$NGINX_MASTER") | tr ' ' ',')
		log "nginx pids $NGINX_PIDS"
	else
		log "nginx did not start (logs/nginx.log); skipping it"
		HAVE_NGINX=0
	fi
fi
if ((HAVE_CADDY)); then
	free_port a; free_port b; free_port c
	CADDY_PORTS=("$a" "$b" "$c")
	mkdir -p "$OUT/conf/caddy"
	ref_conf "$HERE/Caddyfile" "$OUT/conf/caddy/Caddyfile" "$OUT/conf/caddy" "${CADDY_PORTS[@]}"
	echo "caddy run --adapter caddyfile --config $OUT/conf/caddy/Caddyfile" >>"$CMDS"
	XDG_DATA_HOME=$OUT/conf/caddy XDG_CONFIG_HOME=$OUT/conf/caddy \
		caddy run --adapter caddyfile --config "$OUT/conf/caddy/Caddyfile" >"$OUT/logs/caddy.log" 2>&1 &
	CADDY_PID=$!
	PIDS+=($CADDY_PID)
	if ! wait_port "${CADDY_PORTS[0]}"; then
		log "caddy did not start (logs/caddy.log); skipping it"
		HAVE_CADDY=0
	fi
fi

# ---- the load generator ------------------------------------------------------------------
bench() { # bench NAME ARGS...: raw/NAME.json, logs/bench-NAME.txt
	local name=$1
	shift
	echo "$SLUICE bench $* -json $OUT/raw/$name.json -progress never" >>"$CMDS"
	log "bench $name"
	"$SLUICE" bench "$@" -json "$OUT/raw/$name.json" -progress never >"$OUT/logs/bench-$name.txt" 2>&1 &
	local bpid=$! rc
	PIDS+=($bpid)
	wait "$bpid"
	rc=$?
	forget "$bpid"
	((rc == 0)) || log "bench $name exited $rc (see logs/bench-$name.txt)"
}

# proxies NAME: "label url pids" lines for Sluice and each reference on the
# simulator NAME (stream, sparse or idle).
proxies() {
	local i
	case $1 in stream) i=0 ;; sparse) i=1 ;; idle) i=2 ;; esac
	echo "sluice http://127.0.0.1:$MAIN_HTTP $MAIN_PID"
	((HAVE_NGINX)) && echo "nginx http://127.0.0.1:${NGINX_PORTS[i]} $NGINX_PIDS"
	((HAVE_CADDY)) && echo "caddy http://127.0.0.1:${CADDY_PORTS[i]} $CADDY_PID"
	return 0
}

# ---- target 1: 64 streams, 200 tokens, 10 ms per token, h1 -------------------------------------
STREAM=(-model sim-stream -concurrency 64 -prompt-tokens 16 -output-tokens 200 -duration "$D_STREAM" -rounds "$ROUNDS" -ramp 1s -api-key "$KEY")
if want 1; then
	while read -r who url pids; do
		bench "t1-$who" -target "$url" -compare "http://127.0.0.1:$SIM_STREAM" -pid "$pids" "${STREAM[@]}"
	done < <(proxies stream)
fi

# ---- target 1r: what a reconnect costs in target 1's shape (only when named in ONLY) --------------
# The simulator on a new connection per stream against the same simulator
# kept alive: the TTFT a client pays when a proxy closes its connection
# after a stream (Sluice's event loop answers Connection: close).
if want 1r; then
	bench t1r-direct -target "http://127.0.0.1:$SIM_STREAM" -no-keepalive -compare "http://127.0.0.1:$SIM_STREAM" "${STREAM[@]}"
fi

# ---- target 2: the same over h2 (TLS) and h3 ------------------------------------------------
if want 2; then
	for proto in h2 h3; do
		bench "t2-$proto-sluice" -target "https://127.0.0.1:$MAIN_HTTPS" -protocol $proto -insecure \
			-compare "http://127.0.0.1:$SIM_STREAM" -compare-protocol h1 -pid "$MAIN_PID" "${STREAM[@]}"
	done
fi

# ---- target 3: small non-streamed requests -----------------------------------------------------
# No warm-up and no ramp, so the CPU time covers exactly the counted requests.
if want 3; then
	while read -r who url pids; do
		bench "t3-$who" -target "$url" -compare "http://127.0.0.1:$SIM_STREAM" -pid "$pids" \
			-model sim-stream -no-stream -concurrency 16 -prompt-tokens 16 -output-tokens 1 \
			-duration "$D_SMALL" -rounds "$ROUNDS" -api-key "$KEY"
	done < <(proxies stream)
fi

# ---- target 5: admission with the Redis limiter vs the local limiter ---------------------------
if want 5; then
	if command -v redis-server >/dev/null; then
		free_port RPORT
		echo "redis-server --bind 127.0.0.1 --port $RPORT --save '' --appendonly no" >>"$CMDS"
		redis-server --bind 127.0.0.1 --port "$RPORT" --save '' --appendonly no >"$OUT/logs/redis.log" 2>&1 &
		PIDS+=($!)
		wait_port "$RPORT"
		printf '\nredis:\n  addrs: [127.0.0.1:%s]\n' "$RPORT" >"$OUT/conf/redis-part.yaml"
		start_sluice redis "$HERE/sluice.yaml" "$OUT/conf/redis-part.yaml" ||
			log "the Redis-limited sluice did not start (logs/sluice-redis.log)"
		REDIS_HTTP=$SL_HTTP REDIS_PID=$SL_PID
		# target: the Redis-limited node; baseline: the local-limited node.
		bench t5-redis -target "http://127.0.0.1:$REDIS_HTTP" -compare "http://127.0.0.1:$MAIN_HTTP" \
			-pid "$REDIS_PID" -model sim-stream -concurrency 16 -prompt-tokens 16 -output-tokens 20 \
			-duration "$D_REDIS" -rounds "$ROUNDS" -ramp 1s -api-key "$KEY"
		stop_pid "$REDIS_PID"
	else
		log "target 5 skipped: no redis-server on PATH"
	fi
fi

# ---- target 5b: sparse streams, 1 token per second ------------------------------------------------
if want 5b; then
	while read -r who url pids; do
		bench "t5b-$who" -target "$url" -compare "http://127.0.0.1:$SIM_SPARSE" -pid "$pids" \
			-model sim-sparse -concurrency "$SPARSE_N" -prompt-tokens 16 -output-tokens "$SPARSE_TOKENS" \
			-duration "$D_SPARSE" -rounds 2 -ramp 2s -api-key "$KEY"
	done < <(proxies sparse)
fi

# ---- target 4: idle streams held open ---------------------------------------------------------
# N slow streams (one token every 2 s, ramped up over IDLE_RAMP) through one
# proxy; RSS of the proxy (all its processes, /proc/PID/status VmRSS) before
# the load and at the highest count of established client connections.
# go_metrics WHO WHEN: Sluice's Go runtime gauges (goroutines, heap, stacks)
# next to an RSS sample, for the memory split in BENCHMARKS.md.
go_metrics() {
	[[ $1 == sluice ]] || return 0
	curl -s --max-time 2 "http://127.0.0.1:$MAIN_ADMIN/metrics" |
		grep -E '^(go_goroutines|go_memstats_(heap_inuse|heap_idle|heap_released|stack_inuse|sys)_bytes|process_resident_memory_bytes) ' \
			>"$OUT/raw/t4-sluice-go-$2.txt"
}

idle_run() { # idle_run LABEL URL PORT N PIDS
	local who=$1 url=$2 port=$3 n=$4 pids=${5//,/ } before hold held peak=0 rss i
	before=$(rss_kib $pids)
	go_metrics "$who" before
	echo "$SLUICE bench -target $url -model sim-idle -concurrency $n -requests $n -ramp $IDLE_RAMP -prompt-tokens 16 -output-tokens $IDLE_TOKENS -timeout 5m -api-key $KEY -json $OUT/raw/t4-$who-bench.json -progress never" >>"$CMDS"
	log "bench t4-$who ($n streams)"
	"$SLUICE" bench -target "$url" -model sim-idle -concurrency "$n" -requests "$n" -ramp "$IDLE_RAMP" \
		-prompt-tokens 16 -output-tokens "$IDLE_TOKENS" -timeout 5m -api-key "$KEY" \
		-json "$OUT/raw/t4-$who-bench.json" -progress never >"$OUT/logs/bench-t4-$who.txt" 2>&1 &
	local bpid=$!
	PIDS+=($bpid)
	# Until every stream is connected (or the streams start ending), keep
	# the RSS seen at the highest connection count.
	hold=$before
	for i in $(seq $((${IDLE_RAMP%s} * 5 + IDLE_TOKENS * 5))); do
		sleep 0.2
		held=$(established "$port")
		if ((held > peak)); then
			peak=$held
			hold=$(rss_kib $pids)
			go_metrics "$who" hold
		fi
		((held >= n)) && break
	done
	sleep 2
	held=$(established "$port")
	rss=$(rss_kib $pids)
	if ((held >= peak)); then
		peak=$held hold=$rss
		go_metrics "$who" hold
	fi
	wait "$bpid"
	forget "$bpid"
	cat >"$OUT/raw/t4-$who.json" <<EOF
{"proxy": "$who", "streams": $n, "held": $peak, "rss_before_kib": $before, "rss_hold_kib": $hold, "upstream_h2c": $([[ $who == sluice ]] && echo "$IDLE_H2C" || echo false)}
EOF
	log "t4-$who: $peak connections held for $n streams, RSS $before -> $hold KiB"
}
if want 4; then
	while read -r who url pids; do
		n=$IDLE_N
		[[ $who != sluice ]] && n=$REF_IDLE_N
		idle_run "$who" "$url" "${url##*:}" "$n" "$pids"
	done < <(proxies idle)
fi

# ---- target 6: the curve, without and with the edge queue ---------------------------------------
if want 6; then
	stop_pid "$MAIN_PID" # one Sluice at a time on the two cores
	start_sim sweep-a -max-batch 8 -step-base 5ms -step-per-seq 1ms -prefill-base 10ms -prefill-per-token 100us -seed 1
	SIM_A=$SIM_PORT
	start_sim sweep-b -max-batch 8 -step-base 5ms -step-per-seq 1ms -prefill-base 10ms -prefill-per-token 100us -seed 2
	SIM_B=$SIM_PORT
	printf '    queue:\n      target_utilization: 1.0\n      max_queue_wait: 2s\n' >"$OUT/conf/queue-part.yaml"
	for v in plain queue; do
		QUEUE_FILE=/dev/null
		[[ $v == queue ]] && QUEUE_FILE=$OUT/conf/queue-part.yaml
		if ! start_sluice "sweep-$v" "$HERE/sluice-sweep.yaml"; then
			log "sluice sweep-$v did not start (logs/sluice-sweep-$v.log)"
			continue
		fi
		name=t6-sweep
		[[ $v == queue ]] && name=t6-sweep-queue
		bench "$name" -target "http://127.0.0.1:$SL_HTTP" -sweep "rate=$SWEEP_RATES" -duration "$D_SWEEP" \
			-prompt-tokens 64 -output-tokens 32 -drain 30s -timeout 60s -pid "$SL_PID" -api-key "$KEY" \
			-svg "$OUT/raw/$name.svg" -csv "$OUT/raw/$name.csv"
		stop_pid "$SL_PID"
	done
fi

# ---- results --------------------------------------------------------------------------------
echo "$OUT/bin/benchreport $OUT" >>"$CMDS"
"$OUT/bin/benchreport" "$OUT" && log "wrote $OUT/results.md"
