#!/usr/bin/env bash
# fi_pingpong over udiwarp's libfabric provider beside libfabric's own
# providers, in one sitting (issue 34's first figure): two processes, the
# server pinned to CPU 1 and the client to CPU 0, loopback, busy-polled
# CQs (fi_pingpong's own), one-way µs per transfer (fi_pingpong's
# usec/xfer: elapsed / iterations / 2, a mean: it prints nothing else).
# Each against its baseline in the same round, the order reversed every
# other round; four groups (PAIRS):
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
# Figures per cell: the median over the rounds of each run's mean, the
# ratio of those medians to the baseline's, and every run's mean.
#
# Output: a markdown table on stdout (also $OUT/table.md), ready for
# BENCHMARKS.md; progress on stderr; in $OUT: runs.csv (a row per run:
# figure, series, x = bytes, round, value = one-way µs, unit, provider,
# endpoint, iterations, the client's command), fi-pingpong.png and .svg
# (`go run ./experiments -plot $OUT`: one-way µs against message size, a
# line per provider and endpoint through the medians, min-max bars), and
# every run's raw output.
#
# Environment: ROUNDS (5), PAIRS ("dgram rdm msg rxm"), SIZES ("64 256
# 1024 4096 16384 65536"; DGRAM_SIZES, RDM_SIZES, MSG_SIZES, RXM_SIZES
# each default to it), FI_N iterations per run up to 4 KiB (5000),
# FI_N_LARGE above 4 KiB (500: udiwarp's native RDM endpoint took 25 ms a
# 64 KiB transfer on 2026-11-27), RUN_TIMEOUT seconds per fi_pingpong
# (120), OUT (a new temporary directory). About 8 minutes at the
# defaults on two cores, 50 runs a round of which a second each is
# fi_pingpong's start. Needs fi_pingpong and fi_info (libfabric-bin),
# libfabric-dev, gcc, make, Go, taskset, ss (iproute2). Run it alone on a
# quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=${ROUNDS:-5}
pairs=${PAIRS:-"dgram rdm msg rxm"}
sizes=${SIZES:-"64 256 1024 4096 16384 65536"}
dgram_sizes=${DGRAM_SIZES:-$sizes}
rdm_sizes=${RDM_SIZES:-$sizes}
msg_sizes=${MSG_SIZES:-$sizes}
rxm_sizes=${RXM_SIZES:-$sizes}
fi_n=${FI_N:-5000}
fi_n_large=${FI_N_LARGE:-500}
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

log "== building the provider into $out/prov"
make -s -C libfabric >/dev/null
mkdir -p "$out/prov"
cp libfabric/libudiwarp-fi.so libfabric/libudiwarp_fi_engine.so "$out/prov/"
export FI_PROVIDER_PATH="$out/prov"

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
# run GROUP PROVIDER EP SIZE ROUND: one fi_pingpong pair; appends a data
# line "group provider ep size round mean" (mean NaN: failed; skip: above
# the endpoint's max_msg_size) and, when it ran, a row to runs.csv.
run() {
  local group=$1 prov=$2 ep=$3 size=$4 r=$5 dom=() base mean n env max
  [[ $prov == udiwarp* ]] && dom=(-d lo)
  env=$(provenv "$prov" "$ep")
  max=$(maxmsg "$prov" "$ep")
  if awk -v s="$size" -v m="$max" 'BEGIN {exit !(s > m)}'; then
    echo "$group $prov $ep $size $r skip" >>"$out/data"
    return
  fi
  n=$fi_n
  [ "$size" -gt 4096 ] && n=$fi_n_large
  base="$out/$(echo "$prov" | tr ';' '+')-$ep-$size-$r"
  port=$((port + 1))
  local cmd=(fi_pingpong -p "$prov" "${dom[@]}" -e "$ep" -I "$n" -S "$size")
  env "$env" taskset -c 1 timeout --foreground "$run_timeout" "${cmd[@]}" -B "$port" >"$base.server" 2>&1 &
  local spid=$!
  for _ in $(seq 100); do ss -ltn "sport = :$port" | grep -q LISTEN && break; sleep 0.05; done
  env "$env" taskset -c 0 timeout --foreground "$run_timeout" "${cmd[@]}" -P "$port" 127.0.0.1 >"$base.client" 2>&1 || true
  wait "$spid" || true
  mean=$(awk -v s="$size" 'NR > 1 && ($1 == s || $1 == s/1024 "k") {print $7}' "$base.client" | tail -1)
  if [ -z "$mean" ]; then
    log "   fi_pingpong -p '$prov' -e $ep -S $size failed; its output:"; sed 's/^/   | /' "$base.client" >&2
    mean=NaN
  fi
  echo "$group $prov $ep $size $r $mean" >>"$out/data"
  printf 'fi-pingpong,"%s",%s,%s,%s,us,"%s",%s,%s,"%s"\n' "$(label "$prov" "$ep")" "$size" "$r" "$mean" \
    "$prov" "$ep" "$n" "$env taskset -c 0 ${cmd[*]} -P PORT 127.0.0.1" >>"$out/runs.csv"
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
echo "figure,series,x,round,value,unit,provider,endpoint,iterations,command" >"$out/runs.csv"
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
  echo "fi_pingpong, two processes pinned (server CPU 1, client CPU 0), loopback, busy-polled CQs, one-way µs per transfer (usec/xfer, a mean); $rounds rounds from $start, each pair's order reversed every other round; -I $fi_n up to 4 KiB, -I $fi_n_large above; $(uname -r), $(fi_info --version | head -1), $(go version | cut -d' ' -f3). Mean: the median over the rounds of each run's mean; — where the provider's max_msg_size is below the size. \`experiments/fi-pingpong.sh\` (ROUNDS=$rounds)."
  echo
  echo "| provider | endpoint | bytes | mean µs | ratio to its baseline | run means |"
  echo "|---|---|---:|---:|---:|---|"
  awk '
    function median(list,   n, a, i, j, t) {
      n = split(list, a, " ")
      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    # A line: group provider ep size round mean ("skip": not run).
    { k = $1 SUBSEP $2 SUBSEP $3 SUBSEP $4
      if (!(k in seen)) { seen[k] = 1; order[++n] = k }
      if ($6 == "skip") skip[k] = 1; else runs[k] = runs[k] " " $6 }
    END {
      base["dgram"] = "udp"; base["rdm"] = "udp;ofi_rxd"; base["msg"] = "tcp"; base["rxm"] = "tcp;ofi_rxm"
      for (i = 1; i <= n; i++) {
        split(order[i], f, SUBSEP)
        b = base[f[1]]
        name = (f[2] == "udiwarp" && f[3] == "rdm") ? "udiwarp (native RD)" : f[2]
        if (order[i] in skip) { printf "| %s | %s | %s | — | above its max_msg_size | |\n", name, f[3], f[4]; continue }
        m = median(runs[order[i]])
        bk = f[1] SUBSEP b SUBSEP f[3] SUBSEP f[4]
        if (f[2] == b) ratio = "1.00x (baseline)"
        else if (bk in skip || !(bk in runs)) ratio = "— (no baseline)"
        else { bm = median(runs[bk]); ratio = (bm > 0) ? sprintf("%.2fx of %s", m / bm, b) : "—" }
        printf "| %s | %s | %s | %.2f | %s | %s |\n", name, f[3], f[4], m, ratio, runs[order[i]]
      }
    }' "$out/data"
} | tee "$out/table.md"

log "== plotting into $out"
go run ./experiments -plot "$out" >&2 || log "   the plot failed; runs.csv is in $out (go run ./experiments -plot $out)"
log "== raw outputs in $out"
