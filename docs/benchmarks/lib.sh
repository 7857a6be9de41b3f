# Helpers shared by the benchmark scripts (run.sh, settings.sh, ab-h1.sh).
# Loopback only. A script that defines its own log() or cleanup() (run.sh)
# does so before sourcing this file and keeps them; for the others this
# file defines log() (to stderr) and a PIDS array whose processes are
# killed when the script exits.

if ! declare -F log >/dev/null; then
	log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
fi
if ! declare -F cleanup >/dev/null; then
	PIDS=()
	cleanup() {
		local p
		for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
	}
	trap cleanup EXIT
	trap 'exit 130' INT TERM
fi

# below the ephemeral range (32768+) so no outgoing connection holds them
NEXT_PORT=$((20000 + RANDOM % 10000))
free_port() { # free_port VAR: sets VAR to a loopback port free for TCP and UDP
	while :; do
		NEXT_PORT=$((NEXT_PORT + 1))
		if [[ -z $(ss -Htuan "sport = :$NEXT_PORT" 2>/dev/null) ]]; then
			printf -v "$1" '%s' "$NEXT_PORT"
			return
		fi
	done
}

wait_port() { # wait_port PORT [SECONDS]: until 127.0.0.1:PORT accepts (default 15 s)
	local i
	for i in $(seq $((${2:-15} * 10))); do
		if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
		sleep 0.1
	done
	log "port $1 did not open"
	return 1
}

wait_tw() { # until fewer than 2,000 TIME_WAIT sockets (at most 2 min)
	local i
	for i in $(seq 60); do
		(($(ss -Htan state time-wait | wc -l) < 2000)) && return
		sleep 2
	done
}

# target 1's stream simulator and Sluice's config, for the scripts that
# run one simulator against every side (settings.sh, ab-h1.sh):
start_stream_sim() { # start_stream_sim BIN: sets SIM; logs to $OUT/logs/sim.log
	free_port SIM
	"$1" sim -addr "127.0.0.1:$SIM" -model sim-stream -pace 10ms -prefill-base -1ns -prefill-per-token -1ns \
		-max-batch 100000 -kv-cache-tokens 1000000000 -stamp-tokens >"$OUT/logs/sim.log" 2>&1 &
	PIDS+=($!)
	wait_port "$SIM"
}

sluice_conf() { # sluice_conf DEST H1CLIENT: sets HTTP, HTTPS, ADMIN; writes sluice.yaml with every pool on $SIM
	free_port HTTP
	free_port HTTPS
	free_port ADMIN
	sed -e "s/@HTTP@/$HTTP/g; s/@HTTPS@/$HTTPS/g; s/@ADMIN@/$ADMIN/g; s/@H1CLIENT@/$2/g" \
		-e "s/@SIM_STREAM@/$SIM/g; s/@SIM_SPARSE@/$SIM/g; s/@SIM_IDLE@/$SIM/g; s/@IDLE_H2C@/false/g" \
		"$HERE/sluice.yaml" >"$1"
}

one_sluice_setup() { # one_sluice_setup BIN: OUT made absolute with logs/ and conf/, the stream simulator started, OUT/conf/sluice.yaml written (own h1 client)
	mkdir -p "$OUT/logs" "$OUT/conf"
	OUT=$(cd "$OUT" && pwd)
	start_stream_sim "$1" || return 1
	sluice_conf "$OUT/conf/sluice.yaml" own
}
