#!/usr/bin/env bash
# Seed 003's experiment under packet loss, with the kernel dropping the
# packets: UD Write-Record (deliver-partial), RD RDMA Write and RC RDMA
# Write (TCP + MPA) carrying 512 KiB messages over the loopback of a
# network namespace whose nftables drops a random share of every packet,
# UDP and TCP alike (numgen random; this kernel has no netem). One
# `udperf compare` per loss rate; goodput is what the target got valid.
# Needs root, iproute2 and nftables.
set -euo pipefail
cd "$(dirname "$0")/.."
ns="udiwarp-loss-$$"
bin="$(mktemp -d)/udperf"
go build -o "$bin" ./cmd/udperf
ip netns add "$ns"
trap 'ip netns del "$ns" 2>/dev/null; rm -rf "$(dirname "$bin")"' EXIT
ip -n "$ns" link set lo up
rounds="${ROUNDS:-3}"
echo "loss_permille,mode,bytes,bw_avg_gbps,ratio_to_rc_write"
for pm in 0 1 5 10 20 50; do
  ip netns exec "$ns" nft -f - <<NFT
flush ruleset
table inet loss {
  chain in {
    type filter hook input priority 0; policy accept;
    meta l4proto { udp, tcp } numgen random mod 1000 < $pm drop
  }
}
NFT
  ip netns exec "$ns" "$bin" compare -modes rc-write,ud-wr,rd-write -test bw -s 524288 -mtu 64000 \
    -D 1s -rounds "$rounds" -partial -deadline 5ms -poll event -csv |
    awk -F, -v pm="$pm" 'NR == 1 { for (i = 1; i <= NF; i++) { if ($i ~ /^BW average/) f = i; if ($i == "ratio") r = i } next }
      { printf "%s,%s,%s,%s,%s\n", pm, $1, $2, $f, $r }'
done
