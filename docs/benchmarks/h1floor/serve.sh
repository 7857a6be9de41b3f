#!/usr/bin/env bash
# serve.sh serve -c SLUICE_YAML: stands in for `sluice serve` in
# docs/benchmarks/ab-h1.sh (a side "floor=$PWD/docs/benchmarks/h1floor/serve.sh",
# ENV_floor=FLOOR_BIN=/path/to/h1floor): execs h1floor on the config's
# cleartext listener, relaying to the first backend of the config (the
# simulator), so that the side's pid is h1floor's.
#   go build -o /tmp/h1floor ./docs/benchmarks/h1floor
set -euo pipefail
[[ ${1:-} == serve && ${2:-} == -c && -n ${3:-} ]] || { echo "usage: $0 serve -c SLUICE_YAML" >&2; exit 2; }
listen=$(awk '$1 == "http:" {print $2; exit}' "$3")
backend=$(awk '$1 == "-" && $2 == "url:" {sub("http://", "", $3); print $3; exit}' "$3")
exec "${FLOOR_BIN:?FLOOR_BIN=path of the h1floor binary}" -listen "$listen" -backend "$backend"
