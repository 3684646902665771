#!/usr/bin/env bash
# fi_pingpong over udiwarp's libfabric provider beside libfabric's own
# providers, in one sitting (issue 34's first figure): two processes, the
# server pinned to CPU 1 and the client to CPU 0, loopback, busy-polled
# CQs (fi_pingpong's own), one-way µs per transfer (fi_pingpong's
# usec/xfer: elapsed / iterations / 2, a mean: it prints nothing else).
# Each against its baseline in the same round, the order reversed every
# other round:
#   udiwarp          -e dgram  against  udp          -e dgram
#   udiwarp (native) -e rdm    against  udp;ofi_rxd  -e rdm  (udiwarp's RD
#                              endpoint, FI_PROVIDER hiding the utility
#                              providers)
#   udiwarp;ofi_rxd  -e rdm    against  udp;ofi_rxd  -e rdm
# Both providers on loopback (FI_UDP_IFACE=lo; udiwarp's domain lo).
# Figures per cell: the median over the rounds of each run's mean, the
# ratio of those medians to the baseline's, and every run's mean.
# Output: a markdown table on stdout, ready for BENCHMARKS.md; progress on
# stderr; raw outputs kept under $OUT.
#
# Environment: ROUNDS (5), FI_N iterations per run (20000), DGRAM_SIZES
# ("64 256 1024 4096"), RDM_SIZES ("64 1024 4096"), OUT (a new
# temporary directory). Needs fi_pingpong (libfabric-bin), libfabric-dev,
# gcc, Go, taskset. Run it alone on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=${ROUNDS:-5}
fi_n=${FI_N:-20000}
dgram_sizes=${DGRAM_SIZES:-"64 256 1024 4096"}
rdm_sizes=${RDM_SIZES:-"64 1024 4096"}
out=${OUT:-$(mktemp -d /tmp/fi-pingpong.XXXXXX)}
mkdir -p "$out"
export FI_UDP_IFACE=lo

die() { echo "fi-pingpong.sh: $*" >&2; exit 1; }
log() { echo "$*" >&2; }
for c in fi_pingpong taskset gcc go; do command -v "$c" >/dev/null || die "$c is not installed"; done
for c in 0 1; do taskset -c "$c" true 2>/dev/null || die "cannot run on CPU $c: the table needs two CPUs"; done

log "== building the provider into $out/prov"
make -s -C libfabric >/dev/null
mkdir -p "$out/prov"
cp libfabric/libudiwarp-fi.so libfabric/libudiwarp_fi_engine.so "$out/prov/"
export FI_PROVIDER_PATH="$out/prov"

port=47592
# run PROVIDER EP SIZE ROUND: one fi_pingpong pair; appends a data line.
run() {
  local prov=$1 ep=$2 size=$3 r=$4 dom=() base mean env=()
  [[ $prov == udiwarp* ]] && dom=(-d lo)
  [[ $prov == udiwarp && $ep == rdm ]] && env=(FI_PROVIDER='^ofi_rxd,ofi_rxm,ofi_mrail')
  base="$out/$(echo "$prov" | tr ';' '+')-$ep-$size-$r"
  port=$((port + 1))
  env "${env[@]}" taskset -c 1 timeout --foreground 600 fi_pingpong -p "$prov" "${dom[@]}" -e "$ep" -I "$fi_n" -S "$size" -B "$port" >"$base.server" 2>&1 &
  local spid=$!
  for _ in $(seq 100); do ss -ltn "sport = :$port" | grep -q LISTEN && break; sleep 0.05; done
  env "${env[@]}" taskset -c 0 timeout --foreground 600 fi_pingpong -p "$prov" "${dom[@]}" -e "$ep" -I "$fi_n" -S "$size" -P "$port" 127.0.0.1 >"$base.client" 2>&1 || true
  wait "$spid" || true
  mean=$(awk -v s="$size" 'NR > 1 && ($1 == s || $1 == s/1024 "k") {print $7}' "$base.client" | tail -1)
  if [ -z "$mean" ]; then
    log "   fi_pingpong -p '$prov' -e $ep -S $size failed; its output:"; sed 's/^/   | /' "$base.client" >&2
    mean=NaN
  fi
  echo "$prov $ep $size $r $mean" >>"$out/data"
}

: >"$out/data"
start=$(date -u '+%Y-%m-%d %H:%M UTC')
for r in $(seq "$rounds"); do
  log "== round $r of $rounds"
  for size in $dgram_sizes; do
    if [ $((r % 2)) = 1 ]; then run udp dgram "$size" "$r"; run udiwarp dgram "$size" "$r"
    else run udiwarp dgram "$size" "$r"; run udp dgram "$size" "$r"; fi
  done
  for size in $rdm_sizes; do
    if [ $((r % 2)) = 1 ]; then run "udp;ofi_rxd" rdm "$size" "$r"; run udiwarp rdm "$size" "$r"; run "udiwarp;ofi_rxd" rdm "$size" "$r"
    else run "udiwarp;ofi_rxd" rdm "$size" "$r"; run udiwarp rdm "$size" "$r"; run "udp;ofi_rxd" rdm "$size" "$r"; fi
  done
done

echo "fi_pingpong, two processes pinned (server CPU 1, client CPU 0), loopback, busy-polled CQs, one-way µs per transfer (usec/xfer, a mean); $rounds rounds from $start, the pair's order reversed every other round; -I $fi_n; $(uname -r), $(fi_info --version | head -1), $(go version | cut -d' ' -f3). Mean: the median over the rounds of each run's mean. \`experiments/fi-pingpong.sh\` (ROUNDS=$rounds)."
echo
echo "| provider | endpoint | bytes | mean µs | ratio to its baseline | run means |"
echo "|---|---|---:|---:|---:|---|"
awk '
  function median(list,   n, a, i, j, t) {
    n = split(list, a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  { k = $1 SUBSEP $2 SUBSEP $3; runs[k] = runs[k] " " $5; if (!(k in seen)) { seen[k] = 1; order[++n] = k } }
  END {
    for (i = 1; i <= n; i++) {
      split(order[i], f, SUBSEP)
      m = median(runs[order[i]])
      base = (f[2] == "rdm") ? "udp;ofi_rxd" : "udp"
      bm = median(runs[base SUBSEP f[2] SUBSEP f[3]])
      ratio = (f[1] == base) ? "1.00x (baseline)" : sprintf("%.2fx of %s", m / bm, base)
      name = (f[1] == "udiwarp" && f[2] == "rdm") ? "udiwarp (native RD)" : f[1]
      printf "| %s | %s | %s | %.2f | %s | %s |\n", name, f[2], f[3], m, ratio, runs[order[i]]
    }
  }' "$out/data"
log "== raw outputs in $out"
