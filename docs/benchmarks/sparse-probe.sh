#!/usr/bin/env bash
# sparse-probe.sh BINDIR OUT: run.sh target 5b (2,000 sparse streams) against one
# Sluice (sluice serve -pprof) and the simulator only, Sluice vs direct, for a
# trace (TRACE=1: 4 s from 5 s in) or a CPU profile (PROF=1: 8 s from 3 s in).
# BINDIR/sluice serves; GEN=DIR takes the simulator and generator from DIR.
# Env: SLUICE_ENV, H1CLIENT, N (streams), D (duration). The last lines: the added
# token delay (target − direct), then the P99 of the first token, of the rest, and
# of the requests sent from 4 s into each round on (after the ramp's new connections). Wrap it in flock /work/bench.lock.
set -uo pipefail
B=$1 OUT=$2; mkdir -p $OUT; G=${GEN:-$B}
H=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PIDS=()
cleanup(){ for p in "${PIDS[@]}"; do kill $p 2>/dev/null; done; sleep 0.5; for p in "${PIDS[@]}"; do kill -9 $p 2>/dev/null; done; }
trap cleanup EXIT
port(){ while :; do p=$((20000 + RANDOM % 10000)); [[ -z $(ss -Htuan "sport = :$p") ]] && { echo $p; return; }; done; }
waitp(){ for i in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.1; done; return 1; }
ulimit -n $(ulimit -Hn)
SIM=$(port)
$G/sluice sim -addr 127.0.0.1:$SIM -model sim-sparse -pace 1s -prefill-base -1ns -prefill-per-token -1ns -max-batch 100000 -kv-cache-tokens 1000000000 -stamp-tokens > $OUT/sim.log 2>&1 &
PIDS+=($!); waitp $SIM
HTTP=$(port); HTTPS=$(port); ADMIN=$(port)
sed -e "s/@HTTP@/$HTTP/g; s/@HTTPS@/$HTTPS/g; s/@ADMIN@/$ADMIN/g; s/@SIM_STREAM@/$SIM/g; s/@SIM_SPARSE@/$SIM/g; s/@SIM_IDLE@/$SIM/g; s/@IDLE_H2C@/false/g; s/@H1CLIENT@/${H1CLIENT:-own}/g" $H/sluice.yaml > $OUT/sluice.yaml
env ${SLUICE_ENV:-} $B/sluice serve -c $OUT/sluice.yaml -pprof > $OUT/sluice.log 2>&1 &
SP=$!; PIDS+=($SP); waitp $HTTP; waitp $ADMIN
if [[ ${TRACE:-0} == 1 ]]; then
  ( sleep 5; curl -s -o $OUT/trace.out "http://127.0.0.1:$ADMIN/debug/pprof/trace?seconds=4" ) &
fi
if [[ ${PROF:-0} == 1 ]]; then
  ( sleep 3; curl -s -o $OUT/cpu.pprof "http://127.0.0.1:$ADMIN/debug/pprof/profile?seconds=8" ) &
fi
$G/sluice bench -target http://127.0.0.1:$HTTP -compare http://127.0.0.1:$SIM -pid $SP -model sim-sparse -concurrency ${N:-2000} -prompt-tokens 16 -output-tokens 6 -duration ${D:-24s} -rounds 2 -ramp 2s -api-key sk-bench-suite -json $OUT/bench.json -progress never > $OUT/bench.txt 2>&1
python3 - $OUT/bench.json <<'PY'
import json,sys
j=json.load(open(sys.argv[1]))
t,b=j['targets']
print("delay p50 %+.3f p99 %+.3f | target p50 %.3f p99 %.3f  direct p50 %.3f p99 %.3f | ttft p50 %.2f p99 %.2f | cpu %s ok %d"%(
 t['token_delay']['p50_ms']-b['token_delay']['p50_ms'], t['token_delay']['p99_ms']-b['token_delay']['p99_ms'],
 t['token_delay']['p50_ms'],t['token_delay']['p99_ms'],b['token_delay']['p50_ms'],b['token_delay']['p99_ms'],
 t['ttft']['p50_ms'],t['ttft']['p99_ms'], t['cpu'][0]['cpu_ms'], t['counts']['ok']))
# The first token (Sluice: written at the hand-off) and the rest (relayed by
# the loops), absolute P99 target / direct; a generator from before
# token_delay_first has none.
if 'token_delay_first' in t:
  f=lambda x,k: x[k]['p99_ms']
  print("first p99 %.3f / %.3f  rest p99 %.3f / %.3f  t>=4s p99 %.3f / %.3f (target / direct)"%(
   f(t,'token_delay_first'),f(b,'token_delay_first'),f(t,'token_delay_rest'),f(b,'token_delay_rest'),
   f(t,'token_delay_late'),f(b,'token_delay_late')))
PY
