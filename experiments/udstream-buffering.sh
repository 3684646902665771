#!/usr/bin/env bash
# Seed 003's streaming experiment with udstream: the initial buffering
# time of the same MPEG-TS stream (ffmpeg's test pattern and a tone,
# MPEG-2 at 1 Mb/s, 8 s) over Write-Record/UD with partial delivery,
# Write-Record/RD, UD Send/Recv, RC (a TCP + MPA stream, as VLC's HTTP
# streaming over RC-iWARP) and plain UDP sockets, at 0, 0.5, 1 and 5 %
# loss of every UDP and TCP packet (nftables numgen random on the
# loopback of a network namespace: the kernel drops, both ways). Initial
# buffering is the receiver's time from its request until it holds
# -buffer (500 ms) of stream by the stream's PCR; the sender paces at the
# stream's own rate. ROUNDS runs per cell (default 5), transports
# alternating within a round; the median, and the share of the stream's
# frames ffprobe decodes from what arrived.
#
# Then the socket interface's cost (seed 003: about 2 %): the CPU time
# (user + system, both processes) of the same stream, paced, through the
# socket shim (send-ud) against plain UDP sockets, no loss.
#
# SPEED=0 sends as fast as the transport takes the stream (udstream send
# -speed 0), so initial buffering measures the transfer itself, as a
# player's pre-buffering over a fast network does; the default, 1, paces
# at the stream's own rate.
#
# Prints CSV; needs root, iproute2, nftables, ffmpeg and ffprobe.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${ROUNDS:-5}"
speed="${SPEED:-1}"
work="$(mktemp -d)"
ns="udiwarp-stream-$$"
trap 'ip netns del "$ns" 2>/dev/null; rm -rf "$work"' EXIT
go build -o "$work/udstream" ./cmd/udstream
ffmpeg -v error -f lavfi -i testsrc=size=640x360:rate=25 -f lavfi -i sine=frequency=440:sample_rate=48000 \
  -t 8 -c:v mpeg2video -b:v 1M -c:a mp2 -f mpegts "$work/in.ts"
frames() { ffprobe -v error -count_frames -select_streams v:0 -show_entries stream=nb_read_frames -of default=nw=1:nk=1 "$1" | head -1; }
in_frames=$(frames "$work/in.ts")
ip netns add "$ns"
ip -n "$ns" link set lo up
loss() {
  ip netns exec "$ns" nft -f - <<NFT
flush ruleset
table inet loss {
  chain in {
    type filter hook input priority 0; policy accept;
    meta l4proto { udp, tcp } numgen random mod 1000 < $1 drop
  }
}
NFT
}
# one TRANSPORT: a sender, then the receiver; prints the receiver's JSON.
one() {
  local t=$1 port=$2
  ip netns exec "$ns" "$work/udstream" send -t "$t" -listen "127.0.0.1:$port" -i "$work/in.ts" -speed "$speed" -q -wait 20s &
  local sp=$!
  sleep 0.3
  ip netns exec "$ns" "$work/udstream" recv -t "$t" -from "127.0.0.1:$port" -o "$work/out.ts" -json -q -wait 20s -idle 3s 2>/dev/null || true
  wait "$sp" || true
}
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) { print "NaN"; exit } m = int((NR + 1) / 2); print (NR % 2) ? v[m] : (v[m] + v[m + 1]) / 2 }'; }
echo "loss_permille,transport,runs,initial_buffering_ms_median,frames_pct_median,valid_pct_median,stalls_median"
port=5100
for pm in 0 5 10 50; do
  loss "$pm"
  declare -A buf=() fr=() val=() st=()
  for r in $(seq 1 "$rounds"); do
    for t in wr-ud wr-rd send-ud rc udp; do
      port=$((port + 1))
      j=$(one "$t" "$port")
      [ -z "$j" ] && continue
      b=$(printf '%s' "$j" | sed -n 's/.*"initial_buffering_ms":\([0-9.e+-]*\).*/\1/p')
      v=$(printf '%s' "$j" | sed -n 's/.*"valid_pct":\([0-9.e+-]*\).*/\1/p')
      s=$(printf '%s' "$j" | sed -n 's/.*"stalls":\([0-9]*\).*/\1/p')
      f=$(frames "$work/out.ts" 2>/dev/null || echo 0)
      buf[$t]+="$b "; val[$t]+="$v "; st[$t]+="$s "
      fr[$t]+="$(awk -v a="${f:-0}" -v b="$in_frames" 'BEGIN { printf "%.1f", 100 * a / b }') "
    done
  done
  for t in wr-ud wr-rd send-ud rc udp; do
    printf '%s,%s,%s,%s,%s,%s,%s\n' "$pm" "$t" "$rounds" \
      "$(tr ' ' '\n' <<<"${buf[$t]:-}" | grep . | median)" "$(tr ' ' '\n' <<<"${fr[$t]:-}" | grep . | median)" \
      "$(tr ' ' '\n' <<<"${val[$t]:-}" | grep . | median)" "$(tr ' ' '\n' <<<"${st[$t]:-}" | grep . | median)"
  done
  unset buf fr val st
done
loss 0
echo
echo "transport,runs,cpu_s_median (sender + receiver, user + system)"
declare -A cpu=()
for r in $(seq 1 "$rounds"); do
  for t in send-ud udp; do
    port=$((port + 1))
    c=$( { TIMEFORMAT='%U %S'; time one "$t" "$port" >/dev/null; } 2>&1 | tail -1 | awk '{ print $1 + $2 }')
    cpu[$t]+="$c "
  done
done
for t in send-ud udp; do
  printf '%s,%s,%s\n' "$t" "$rounds" "$(tr ' ' '\n' <<<"${cpu[$t]}" | grep . | median)"
done
