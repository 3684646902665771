#!/usr/bin/env bash
# The two-process latency table (issue 14, "What it must show"): `udperf
# server` on CPU 1 and `udperf client` on CPU 0 (taskset), busy polling,
# ping-pong, one-way = half the round trip, for raw-udp, ud-send, ud-wr,
# rd-send, raw-tcp, rc-send and rc-write at 64 B and 1 KiB; beside
# libfabric's fi_pingpong pinned the same way, with the providers
#   udp          -e dgram  (FI_EP_DGRAM)
#   udp;ofi_rxd  -e rdm    (FI_EP_RDM: libfabric's reliable datagram)
#   tcp          -e msg    (FI_EP_MSG)
# and FI_UDP_IFACE=lo FI_TCP_IFACE=lo FI_SOCKETS_IFACE=lo, which keep
# libfabric on loopback (without them it binds eth0's address). All in
# one sitting: every round runs every (size, mode) once, udperf and
# fi_pingpong interleaved, the order reversed every other round.
#
# Figures per cell, over the rounds:
#   mean µs    the median of the runs' means (udperf's t_avg_us;
#              fi_pingpong's usec/xfer, elapsed / iterations / 2, its only
#              figure, a mean, from busy-polled CQs)
#   median µs  the median of the runs' medians (udperf's t_typical_us);
#              fi_pingpong prints none, so "—"
#   ratios     to udperf raw-udp at the same size, mean to mean and
#              median to median
#   run means  every round's mean, to show the spread
# Output: a markdown table on stdout, ready for BENCHMARKS.md; progress on
# stderr; every run's raw output under $OUT (kept; its path is printed).
#
# Environment: ROUNDS (5), N udperf iterations (20000), W udperf warm-up
# (2000), FI_N fi_pingpong iterations (20000), SIZES ("64 1024"), MODES
# (the seven above), PORT udperf's control port (18599), OUT (a new
# temporary directory), FI=0 to leave fi_pingpong out.
# Needs: Linux with 2 CPUs or more, Go, taskset (util-linux), ss
# (iproute2), jq and fi_pingpong (libfabric-bin); jq and libfabric-bin are
# installed with apt-get when missing and run as root.
# Run it alone on a quiet machine: every other process skews it.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=${ROUNDS:-5}
n=${N:-20000}
w=${W:-2000}
fi_n=${FI_N:-20000}
sizes=${SIZES:-"64 1024"}
modes=${MODES:-"raw-udp ud-send ud-wr rd-send raw-tcp rc-send rc-write"}
port=${PORT:-18599}
use_fi=${FI:-1}
export FI_UDP_IFACE=lo FI_TCP_IFACE=lo FI_SOCKETS_IFACE=lo

die() { echo "twoproc.sh: $*" >&2; exit 1; }
log() { echo "$*" >&2; }

# need CMD PACKAGE WHY: install PACKAGE with apt-get if CMD is missing.
need() {
  command -v "$1" >/dev/null 2>&1 && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "== installing $2: $3"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get install -y --no-install-recommends "$2" >/dev/null 2>&1 ||
      { apt-get update >/dev/null 2>&1 && apt-get install -y --no-install-recommends "$2" >/dev/null 2>&1; }; } ||
      die "could not install $2 (apt-get install $2), needed for $3"
    command -v "$1" >/dev/null 2>&1 || die "$2 is installed but $1 is not on PATH"
  else
    die "$1 is missing (Debian: apt-get install $2, as root), needed for $3"
  fi
}
need taskset util-linux "pinning server and client to different CPUs"
need ss iproute2 "seeing that the servers listen"
need jq jq "reading udperf's JSON"
[ "$use_fi" = 1 ] && need fi_pingpong libfabric-bin "libfabric's ping-pong beside udperf"
for c in 0 1; do
  taskset -c "$c" true 2>/dev/null || die "cannot run on CPU $c: the table needs two CPUs (server on 1, client on 0)"
done

out=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/twoproc.XXXXXX")}
mkdir -p "$out"
bin="$out/udperf"
log "== building udperf; raw output in $out"
go build -o "$bin" ./cmd/udperf

srv=
cleanup() {
  if [ -n "$srv" ]; then kill "$srv" 2>/dev/null || true; wait "$srv" 2>/dev/null || true; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# listening [PORT]: is anything listening on TCP port PORT ($port)?
listening() { [ -n "$(ss -Hltn "sport = :${1:-$port}" 2>/dev/null)" ]; }
fi_port=47592 # fi_pingpong's control port (-B, -P)

# udperf_run MODE SIZE ROUND: a fresh server (no -once: it is killed when
# the client is done), the client, one line of data.
udperf_run() {
  local mode=$1 size=$2 r=$3 base k mean median
  base="$out/udperf-$mode-$size-r$r"
  listening && die "something already listens on port $port (set PORT)"
  taskset -c 1 "$bin" server -addr "127.0.0.1:$port" >"$base.server" 2>&1 &
  srv=$!
  for ((k = 0; k < 200; k++)); do # 10 s at most
    listening && break
    kill -0 "$srv" 2>/dev/null || break
    sleep 0.05
  done
  if ! listening; then
    log "   udperf server did not start; its output:"; sed 's/^/   | /' "$base.server" >&2
    cleanup; srv=; return 1
  fi
  if taskset -c 0 timeout --foreground 600 "$bin" client -addr "127.0.0.1:$port" -mode "$mode" -test lat -s "$size" \
    -n "$n" -w "$w" -poll busy -json >"$base.json" 2>"$base.err"; then
    read -r mean median < <(jq -r '.results[0] | "\(.t_avg_us) \(.t_typical_us)"' "$base.json") || true
  fi
  cleanup; srv=
  case "${mean:-}${median:-}" in
  "" | *null*)
    log "   udperf client $mode $size failed; its stderr:"; sed 's/^/   | /' "$base.err" >&2
    return 1 ;;
  esac
  echo "udperf $mode $size $r $mean $median" >>"$out/data"
}

# fi_run PROVIDER EP SIZE ROUND: fi_pingpong server on CPU 1, client on 0.
fi_run() {
  local prov=$1 ep=$2 size=$3 r=$4 base k mean fsrv
  base="$out/fi-${prov//[;]/+}-$size-r$r"
  listening "$fi_port" && die "something already listens on fi_pingpong's port $fi_port"
  taskset -c 1 timeout --foreground 600 fi_pingpong -p "$prov" -e "$ep" -I "$fi_n" -S "$size" >"$base.server" 2>&1 &
  fsrv=$!
  srv=$fsrv # for cleanup on an interrupt
  for ((k = 0; k < 200; k++)); do # its control port; 10 s at most
    listening "$fi_port" && break
    kill -0 "$fsrv" 2>/dev/null || break
    sleep 0.05
  done
  taskset -c 0 timeout --foreground 600 fi_pingpong -p "$prov" -e "$ep" -I "$fi_n" -S "$size" 127.0.0.1 >"$base.client" 2>&1 || true
  for ((k = 0; k < 100; k++)); do # the server ends with its client; 5 s at most
    kill -0 "$fsrv" 2>/dev/null || break
    sleep 0.05
  done
  srv=$fsrv
  cleanup; srv=
  # The column headed usec/xfer of the line after the header.
  mean=$(awk '{ for (i = 1; i <= NF; i++) if ($i == "usec/xfer") c = i }
    c && !/usec\/xfer/ && NF >= c { print $c; exit }' "$base.client")
  if [ -z "$mean" ]; then
    log "   fi_pingpong -p '$prov' -e $ep -S $size failed; its output:"; sed 's/^/   | /' "$base.client" >&2
    return 1
  fi
  echo "fi_pingpong $prov/$ep $size $r $mean -" >>"$out/data"
}

# One round's runs, udperf's and fi_pingpong's interleaved.
runs=()
for s in $sizes; do
  for m in $modes; do
    runs+=("udperf $m $s")
    if [ "$use_fi" = 1 ]; then
      case $m in
      raw-udp)
        # libfabric's udp provider carries one datagram of at most its
        # MTU (1472 B on Ethernet-sized loopback settings): no dgram
        # ping-pong above it.
        [ "$s" -le 1472 ] && runs+=("fi udp dgram $s") ;;
      rd-send) runs+=("fi udp;ofi_rxd rdm $s") ;;
      raw-tcp) runs+=("fi tcp msg $s") ;;
      esac
    fi
  done
done

: >"$out/data"
failed=0
start=$(date -u +%Y-%m-%dT%H:%MZ)
for ((r = 1; r <= rounds; r++)); do
  order=("${runs[@]}")
  if ((r % 2 == 0)); then # every other round backwards
    order=()
    for ((i = ${#runs[@]} - 1; i >= 0; i--)); do order+=("${runs[i]}"); done
  fi
  for run in "${order[@]}"; do
    read -r tool a b c <<<"$run"
    log "== round $r/$rounds: $run"
    if [ "$tool" = udperf ]; then
      udperf_run "$a" "$b" "$r" || failed=$((failed + 1))
    else
      fi_run "$a" "$b" "$c" "$r" || failed=$((failed + 1))
    fi
  done
done

# The table: per (tool, mode, size) in the order of the runs.
{
  echo "Two processes pinned (server/passive side on CPU 1, client on CPU 0), loopback, busy polling, one-way µs (half the round trip); $rounds rounds from $start, udperf and fi_pingpong alternating; udperf -n $n -w $w, fi_pingpong -I $fi_n; $(uname -r), $(go version | cut -d' ' -f3). Mean: the median over the rounds of each run's mean; median: the median of each run's median (fi_pingpong prints only its mean, usec/xfer). \`experiments/twoproc.sh\` (ROUNDS=$rounds)."
  echo
  echo "| mode / provider | bytes | mean µs | median µs | mean ratio to raw-udp | median ratio to raw-udp | run means |"
  echo "|---|---|---|---|---|---|---|"
  awk -v sizes="$sizes" -v runs="$(printf '%s\n' "${runs[@]}")" '
    function med(list,   a, k, i, j, t) {
      k = split(list, a, " ")
      for (i = 2; i <= k; i++) for (j = i; j > 1 && a[j-1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
      if (k == 0) return ""
      return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
    }
    function f(x) { return x == "" ? "—" : sprintf("%.2f", x) }
    function ratio(x, y) { return (x == "" || y == "" || y == 0) ? "—" : sprintf("%.2f", x / y) }
    { key = $1 " " $2 " " $3; means[key] = means[key] " " $5; if ($6 != "-") meds[key] = meds[key] " " $6 }
    END {
      nr = split(runs, rl, "\n")
      for (i = 1; i <= nr; i++) {
        split(rl[i], p, " ")
        if (p[1] == "udperf") { key = "udperf " p[2] " " p[3]; name = p[2]; size = p[3] }
        else { key = "fi_pingpong " p[2] "/" p[3] " " p[4]; name = "fi_pingpong " p[2] " (" p[3] ")"; size = p[4] }
        base = "udperf raw-udp " size
        m = med(means[key]); d = med(meds[key])
        bm = med(means[base]); bd = med(meds[base])
        k = split(means[key], rv, " "); rm = ""
        for (j = 1; j <= k; j++) rm = rm (j > 1 ? ", " : "") sprintf("%.2f", rv[j])
        printf "| %s | %s | %s | %s | %s | %s | %s |\n", name, size, f(m), f(d), ratio(m, bm), ratio(d, bd), rm == "" ? "failed" : rm
      }
    }' "$out/data"
}
log "== raw output in $out"
if [ "$failed" -gt 0 ]; then
  log "twoproc.sh: $failed run(s) failed; their cells use the rounds that worked (see above)"
  exit 1
fi
