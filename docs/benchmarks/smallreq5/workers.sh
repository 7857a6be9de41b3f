#!/usr/bin/env bash
# Side wrapper for ab-h1.sh (with CHILD_PIDS=1): `sluice serve -c FILE` as
# WORKERS processes (default 2) sharing the cleartext port through
# SO_REUSEPORT (SLUICE_REUSEPORT=1), each with GOMAXPROCS=1 unless the
# environment sets it: nginx's process model, measured. Every process but
# the first gets its own HTTPS (and HTTP/3) and admin ports. SIGTERM is
# passed on to all of them.
f=${3:?}
n=${WORKERS:-2}
export SLUICE_REUSEPORT=1 GOMAXPROCS=${GOMAXPROCS:-1}
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait' TERM INT
for i in $(seq "$n"); do
	g=$f
	if ((i > 1)); then
		g=${f%.yaml}-w$i.yaml
		read -r https admin < <(python3 -c 'import socket
ps=[]
for _ in range(2):
    s=socket.socket(); s.bind(("127.0.0.1",0)); ps.append(s)
print(*[s.getsockname()[1] for s in ps])')
		sed -E -e "s/^(    addr: 127\.0\.0\.1:)[0-9]+/\1$https/" -e "s/^(  admin: 127\.0\.0\.1:)[0-9]+/\1$admin/" "$f" >"$g"
	fi
	"${SLUICE_BIN:?}" serve -c "$g" &
	pids+=($!)
done
wait
