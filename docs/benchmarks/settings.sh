#!/usr/bin/env bash
# Sluice's process CPU per 1,000 tokens over h1 (cleartext), h2 (TLS) and
# h3 under several Go runtime settings, in alternating rounds: the figures
# of docs/OPERATIONS.md "Runtime settings" and docs/BENCHMARKS.md "h2/h3
# per-token cost". Target 1's workload (64 streams of 200 tokens at 10 ms)
# against one simulator; in each round every setting gets a fresh Sluice and
# one `sluice bench` per protocol, so machine drift hits all settings alike.
#
#   bash docs/benchmarks/settings.sh [OUTDIR]
#   SETTINGS="- GOMAXPROCS=1 GOGC=400" ROUNDS=10 DUR=6s PROTOS="h1 h2 h3" bash docs/benchmarks/settings.sh
#
# A setting is one word: environment variables joined by commas
# (GOGC=off,GOMEMLIMIT=1GiB), "-" for none; h2_server=go or h2_server=sluice
# in a setting sets listeners.h2_server in that Sluice's config. It prints,
# per setting and protocol, the median CPU per 1,000 tokens over the rounds,
# the range, and the h2/h1 and h3/h1 ratios of the medians; OUTDIR/raw
# holds every `sluice bench -json`. Loopback only; every process it starts
# is stopped by its pid on exit.
#
# PPROF=SECONDS (branch h3loop) serves Sluice with -pprof and takes a CPU
# profile of that many seconds during every h2/h3 bench, into
# OUTDIR/prof/ROUND-SETTING-PROTO.pb.gz. The summary's last columns (also
# h3loop) are the medians of the bench's token_delay P50 and P95 (µs).
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT=${1:-${TMPDIR:-/tmp}/sluice-settings-$(date -u +%Y%m%dT%H%M%SZ)}
SETTINGS=${SETTINGS:-- GOMAXPROCS=1 GOGC=400}
ROUNDS=${ROUNDS:-5}
DUR=${DUR:-6s}
PROTOS=${PROTOS:-h1 h2 h3}
mkdir -p "$OUT/raw" "$OUT/logs" "$OUT/bin"
PPROF=${PPROF:-}
pprof_flag=()
[[ -n $PPROF ]] && pprof_flag=(-pprof) && mkdir -p "$OUT/prof"
OUT=$(cd "$OUT" && pwd)

. "$HERE/lib.sh" # log, PIDS killed on exit, free_port, wait_port, wait_tw

log "building sluice into $OUT/bin"
(cd "$ROOT" && go build -o "$OUT/bin/sluice" ./cmd/sluice) || exit 1
SLUICE=$OUT/bin/sluice

start_stream_sim "$SLUICE" || exit 1
sluice_conf "$OUT/sluice.yaml" "${H1CLIENT:-own}"

# cpu JSON: Sluice's CPU per 1,000 tokens from one `sluice bench -json`.
# delay JSON P: the bench's token_delay percentile P (p50, p95) in µs.
delay() { python3 -c "import json,sys; print('%d' % (1000*json.load(open(sys.argv[1]))['targets'][0]['token_delay'][sys.argv[2]+'_ms']))" "$1" "$2" 2>/dev/null; }
cpu() { grep -o '"ms_per_1k_tokens": *[0-9.]*' "$1" | head -1 | sed 's/.*: *//' | xargs -r printf '%.1f\n'; }

for r in $(seq "$ROUNDS"); do
	for s in $SETTINGS; do
		envs=()
		[[ $s != - ]] && IFS=, read -ra envs <<<"$s"
		conf=$OUT/sluice.yaml
		for i in "${!envs[@]}"; do # h2_server=go|sluice: the listeners' setting, not a variable
			if [[ ${envs[$i]} == h2_server=* ]]; then
				conf=$OUT/sluice-$s.yaml
				sed "s/^listeners:\$/listeners:\n  h2_server: ${envs[$i]#h2_server=}/" "$OUT/sluice.yaml" >"$conf"
				unset 'envs[i]'
			fi
		done
		env "${envs[@]}" "$SLUICE" serve "${pprof_flag[@]}" -c "$conf" >"$OUT/logs/sluice-$r-$s.log" 2>&1 &
		sp=$!
		PIDS+=($sp)
		wait_port "$HTTP" || exit 1
		sleep 1
		for p in $PROTOS; do
			if [[ $p == h1 ]]; then
				target=(-target "http://127.0.0.1:$HTTP")
			else
				target=(-target "https://127.0.0.1:$HTTPS" -protocol "$p" -insecure)
				if [[ -n $PPROF ]]; then # after the ramp, within the bench
					(sleep 2 && curl -s -o "$OUT/prof/$r-$s-$p.pb.gz" \
						"http://127.0.0.1:$ADMIN/debug/pprof/profile?seconds=$PPROF") &
				fi
			fi
			"$SLUICE" bench "${target[@]}" -pid "$sp" -model sim-stream -concurrency 64 -prompt-tokens 16 \
				-output-tokens 200 -duration "$DUR" -ramp 1s -api-key sk-bench-suite -progress never \
				-json "$OUT/raw/$r-$s-$p.json" >"$OUT/logs/bench-$r-$s-$p.log" 2>&1
			log "round $r, $s, $p: $(cpu "$OUT/raw/$r-$s-$p.json") ms per 1,000 tokens"
		done
		kill "$sp"
		wait "$sp" 2>/dev/null
	done
done

median() { sort -n | awk '{v[NR]=$1} END {if (NR==0) print "-"; else if (NR%2) printf "%.1f\n", v[(NR+1)/2]; else printf "%.1f\n", (v[NR/2]+v[NR/2+1])/2}'; }
echo "setting | protocol | median ms per 1,000 tokens | min-max | rounds | ratio to h1 | token delay p50 µs | p95 µs"
for s in $SETTINGS; do
	h1=""
	for p in $PROTOS; do
		vals=$(for f in "$OUT"/raw/*-"$s"-"$p".json; do cpu "$f"; done)
		m=$(median <<<"$vals")
		[[ $p == h1 ]] && h1=$m
		range=$(sort -n <<<"$vals" | sed -n '1p;$p' | paste -sd-)
		ratio=-
		[[ -n $h1 && $h1 != - && $m != - ]] && ratio=$(awk -v a="$m" -v b="$h1" 'BEGIN {printf "%.2f", a/b}')
		d50=$(for f in "$OUT"/raw/*-"$s"-"$p".json; do delay "$f" p50; done | median)
		d95=$(for f in "$OUT"/raw/*-"$s"-"$p".json; do delay "$f" p95; done | median)
		echo "$s | $p | $m | $range | $(wc -l <<<"$vals") | $ratio | $d50 | $d95"
	done
done | tee "$OUT/summary.txt"
