#!/usr/bin/env bash
# syscalls per small request, per side: perf stat of every syscalls:sys_enter_* tracepoint
# on the side's pids for its whole bench run (direct rounds included: they do not touch the side).
# The run itself is raw10/wakes.sh's, which also counts the runtime's sysmon events on the sides
# that have its uprobes; without them (and without REC) it is this count alone.
exec bash "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/raw10/wakes.sh" "$@"
