#!/bin/sh
# alternate.sh OUT A.test B.test: BenchmarkSmallRequests (-benchtime 20x) of two proxy test
# binaries (`go test -c` of ./proxy at each side), alternated three times (small8); under the lock:
#   flock /work/bench.lock timeout 280 sh docs/benchmarks/small8/alternate.sh OUT ./base.test ./new.test
for i in 1 2 3; do for s in "$2" "$3"; do
  echo "== $s"
  "$s" -test.run '^$' -test.bench BenchmarkSmallRequests -test.benchtime 20x 2>&1 | grep Bench
done; done > "$1" 2>&1
