#!/usr/bin/env bash
# smallreq4/syscount.sh with the runtime's sysmon events counted too: per side NAME, the uprobes
# probe_sluice:NAME_wake (runtime.entersyscallWakeSysmon: a system call woke sysmon from its deep
# sleep), NAME_handoffp (runtime.handoffp: sysmon's retake of a P in a system call, mostly) and
# NAME_nop (runtime.exitsyscallNoP: exitsyscall missed its fast path), made beforehand with
#   perf probe -x BIN --add 'NAME_wake=runtime.entersyscallWakeSysmon'   (and the two others)
# Sides without the probes (nginx) count the system calls only.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd) # docs/benchmarks
OUT=${1:?OUT}; DUR=${DUR:-4s}; BINS=${BINS:?}
mkdir -p "$OUT/raw" "$OUT/logs" "$OUT/conf"; OUT=$(cd "$OUT" && pwd)
ulimit -n "$(ulimit -Hn)" 2>/dev/null; NOFILE=$(ulimit -n)
. "$HERE/lib.sh"
names=(); declare -A BIN
for b in $BINS; do names+=("${b%%=*}"); BIN[${b%%=*}]=${b#*=}; done
first=${BIN[${names[0]}]}; names+=(nginx)
start_stream_sim "$first" || exit 1
sluice_conf "$OUT/conf/sluice.yaml" own
free_port NG1; free_port NG2; free_port NG3
mkdir -p "$OUT/conf/nginx"
sed -e "s|@PREFIX@|$OUT/conf/nginx|g; s/@NOFILE@/$NOFILE/g; s/@SIM_STREAM@/$SIM/g; s/@SIM_SPARSE@/$SIM/g" \
  -e "s/@SIM_IDLE@/$SIM/g; s/@PORT_STREAM@/$NG1/g; s/@PORT_SPARSE@/$NG2/g; s/@PORT_IDLE@/$NG3/g" \
  "${NGINXCONF:-$HERE/nginx.conf}" >"$OUT/conf/nginx/nginx.conf"
EV=$(perf list 2>/dev/null | awk '/syscalls:sys_enter_/ {print $1}' | paste -sd,)
for name in "${names[@]}"; do
  wait_tw
  if [[ $name == nginx ]]; then
    nginx -p "$OUT/conf/nginx" -c "$OUT/conf/nginx/nginx.conf" -g 'daemon off;' >"$OUT/logs/nginx.log" 2>&1 &
    sp=$!; PIDS+=($sp); port=$NG1; wait_port $port || exit 1; sleep 0.5
    pids=$(echo $sp $(pgrep -P $sp) | tr ' ' ,)
  else
    envname=ENV_$name
    ( [[ -n ${!envname:-} ]] && export ${!envname}; exec "${BIN[$name]}" serve -c "$OUT/conf/sluice.yaml" ) >"$OUT/logs/sluice-$name.log" 2>&1 &
    sp=$!; PIDS+=($sp); port=$HTTP; wait_port $port || exit 1; sleep 1; pids=$sp
    ((${CHILD_PIDS:-0})) && pids=$(echo $sp $(pgrep -P $sp) | tr " " ,)
  fi
  pev="$EV,context-switches"
  for pr in wake handoffp nop; do
    perf probe -l 2>/dev/null | grep -q "probe_sluice:${name}_$pr " && pev="$pev,probe_sluice:${name}_$pr"
  done
  if [[ -n ${REC:-} && $name != nginx ]]; then # REC=wake: the call stacks of that probe's hits instead
    ev="probe_sluice:${name}_$REC"; [[ $REC == *:* ]] && ev=$REC # or of an event named in full
    perf record -q -g -e "$ev" -p "$pids" -o "$OUT/raw/rec-$name.data" 2>/dev/null &
  else
    perf stat -e "$pev" -p "$pids" -o "$OUT/raw/perf-$name.txt" &
  fi
  pp=$!
  "$first" bench -target "http://127.0.0.1:$port" -pid "$pids" -compare "http://127.0.0.1:$SIM" \
    -model sim-stream -no-stream -concurrency 16 -prompt-tokens 16 -output-tokens 1 -duration "$DUR" -rounds 2 \
    -api-key sk-bench-suite -progress never -json "$OUT/raw/$name.json" >"$OUT/logs/bench-$name.log" 2>&1
  kill -INT $pp; wait $pp
  sent=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["targets"][0]["counts"]["sent"])' "$OUT/raw/$name.json")
  echo "== $name: $sent requests" | tee -a "$OUT/summary.txt"
  [[ -n ${REC:-} ]] || awk -v n="$sent" '/syscalls:sys_enter_|context-switches|probe_sluice:/ {gsub(",","",$1); if ($1+0 > 0) printf "%-28s %10d %8.3f\n", $2, $1, $1/n}' "$OUT/raw/perf-$name.txt" | sort -k3 -nr | tee -a "$OUT/summary.txt"
  kill "$sp"; wait "$sp" 2>/dev/null
done
