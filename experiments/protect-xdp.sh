#!/usr/bin/env bash
# What protected segments cost over AF_XDP (issue 36): the latency of a
# 64-byte UD Send and RD Send between two network namespaces joined by a
# veth pair, `udperf server` in A on CPU 0 and `udperf client -llp xdp`
# in B on CPU 1 (as experiments/xdp.sh sets them up), busy polling, each
# round running none, auth and aead, the order reversed every other
# round. On AF_XDP a busy-polled datagram costs no system call at the
# receiver, so the cipher runs warm; experiments/protect.sh measures the
# same over loopback sockets.
#
# Usage: experiments/protect-xdp.sh OUTDIR   (as root; ROUNDS, default 5;
# N round trips, default 20000). Writes a JSON per run and summary.txt:
# per mode the median t_typical over the rounds and the median per-round
# difference to the unprotected run of the same round.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: experiments/protect-xdp.sh OUTDIR}
rounds=${ROUNDS:-5}
n=${N:-20000}
port=${PORT:-18610}
[ "$(id -u)" = 0 ] || { echo "protect-xdp.sh: needs root" >&2; exit 1; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/protect-xdp.XXXXXX")
tag=$$
nsA=udperf-px-a-$tag nsB=udperf-px-b-$tag va=pa$tag vb=pb$tag ipA=10.215.0.1 ipB=10.215.0.2 srv=
psk=000102030405060708090a0b0c0d0e0f
cleanup() {
	if [ -n "$srv" ]; then kill "$srv" 2>/dev/null || true; wait "$srv" 2>/dev/null || true; fi
	ip netns del "$nsA" 2>/dev/null || true
	ip netns del "$nsB" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
go build -o "$tmp/udperf" ./cmd/udperf
go build -o "$tmp/txoff" ./experiments/txoff
ip netns add "$nsA"
ip netns add "$nsB"
ip link add "$va" netns "$nsA" mtu 1500 type veth peer name "$vb" netns "$nsB" mtu 1500
ip -n "$nsA" addr add "$ipA/24" dev "$va"
ip -n "$nsB" addr add "$ipB/24" dev "$vb"
for x in "$nsA $va" "$nsB $vb"; do
	read -r ns dev <<<"$x"
	ip -n "$ns" link set "$dev" up
	ip -n "$ns" link set lo up
	ip netns exec "$ns" "$tmp/txoff" "$dev"
done
ip netns exec "$nsA" taskset -c 0 "$tmp/udperf" server -addr "$ipA:$port" -psk "$psk" >"$out/server.log" 2>&1 &
srv=$!
for ((k = 0; k < 200; k++)); do
	[ -n "$(ip netns exec "$nsA" ss -Hltn "sport = :$port" 2>/dev/null)" ] && break
	sleep 0.05
done
client() { ip netns exec "$nsB" taskset -c 1 timeout --foreground 300 "$tmp/udperf" client -addr "$ipA:$port" -poll busy -llp xdp -json "$@"; }
prots=(none auth aead)
for ((r = 1; r <= rounds; r++)); do
	order=("${prots[@]}")
	if ((r % 2 == 0)); then order=(aead auth none); fi
	for mode in ud-send rd-send; do
		for p in "${order[@]}"; do
			extra=()
			if [ "$p" != none ]; then extra=(-protect "$p" -psk "$psk"); fi
			client -mode "$mode" -test lat -s 64 -n "$n" -w 2000 "${extra[@]}" >"$out/r$r-$mode-$p.json" 2>"$out/r$r-$mode-$p.err"
		done
	done
done
python3 - "$out" "$rounds" >"$out/summary.txt" <<'PY'
import json, statistics, sys, os
out, rounds = sys.argv[1], int(sys.argv[2])
for mode in ("ud-send", "rd-send"):
    fig = {p: [json.load(open(os.path.join(out, f"r{r}-{mode}-{p}.json")))["results"][0]["t_typical_us"] for r in range(1, rounds + 1)] for p in ("none", "auth", "aead")}
    for p in ("none", "auth", "aead"):
        d = statistics.median(a - b for a, b in zip(fig[p], fig["none"]))
        print(f"{mode:8} {p:5} t_typical {statistics.median(fig[p]):6.2f} µs  minus none {d:+.2f} µs  rounds {fig[p]}")
PY
cat "$out/summary.txt"
