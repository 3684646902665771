#!/bin/bash
# TCP over RC against kernel TCP, unmodified programs: iperf3 goodput (one
# stream, 3 s) and sockperf's 64-byte TCP ping-pong (3 s), both ends
# preloaded with UDIWARP_PRELOAD_TCP=rc or neither, ROUNDS rounds (default
# 5), the two taking turns to go first. SPIN sets UDIWARP_PRELOAD_SPIN_NS
# (default the preload's 50000; 0: sleep at once, as the kernel does).
# Prints one line per run; BENCHMARKS.md takes the medians.
#   experiments/tcp-preload.sh            (builds the library in socketshim/preload)
set -eu
cd "$(dirname "$0")/.."
make -s -C socketshim/preload >/dev/null
LIB=$PWD/socketshim/preload
PL="LD_PRELOAD=$LIB/libudiwarp_preload.so UDIWARP_ENGINE=$LIB/libudiwarp_engine.so UDIWARP_PRELOAD_TCP=rc UDIWARP_PRELOAD_SPIN_NS=${SPIN:-50000}"
ROUNDS=${ROUNDS:-5}
port=$((30000 + RANDOM % 20000))
for r in $(seq 1 "$ROUNDS"); do
  order="kernel rc"; [ $((r % 2)) = 0 ] && order="rc kernel"
  for mode in $order; do
    E=""; [ "$mode" = rc ] && E="$PL"
    port=$((port + 2))
    env $E iperf3 -s -1 -B 127.0.0.1 -p $port >/dev/null 2>&1 & S=$!
    sleep 0.3
    g=$(env $E iperf3 -c 127.0.0.1 -p $port -t 3 -J | python3 -c 'import json,sys; print("%.2f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e9))')
    wait $S
    env $E sockperf server --tcp -i 127.0.0.1 -p $((port + 1)) >/dev/null 2>&1 & S=$!
    sleep 0.5
    l=$(env $E sockperf ping-pong --tcp -i 127.0.0.1 -p $((port + 1)) -t 3 -m 64 2>&1 | grep -o 'avg-latency=[0-9.]*' | cut -d= -f2)
    kill -INT $S 2>/dev/null || true; wait $S 2>/dev/null || true
    echo "round $r $mode iperf3_gbps=$g sockperf_avg_us=$l"
  done
done
