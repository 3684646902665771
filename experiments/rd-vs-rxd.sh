#!/usr/bin/env bash
# RD Send/Recv against libfabric's reliable datagram provider
# ("udp;ofi_rxd") in one sitting, busy polling both, one-way latency (half
# the round trip) at 64 B .. 64000 B. fi_pingpong prints usec/xfer, its
# mean; udiwarp's figures are the median and the mean of its samples.
# Needs libfabric-bin (apt-get install libfabric-bin).
set -euo pipefail
cd "$(dirname "$0")/.."
export FI_UDP_IFACE=lo FI_TCP_IFACE=lo FI_NET_IFACE=lo
echo "# fi_pingpong -p 'udp;ofi_rxd' -e rdm (usec/xfer = mean one-way)"
for s in 64 1024 8192 32768 64000; do
  it=20000; [ "$s" -gt 8192 ] && it=3000
  taskset -c 1 fi_pingpong -p "udp;ofi_rxd" -e rdm -I "$it" -S "$s" >/dev/null 2>&1 &
  srv=$!
  sleep 0.4
  printf '%6d B  ' "$s"
  taskset -c 0 fi_pingpong -p "udp;ofi_rxd" -e rdm -I "$it" -S "$s" 127.0.0.1 2>&1 | awk '/bytes/ {getline; print "usec/xfer", $(NF-1)}'
  wait "$srv" || true
done
echo "# udiwarp RD Send/Recv (busy polling)"
go test -run '^$' -bench 'RDSizes' -benchtime 10000x ./internal/perf | grep Benchmark
