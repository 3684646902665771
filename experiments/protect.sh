#!/usr/bin/env bash
# What protected segments cost (issue 36): each mode beside itself
# protected, in one `udperf compare` run each (the unprotected mode is the
# baseline; rounds alternate the order), over loopback, busy polling.
#
#   lat, 64 B:     ud-send and rd-send, none / auth / aead (9 and 7 rounds)
#   bw, 64000 B:   ud-send, ud-wr and rd-write, none / auth / aead (5 rounds)
#
# Usage: experiments/protect.sh OUTDIR   (about 2 minutes on two cores;
# nothing else should run). It writes one JSON document per run
# (docs/udperf.md's schema: round_figures and round_ratios per mode) and
# summary.txt: each mode's median figure, its ratio to the baseline, and
# the median over the rounds of its difference to the baseline (the
# latency cost in µs).
set -euo pipefail
out=${1:?usage: experiments/protect.sh OUTDIR}
mkdir -p "$out"
cd "$(dirname "$0")/.."
go build -o "$out/udperf" ./cmd/udperf
u="$out/udperf"
run() { # name, compare flags...
	local name=$1
	shift
	"$u" compare "$@" -json >"$out/$name.json" 2>"$out/$name.err" || { cat "$out/$name.err" >&2; exit 1; }
}
run lat-ud64 -modes ud-send,ud-send+auth,ud-send+aead -test lat -s 64 -n 20000 -w 2000 -rounds 9
run lat-rd64 -modes rd-send,rd-send+auth,rd-send+aead -test lat -s 64 -n 20000 -w 2000 -rounds 7
run bw-ud64000 -modes ud-send,ud-send+auth,ud-send+aead -test bw -s 64000 -D 1 -rounds 5
run bw-wr64000 -modes ud-wr,ud-wr+auth,ud-wr+aead -test bw -s 64000 -D 1 -rounds 5
run bw-rdw64000 -modes rd-write,rd-write+auth,rd-write+aead -test bw -s 64000 -D 1 -rounds 5
rm -f "$out/udperf"
python3 - "$out" >"$out/summary.txt" <<'PY'
import json, statistics, sys, glob, os
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    rs = json.load(open(f))["results"]
    base = rs[0]["round_figures"]
    lat = rs[0]["test"] == "lat"
    print(os.path.basename(f)[:-5])
    for r in rs:
        fig = r["t_typical_us"] if lat else r["bw_avg_gbps"]
        diff = statistics.median(a - b for a, b in zip(r["round_figures"], base))
        unit = "µs" if lat else "Gb/s"
        print(f"  {r['mode']:<15} {fig:8.2f} {unit:<5} ratio {r['ratio']:.3f}  median difference {diff:+.2f} {unit}  spread {r['spread_pct']:.0f}%")
PY
cat "$out/summary.txt"
