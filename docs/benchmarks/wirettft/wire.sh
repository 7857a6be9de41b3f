#!/usr/bin/env bash
# wire.sh BIN OUT: one stream at a time (5 tokens at 10 ms) through Sluice (BIN),
# nginx and h1floor (FLOOR_BIN; docs/benchmarks/h1floor) against one simulator,
# 4 s each, with tcpdump on lo; wire.py OUT then gives, per side, the time on
# the wire from the client's request to the proxy's upstream request (in), from
# the backend's first bytes to the proxy's first bytes to the client (out),
# and to a second packet to the client (a first token sent apart from the
# head). SIDES picks sides (default: sluice nginx floor); SLUICE_ENV="A=1 B=2"
# is Sluice's environment. Needs tcpdump (apt-get install -y tcpdump) and root.
#   flock /work/bench.lock env FLOOR_BIN=/tmp/h1floor bash docs/benchmarks/wirettft/wire.sh BIN OUT
#   python3 docs/benchmarks/wirettft/wire.py OUT
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BINP=$1; OUT=$2; mkdir -p $OUT/logs $OUT/conf/nginx
. $HERE/lib.sh
NOFILE=$(ulimit -n)
start_stream_sim "$BINP" || exit 1
sluice_conf "$OUT/conf/sluice.yaml" own
free_port NG1; free_port NG2; free_port NG3
sed -e "s|@PREFIX@|$OUT/conf/nginx|g; s/@NOFILE@/$NOFILE/g; s/@SIM_STREAM@/$SIM/g; s/@SIM_SPARSE@/$SIM/g" \
	-e "s/@SIM_IDLE@/$SIM/g; s/@PORT_STREAM@/$NG1/g; s/@PORT_SPARSE@/$NG2/g; s/@PORT_IDLE@/$NG3/g" \
	"$HERE/nginx.conf" >"$OUT/conf/nginx/nginx.conf"
for side in ${SIDES:-sluice nginx floor}; do
  case $side in
  sluice) ( [[ -n ${SLUICE_ENV:-} ]] && export $SLUICE_ENV; exec "$BINP" serve -c "$OUT/conf/sluice.yaml" ) >$OUT/logs/sluice.log 2>&1 & sp=$!; port=$HTTP;;
  nginx) nginx -p "$OUT/conf/nginx" -c "$OUT/conf/nginx/nginx.conf" -g 'daemon off;' >$OUT/logs/nginx.log 2>&1 & sp=$!; port=$NG1;;
  floor) free_port FL; "${FLOOR_BIN:?FLOOR_BIN=path of h1floor}" -listen 127.0.0.1:$FL -backend 127.0.0.1:$SIM >$OUT/logs/floor.log 2>&1 & sp=$!; port=$FL;;
  esac
  PIDS+=($sp)
  wait_port $port; sleep 1
  "$BINP" bench -target "http://127.0.0.1:$port" -model sim-stream -concurrency 1 -prompt-tokens 16 -output-tokens 5 -duration 1s -api-key sk-bench-suite -progress never >/dev/null 2>&1
  tcpdump -i lo -nn -tt -B 8192 "tcp port $port or tcp port $SIM" > $OUT/$side.pcap.txt 2>$OUT/logs/tcpdump-$side.log &
  tp=$!
  sleep 1
  "$BINP" bench -target "http://127.0.0.1:$port" -model sim-stream -concurrency 1 -prompt-tokens 16 -output-tokens 5 -duration 4s -api-key sk-bench-suite -progress never -json $OUT/$side.json >/dev/null 2>&1
  sleep 0.5; kill $tp; wait $tp 2>/dev/null
  kill $sp; wait $sp 2>/dev/null
  echo "$side port=$port sim=$SIM" >> $OUT/ports.txt
done
