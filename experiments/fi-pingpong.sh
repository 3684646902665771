#!/usr/bin/env bash
# fi_pingpong over udiwarp's libfabric provider beside libfabric's own
# providers, in one sitting (issue 34's first figure): two processes, the
# server pinned to CPU 1 and the client to CPU 0, loopback, busy-polled
# CQs (fi_pingpong's own), one-way µs a transfer. Each against its
# baseline in the same round, the order reversed every other round; four
# groups (PAIRS):
#   dgram  udiwarp          -e dgram  against  udp          -e dgram
#   rdm    udiwarp (native) -e rdm    against  udp;ofi_rxd  -e rdm  (udiwarp's
#                                     RD endpoint, FI_PROVIDER hiding the
#                                     utility providers), and
#          udiwarp;ofi_rxd  -e rdm    against  the same
#   msg    udiwarp          -e msg    against  tcp          -e msg  (RC over
#                                     TCP + MPA against libfabric's TCP)
#   rxm    udiwarp;ofi_rxm  -e rdm    against  tcp;ofi_rxm  -e rdm  (libfabric's
#                                     RDM layer over each one's MSG endpoints)
# Every provider on loopback (FI_UDP_IFACE=lo, FI_TCP_IFACE=lo; udiwarp's
# domain lo). A size above a provider's max_msg_size (fi_info's: udp's
# 1,472 bytes, udiwarp dgram's 65,485) is not run; its cell is empty.
#
# fi_pingpong prints one figure, usec/xfer: the time from its first
# exchange to its last over the iterations and over two, a mean with no
# warm-up, so it includes the first exchange's cost (ofi_rxm opens its
# connection then, about 0.2 s here; ofi_rxd shakes hands, 30-50 ms).
# Each cell is therefore two runs: N iterations, and one; its figure is
# (N x the first's mean - the second's) / (N - 1), µs a transfer once the
# exchange runs (SUBTRACT_FIRST=0: fi_pingpong's mean as it is, one run).
# Figures per cell: the median over the rounds of those, the ratio of the
# medians to the baseline's, fi_pingpong's own mean and the first
# exchange (the one-iteration run's round trip), and every run's figure.
#
# Output: a markdown table on stdout (also $OUT/table.md), ready for
# BENCHMARKS.md; progress on stderr; in $OUT: runs.csv (a row per cell and
# round: figure, series, x = bytes, round, value = µs a transfer, unit,
# fi_pingpong_mean_us, first_exchange_ms, provider, endpoint, iterations,
# the client's command), fi-pingpong.png and .svg (`go run ./experiments
# -plot $OUT`: µs a transfer against message size, log-log, a line per
# provider and endpoint through the medians, min-max bars), and every
# run's output.
#
# The first exchange's cost varies from run to run (ofi_rxm's by some
# 20 ms), and what is left of that after the subtraction is spread over
# 2N transfers: hence N of 10,000 up to 4 KiB.
#
# Environment: ROUNDS (3), PAIRS ("dgram rdm msg rxm"), SIZES ("64 256
# 1024 4096 16384 65536"; DGRAM_SIZES, RDM_SIZES, MSG_SIZES, RXM_SIZES
# each default to it), FI_N iterations per run up to 4 KiB (10000),
# FI_N_LARGE above 4 KiB (1000: udiwarp's native RDM endpoint took 25 ms
# a 64 KiB transfer on 2026-11-27, 50 s a run), SUBTRACT_FIRST (1),
# RUN_TIMEOUT seconds per fi_pingpong (120), OUT (a new temporary
# directory). About 8 minutes at the defaults on two cores: 100
# fi_pingpong pairs a round, each about a second to start, and that 64
# KiB cell's 2.5 minutes. Needs fi_pingpong and fi_info (libfabric-bin),
# libfabric-dev, gcc, make, Go, taskset, ss (iproute2). Run it alone on a
# quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=${ROUNDS:-3}
pairs=${PAIRS:-"dgram rdm msg rxm"}
sizes=${SIZES:-"64 256 1024 4096 16384 65536"}
dgram_sizes=${DGRAM_SIZES:-$sizes}
rdm_sizes=${RDM_SIZES:-$sizes}
msg_sizes=${MSG_SIZES:-$sizes}
rxm_sizes=${RXM_SIZES:-$sizes}
fi_n=${FI_N:-10000}
fi_n_large=${FI_N_LARGE:-1000}
subtract_first=${SUBTRACT_FIRST:-1}
run_timeout=${RUN_TIMEOUT:-120}
out=${OUT:-$(mktemp -d /tmp/fi-pingpong.XXXXXX)}
mkdir -p "$out"
export FI_UDP_IFACE=lo FI_TCP_IFACE=lo

die() { echo "fi-pingpong.sh: $*" >&2; exit 1; }
log() { echo "$*" >&2; }
for c in fi_pingpong fi_info taskset gcc make go ss timeout; do
  command -v "$c" >/dev/null || die "$c is not installed (Debian: apt-get install libfabric-bin libfabric-dev gcc make iproute2; Go from go.dev)"
done
for c in 0 1; do taskset -c "$c" true 2>/dev/null || die "cannot run on CPU $c: the table needs two CPUs"; done
for p in $pairs; do
  case $p in dgram | rdm | msg | rxm) ;; *) die "PAIRS: unknown group '$p' (dgram, rdm, msg, rxm)" ;; esac
done
[[ " $pairs " == *" msg "* || " $pairs " == *" rxm "* ]] && { fi_info -p tcp -t FI_EP_MSG >/dev/null 2>&1 ||
  die "libfabric's tcp provider is not available here (fi_info -p tcp -t FI_EP_MSG): needed for the msg and rxm pairs"; }

# The provider, built from this tree, is loaded from a copy outside $OUT
# (which may be a results directory to commit), removed at the end.
provdir=$(mktemp -d /tmp/udiwarp-prov.XXXXXX)
trap "rm -rf '$provdir'" EXIT # expanded now: a function's local cannot stand in for it
log "== building the provider into $provdir"
make -s -C libfabric >/dev/null
cp libfabric/libudiwarp-fi.so libfabric/libudiwarp_fi_engine.so "$provdir/"
export FI_PROVIDER_PATH="$provdir"

# provenv PROVIDER EP: the environment a provider's runs need. udiwarp's
# native RDM endpoint: the utility providers hidden, or "udiwarp;ofi_rxd"
# comes first; "udiwarp;ofi_rxm": ofi_rxm left visible.
provenv() {
  case "$1 $2" in
    "udiwarp rdm") echo "FI_PROVIDER=^ofi_rxd,ofi_rxm,ofi_mrail" ;;
    "udiwarp;ofi_rxm rdm") echo "FI_PROVIDER=^ofi_rxd,ofi_mrail" ;;
    *) echo "FI_PROVIDER_PATH=$FI_PROVIDER_PATH" ;; # a harmless placeholder
  esac
}
# label PROVIDER EP: the series' name in runs.csv and the plot.
label() {
  case "$1 $2" in
    "udiwarp rdm") echo "udiwarp -e rdm (native RD)" ;;
    *) echo "$1 -e $2" ;;
  esac
}
# maxmsg PROVIDER EP: the endpoint's max_msg_size, as fi_info reports it.
declare -A maxmsg_of
maxmsg() {
  local k="$1 $2" dom=()
  [[ $1 == udiwarp* ]] && dom=(-d lo)
  if [ -z "${maxmsg_of[$k]:-}" ]; then
    maxmsg_of[$k]=$(env "$(provenv "$1" "$2")" fi_info -p "$1" "${dom[@]}" -t "FI_EP_${2^^}" -v 2>/dev/null |
      awk '/max_msg_size:/ {print $2; exit}')
    [ -n "${maxmsg_of[$k]}" ] || die "fi_info finds no $2 endpoint of provider '$1' (FI_PROVIDER_PATH=$FI_PROVIDER_PATH)"
  fi
  echo "${maxmsg_of[$k]}"
}

port=47592
# pingpong PROVIDER EP SIZE ITERATIONS BASE: one fi_pingpong pair, the
# server's and client's outputs in BASE.server and BASE.client; prints
# the client's usec/xfer (empty when it failed).
pingpong() {
  local prov=$1 ep=$2 size=$3 n=$4 base=$5 dom=() env
  [[ $prov == udiwarp* ]] && dom=(-d lo)
  env=$(provenv "$prov" "$ep")
  port=$((port + 1))
  local cmd=(fi_pingpong -p "$prov" "${dom[@]}" -e "$ep" -I "$n" -S "$size")
  env "$env" taskset -c 1 timeout --foreground "$run_timeout" "${cmd[@]}" -B "$port" >"$base.server" 2>&1 &
  local spid=$!
  for _ in $(seq 100); do ss -ltn "sport = :$port" | grep -q LISTEN && break; sleep 0.05; done
  env "$env" taskset -c 0 timeout --foreground "$run_timeout" "${cmd[@]}" -P "$port" 127.0.0.1 >"$base.client" 2>&1 || true
  wait "$spid" || true
  awk -v s="$size" 'NR > 1 && ($1 == s || $1 == s/1024 "k") {print $7}' "$base.client" | tail -1
}

# run GROUP PROVIDER EP SIZE ROUND: a cell's runs; appends a data line
# "group provider ep size round µs raw-µs first-ms" (µs NaN: failed;
# "skip": above the endpoint's max_msg_size) and, when it ran, a row to
# runs.csv. fi_pingpong times everything from its first exchange, which
# over ofi_rxm opens the connection (about 0.2 s here) and over ofi_rxd
# shakes hands (30-50 ms): spread over the iterations, that is 3-20 µs of
# a 64-byte mean. So a second run of one iteration measures that first
# exchange, and the cell's figure is the rest: (N * mean - mean of the
# one-iteration run) / (N - 1), µs a transfer once the exchange runs
# (SUBTRACT_FIRST=0: fi_pingpong's own mean, and no second run).
run() {
  local group=$1 prov=$2 ep=$3 size=$4 r=$5 base n raw one=NaN us first=""
  if awk -v s="$size" -v m="$(maxmsg "$prov" "$ep")" 'BEGIN {exit !(s > m)}'; then
    echo "$group $prov $ep $size $r skip" >>"$out/data"
    return
  fi
  n=$fi_n
  [ "$size" -gt 4096 ] && n=$fi_n_large
  base="$out/$(echo "$prov" | tr ';' '+')-$ep-$size-$r"
  raw=$(pingpong "$prov" "$ep" "$size" "$n" "$base")
  if [ -z "$raw" ]; then
    log "   fi_pingpong -p '$prov' -e $ep -S $size failed; its output:"; sed 's/^/   | /' "$base.client" >&2
    raw=NaN
  fi
  us=$raw
  if [ "$subtract_first" = 1 ] && [ "$raw" != NaN ]; then
    one=$(pingpong "$prov" "$ep" "$size" 1 "$base-I1")
    if [ -z "$one" ]; then
      log "   fi_pingpong -p '$prov' -e $ep -S $size -I 1 failed; its output:"; sed 's/^/   | /' "$base-I1.client" >&2
      one=NaN us=NaN
    else
      us=$(awk -v n="$n" -v m="$raw" -v o="$one" 'BEGIN {printf "%.3f", (n * m - o) / (n - 1)}')
      first=$(awk -v o="$one" 'BEGIN {printf "%.3f", 2 * o / 1000}')
    fi
  fi
  echo "$group $prov $ep $size $r $us $raw ${first:-NaN}" >>"$out/data"
  local dom=""
  [[ $prov == udiwarp* ]] && dom="-d lo "
  printf 'fi-pingpong,"%s",%s,%s,%s,us,%s,%s,"%s",%s,%s,"%s"\n' "$(label "$prov" "$ep")" "$size" "$r" "$us" \
    "$raw" "$first" "$prov" "$ep" "$n" "$(provenv "$prov" "$ep") taskset -c 0 fi_pingpong -p $prov ${dom}-e $ep -I $n -S $size -P PORT 127.0.0.1" >>"$out/runs.csv"
}

# The groups: the baseline first, then what it is compared with.
declare -A members=(
  [dgram]="udp:dgram udiwarp:dgram"
  [rdm]="udp;ofi_rxd:rdm udiwarp:rdm udiwarp;ofi_rxd:rdm"
  [msg]="tcp:msg udiwarp:msg"
  [rxm]="tcp;ofi_rxm:rdm udiwarp;ofi_rxm:rdm"
)
declare -A group_sizes=([dgram]=$dgram_sizes [rdm]=$rdm_sizes [msg]=$msg_sizes [rxm]=$rxm_sizes)
for g in $pairs; do for m in ${members[$g]}; do maxmsg "${m%:*}" "${m#*:}" >/dev/null; done; done

: >"$out/data"
echo "figure,series,x,round,value,unit,fi_pingpong_mean_us,first_exchange_ms,provider,endpoint,iterations,command" >"$out/runs.csv"
start=$(date -u '+%Y-%m-%d %H:%M UTC')
t0=$SECONDS
for r in $(seq "$rounds"); do
  log "== round $r of $rounds ($((SECONDS - t0)) s so far)"
  for g in $pairs; do
    list=(${members[$g]})
    if [ $((r % 2)) = 0 ]; then # reversed every other round
      for ((i = 0, j = ${#list[@]} - 1; i < j; i++, j--)); do m=${list[i]}; list[i]=${list[j]}; list[j]=$m; done
    fi
    for size in ${group_sizes[$g]}; do
      for m in "${list[@]}"; do run "$g" "${m%:*}" "${m#*:}" "$size" "$r"; done
    done
  done
done
log "== $((SECONDS - t0)) s of runs"

{
  if [ "$subtract_first" = 1 ]; then
    what="µs a transfer: each run's (N × fi_pingpong's mean − a one-iteration run's mean) / (N − 1), its first exchange (a connection, a handshake) left out; fi_pingpong's own mean beside it, and the one-iteration run's round trip (first exchange)"
  else
    what="µs a transfer: fi_pingpong's usec/xfer, a mean over the iterations that includes the first exchange"
  fi
  echo "fi_pingpong, two processes pinned (server CPU 1, client CPU 0), loopback, busy-polled CQs, one way; $what; $rounds rounds from $start, each pair's order reversed every other round; -I $fi_n up to 4 KiB, -I $fi_n_large above; $(uname -r), $(fi_info --version | head -1), $(go version | cut -d' ' -f3). Each figure is the median over the rounds; — where the size is above the endpoint's max_msg_size. \`experiments/fi-pingpong.sh\` (ROUNDS=$rounds)."
  echo
  echo "| provider | endpoint | bytes | µs a transfer | ratio to its baseline | fi_pingpong's mean µs | first exchange ms | runs (µs a transfer) |"
  echo "|---|---|---:|---:|---:|---:|---:|---|"
  awk '
    function median(list,   n, a, i, j, t) {
      n = split(list, a, " ")
      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    function fmt(v, d) { return v == "" ? "—" : sprintf("%." d "f", v) }
    # A line: group provider ep size round µs raw first-ms ("skip": not run).
    { k = $1 SUBSEP $2 SUBSEP $3 SUBSEP $4
      if (!(k in seen)) { seen[k] = 1; order[++n] = k }
      if ($6 == "skip") { skip[k] = 1; next }
      if ($6 == "NaN") { failed[k]++; next }
      runs[k] = runs[k] " " $6; raw[k] = raw[k] " " $7; if ($8 != "NaN") first[k] = first[k] " " $8 }
    END {
      base["dgram"] = "udp"; base["rdm"] = "udp;ofi_rxd"; base["msg"] = "tcp"; base["rxm"] = "tcp;ofi_rxm"
      for (i = 1; i <= n; i++) {
        split(order[i], f, SUBSEP)
        b = base[f[1]]
        name = (f[2] == "udiwarp" && f[3] == "rdm") ? "udiwarp (native RD)" : f[2]
        if (order[i] in skip) { printf "| %s | %s | %s | — | above its max_msg_size | | | |\n", name, f[3], f[4]; continue }
        note = (order[i] in failed) ? sprintf(" (%d failed)", failed[order[i]]) : ""
        if (!(order[i] in runs)) { printf "| %s | %s | %s | — | every run failed | | | |\n", name, f[3], f[4]; continue }
        m = median(runs[order[i]])
        bk = f[1] SUBSEP b SUBSEP f[3] SUBSEP f[4]
        if (f[2] == b) ratio = "1.00x (baseline)"
        else if (bk in skip || !(bk in runs)) ratio = "— (no baseline)"
        else { bm = median(runs[bk]); ratio = (bm > 0) ? sprintf("%.2fx of %s", m / bm, b) : "—" }
        fm = (order[i] in first) ? median(first[order[i]]) : ""
        printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", name, f[3], f[4], fmt(m, 2), ratio, fmt(median(raw[order[i]]), 2), fmt(fm, 1), runs[order[i]] note
      }
    }' "$out/data"
} | tee "$out/table.md"

log "== plotting into $out"
go run ./experiments -plot "$out" >&2 || log "   the plot failed; runs.csv is in $out (go run ./experiments -plot $out)"
log "== raw outputs in $out"
