#!/bin/bash
# shares.sh BIN PROF...: the cumulative share of each pipeline step in merged CPU profiles (smallreq5/prof.sh), h1up excluded (small8)
BIN=$1; shift
while IFS='|' read -r n r; do
  v=$(go tool pprof -top -focus="$r" -ignore='h1up\.' "$BIN" "$@" 2>/dev/null | awk '/Showing nodes accounting for/{print $6, $5}' | tr -d ',')
  printf "%-55s %s\n" "$n" "$v"
done <<'LIST'
pipeline: Handler.serve minus h1up (incl. observe)|proxy.\(\*Handler\)\.serve$
intake (readBody, JSON scan, route match)|proxy.\(\*exchange\)\.intake$
  readBody (incl. read deadlines)|proxy.readBody$
  parseRequest (JSON scan)|proxy.\(\*exchange\)\.parseRequest$
admit: limiter.Local.Admit|limiter.\(\*Local\)\.Admit$
admit: limiter.SetHeaders|limiter.SetHeaders$
routing acquire (queue, pick)|proxy.\(\*exchange\)\.acquire$
leg: newLeg (context, watchdog timer)|proxy.\(\*exchange\)\.newLeg$
leg: upstreamRequest (header map, URL)|proxy.\(\*exchange\)\.upstreamRequest$
leg: close (cancel, timer stop, attempt end)|proxy.\(\*leg\)\.close$
relay: relayBody (headers, usage scan, Server-Timing)|proxy.\(\*exchange\)\.relayBody$
  usageOfBody (response JSON scan)|proxy.\(\*exchange\)\.usageOfBody$
  appendServerTiming|proxy.\(\*exchange\)\.appendServerTiming$
observe: Metrics.Record|observe.\(\*Metrics\)\.Record$
observe: access log (line and write)|observe.\(\*AccessLog\)\.Write$
  of which write(2)|observe.\(\*LogWriter\)\.line$
observe: Stats.Record|observe.\(\*Stats\)\.Record$
observe: record() (stages)|proxy.\(\*exchange\)\.record$
request id (newID)|proxy.newID$
time.Now (all callers)|^time.Now$
mallocgc (all callers, incl. listen/h1up)|runtime.mallocgc$
GC (gcBgMarkWorker + bgsweep)|runtime.gcBgMarkWorker$|runtime.bgsweep$
LIST
