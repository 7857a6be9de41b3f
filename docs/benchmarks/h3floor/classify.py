#!/usr/bin/env python3
"""Split an h3 CPU profile (Sluice or h3floor) into the parts of
docs/BENCHMARKS.md, "h3cpu8": reads `go tool pprof -traces BIN PROFILE` on
stdin, prints each part's share of the samples.

    go tool pprof -traces BIN PROF.pb.gz | python3 classify.py
"""
import re
import sys

# (part, test on the stack: leaf first, root last), first match wins
def part(st):
    s = ' '.join(st)
    root = st[-1] if st else ''
    gc = ('gcBgMarkWorker' in s or 'gcDrain' in s or 'runtime.mallocgc' in s and 'gcAssist' in s
          or 'bgsweep' in s or 'bgscavenge' in s or 'markroot' in s or 'gcStart' in s)
    if gc:
        return 'GC'
    if 'runtime.findRunnable' in s or 'runtime.schedule' in s or 'runtime.mcall' in s or 'runtime.park_m' in s:
        if 'futex' in s:
            return 'scheduler: futex (thread sleep/wake)'
        if 'runtime.netpoll' in s:
            return 'scheduler: netpoll (epoll_wait)'
        return 'scheduler: findRunnable, spinning, steal'
    if 'sysmon' in s:
        return 'sysmon'
    if 'sendQueue).Run' in s:
        return 'quic-go send queue: sendmsg/GSO'
    if 'Transport).listen' in s or 'Transport).handlePacket' in s or 'Transport).init.func' in s and 'ReadPacket' in s:
        return 'quic-go transport reader: recvmmsg, hand to conn'
    if 'quic-go.(*Conn).run' in s:
        if 'handlePacket' in s or 'handleFrames' in s or 'handleAck' in s or 'handleShortHeader' in s or 'unpack' in s.lower():
            return 'quic-go run loop: receive (open, ACKs, cc)'
        if 'sendPackets' in s or 'appendPacket' in s or 'appendOneShortHeader' in s or 'triggerSending' in s:
            return 'quic-go run loop: send (pack, seal, HP)'
        if 'timer' in s.lower() or 'maybeResetTimer' in s:
            return 'quic-go run loop: timers'
        return 'quic-go run loop: other'
    if 'evloop' in s:
        if 'TryWriteAll' in s or 'scheduleSending' in s or 'onHasStreamData' in s:
            return 'our loop: hand to quic-go (TryWriteAll, signal)'
        if 'evloop.rawWrite' in s:
            return 'our loop: client write(2)'
        if 'evloop.rawRead' in s:
            return 'our loop: upstream read(2)'
        return 'our loop: relay, framing, epoll'
    if 'http3' in s or 'sluice/proxy' in s or 'net/http' in s or 'gpusim' in s:
        if 'gpusim' in s:
            return 'app: simulator (tokens, timers)'
        return 'handlers: requests (admission, head, first event, hand-off)'
    if 'timerproc' in s or 'runtime.runTimer' in s or 'checkTimers' in s:
        return 'timers'
    return 'other: ' + root.split('(')[0][:60]

parts = {}
total = 0.0
unit = {'ns': 1e-9, 'us': 1e-6, 'µs': 1e-6, 'ms': 1e-3, 's': 1.0}
block = []
val = 0.0
def flush():
    global total
    if block:
        k = part(block)
        parts[k] = parts.get(k, 0) + val
        total += val
for line in sys.stdin:
    if line.startswith('-----------+'):
        flush()
        block, val = [], 0.0
        continue
    m = re.match(r'^\s+([0-9.]+)(ns|us|µs|ms|s)\s+(\S.*)$', line)
    if m:
        val = float(m.group(1)) * unit[m.group(2)]
        block = [m.group(3).strip()]
        continue
    if line.startswith('             ') and line.strip():
        block.append(line.strip())
flush()
for k, v in sorted(parts.items(), key=lambda kv: -kv[1]):
    print('%-60s %6.2fs %5.1f%%' % (k, v, 100 * v / total))
print('%-60s %6.2fs' % ('total', total))
