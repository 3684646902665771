#!/usr/bin/env bash
# Seed 003's verbs-level comparisons, reproduced with `udperf compare` on
# this machine (loopback; both ends in one process; busy polling, as the
# seed's and perftest's ping-pongs spin). Each row is one compare run:
# ROUNDS rounds, modes alternating, medians, ratio to the first mode.
#
#   latency  RC Send/Recv vs UD Send/Recv          (seed: UD 18.1 % lower up to 2 KB)
#   latency  RC RDMA Write vs UD Write-Record      (seed: 24.4 % lower; issue 7: <= 0.76x)
#   goodput  RC Send/Recv vs UD Send/Recv          (seed: UD up to 33.4 % higher)
#   goodput  RC RDMA Write vs UD Write-Record      (seed: +256 % at 512 KB; issue 7: >= 1.2x)
#   and every datagram mode beside raw-udp, every RC mode beside raw-tcp.
#
# Output: CSV on stdout (table,mode,bytes,figure,ratio); figure is the
# median half round trip in µs (lat) or goodput in Gb/s (bw).
# Run it alone on the machine: two cores, and every other process skews it.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${ROUNDS:-3}"
n="${ITERS:-20000}"
bin="$(mktemp -d)/udperf"
trap 'rm -rf "$(dirname "$bin")"' EXIT
go build -o "$bin" ./cmd/udperf
echo "table,mode,bytes,figure,ratio"
cmp() { # table, then udperf compare flags
  local table="$1"; shift
  "$bin" compare -rounds "$rounds" -poll busy -csv "$@" |
    awk -F, -v t="$table" 'NR == 1 { for (i = 1; i <= NF; i++) { if ($i ~ /^t_typical/) f = i; if ($i ~ /^BW average/) f = i; if ($i == "ratio") r = i } next }
      { printf "%s,%s,%s,%s,%s\n", t, $1, $2, $f, $r }'
}
for s in 64 1024 2048; do
  cmp send-lat -modes rc-send,ud-send -test lat -s "$s" -n "$n"
  cmp write-lat -modes rc-write,ud-wr -test lat -s "$s" -n "$n"
done
for s in 32768 64000; do
  cmp send-bw -modes rc-send,ud-send -test bw -s "$s" -D 1s
done
for s in 65536 524288; do
  cmp write-bw -modes rc-write,ud-wr -test bw -s "$s" -mtu 64000 -D 1s
done
cmp udp-lat -modes raw-udp,ud-send,ud-wr,rd-send,rd-write,rd-wr -test lat -s 64 -n "$n"
cmp tcp-lat -modes raw-tcp,rc-send,rc-write,rc-read -test lat -s 64 -n "$n"
cmp udp-bw -modes raw-udp,ud-send,rd-send -test bw -s 64000 -D 1s
cmp tcp-bw -modes raw-tcp,rc-send,rc-write,rc-read -test bw -s 524288 -D 1s
