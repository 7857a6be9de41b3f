#!/usr/bin/env bash
# side wrapper: `sluice serve -c FILE` with node.access_log {buffer: 64KiB, flush: 1s} added to FILE
f=${3:?}; g=${f%.yaml}-alog.yaml
sed 's/^node:$/node:\n  access_log: {buffer: 64KiB, flush: 1s}/' "$f" >"$g"
exec "${SLUICE_BIN:?}" serve -c "$g"
