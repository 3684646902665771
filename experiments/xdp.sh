#!/usr/bin/env bash
# AF_XDP beside kernel sockets (issue 35, part 3): `udperf server` in
# network namespace A pinned to CPU 0 (taskset -c 0), `udperf client` in
# namespace B pinned to CPU 1, joined by a veth pair (MTU 1500), busy
# polling. Every round runs every case once, the order reversed every
# other round (ROUNDS, default 5):
#
#   lat, 64 B:  raw-udp (kernel sockets), raw-xdp (plain UDP on AF_XDP,
#               no stack: that path's floor), ud-send on udp and on xdp,
#               rd-send on xdp, ud-wr on xdp
#   bw, 1400 B: ud-send, ud-wr and rd-write, each on udp and on xdp
#               (ud-wr and rd-write with -mtu 1400: an AF_XDP link takes
#               no IP fragments, so every datagram fits the veth's MTU)
#
# "on xdp" is `udperf client -llp xdp`: the client's queue pairs run on
# AF_XDP, and the server, started without -llp, follows the request; the
# script checks that both ends' JSON says xdp (link, server_link).
#
# Usage: experiments/xdp.sh [RESULTS_DIR]   (as root; default
# experiments/results/DATE-xdp). RESULTS_DIR gets every run's JSON
# (rN-TEST-MODE-LLP.json, with its stderr beside it), the server's log,
# data (a line per run: test mode llp round median_us|gbps mean_us) and
# summary.md: the median over the rounds of each case (t_typical_us for
# lat, bw_avg_gbps for bw), and the ratios, each the median of the
# per-round ratios (the two runs of a round are back to back, as udperf
# compare does): ud-send/xdp over raw-udp and over raw-xdp, rd-send/xdp
# over raw-udp, ud-send/xdp over ud-send/udp, and xdp's goodput over
# udp's for ud-send, ud-wr and rd-write. summary.md is printed at the end.
#
# Environment: ROUNDS (5), N lat round trips (20000), W warm-up (2000),
# D a bw run's seconds (1), PORT the server's control port (18600).
#
# Transmit checksum offload is turned off on both veth ends (a veth hands
# the kernel's datagrams over with their UDP checksum unfilled, which
# llp's AF_XDP reader drops): with `ethtool -K IF tx off` where ethtool
# is installed, else with experiments/txoff, a few lines of Go doing the
# same ioctl (ETHTOOL_STXCSUM) inside the namespace.
#
# Needs: root (namespaces, AF_XDP, the XDP program), Linux with AF_XDP,
# 2 CPUs, Go, iproute2 (ip, ss), taskset (util-linux), jq. The
# namespaces, the veth and the server are removed on exit, however the
# script ends. Run it alone on a quiet machine: every other process skews
# it.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=${ROUNDS:-5}
n=${N:-20000}
w=${W:-2000}
dur=${D:-1}
port=${PORT:-18600}
out=${1:-experiments/results/$(date -u +%Y-%m-%d)-xdp}

die() { echo "xdp.sh: $*" >&2; exit 1; }
log() { echo "$*" >&2; }

[ "$(id -u)" = 0 ] || die "needs root: network namespaces, AF_XDP sockets and XDP programs"
for c in ip ss taskset jq go; do
  command -v "$c" >/dev/null 2>&1 || die "$c is missing"
done
for c in 0 1; do
  taskset -c "$c" true 2>/dev/null || die "cannot run on CPU $c: server on 0, client on 1"
done
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || die "ROUNDS=$rounds: want a positive number"

mkdir -p "$out"
out=$(cd "$out" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/xdp-sh.XXXXXX")
tag=$$
nsA=udperf-xdp-a-$tag
nsB=udperf-xdp-b-$tag
va=xa$tag
vb=xb$tag
ipA=10.214.0.1
ipB=10.214.0.2
srv=

cleanup() {
  if [ -n "$srv" ]; then kill "$srv" 2>/dev/null || true; wait "$srv" 2>/dev/null || true; fi
  ip netns del "$nsA" 2>/dev/null || true # takes the veth pair with it
  ip netns del "$nsB" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "== building udperf and txoff; results in $out"
go build -o "$tmp/udperf" ./cmd/udperf
go build -o "$tmp/txoff" ./experiments/txoff
bin=$tmp/udperf

log "== namespaces $nsA ($ipA on $va) and $nsB ($ipB on $vb), a veth pair of MTU 1500"
ip netns add "$nsA"
ip netns add "$nsB"
ip link add "$va" netns "$nsA" mtu 1500 type veth peer name "$vb" netns "$nsB" mtu 1500
ip -n "$nsA" addr add "$ipA/24" dev "$va"
ip -n "$nsB" addr add "$ipB/24" dev "$vb"
for x in "$nsA $va" "$nsB $vb"; do
  read -r ns dev <<<"$x"
  ip -n "$ns" link set "$dev" up
  ip -n "$ns" link set lo up
  if command -v ethtool >/dev/null 2>&1; then
    ip netns exec "$ns" ethtool -K "$dev" tx off >/dev/null
  else
    ip netns exec "$ns" "$tmp/txoff" "$dev"
  fi
done

log "== udperf server in $nsA on CPU 0"
ip netns exec "$nsA" taskset -c 0 "$bin" server -addr "$ipA:$port" >"$out/server.log" 2>&1 &
srv=$!
listening() { [ -n "$(ip netns exec "$nsA" ss -Hltn "sport = :$port" 2>/dev/null)" ]; }
for ((k = 0; k < 200; k++)); do # 10 s at most
  listening && break
  kill -0 "$srv" 2>/dev/null || break
  sleep 0.05
done
listening || { sed 's/^/   | /' "$out/server.log" >&2; die "udperf server did not start"; }

client() { ip netns exec "$nsB" taskset -c 1 timeout --foreground 600 "$bin" client -addr "$ipA:$port" -poll busy -json "$@"; }

# AF_XDP at all? One short raw-xdp ping-pong says, in one line, why not.
if ! client -mode raw-xdp -test lat -s 64 -n 10 -w 0 >/dev/null 2>"$tmp/probe.err"; then
  sed 's/^/   | /' "$tmp/probe.err" >&2
  die "AF_XDP does not run here (above: why)"
fi

# The cases: test mode llp size [flags...].
cases=(
  "lat raw-udp udp 64"
  "lat raw-xdp xdp 64"
  "lat ud-send udp 64"
  "lat ud-send xdp 64"
  "lat rd-send xdp 64"
  "lat ud-wr xdp 64"
  "bw ud-send udp 1400"
  "bw ud-send xdp 1400"
  "bw ud-wr udp 1400 -mtu 1400"
  "bw ud-wr xdp 1400 -mtu 1400"
  "bw rd-write udp 1400 -mtu 1400"
  "bw rd-write xdp 1400 -mtu 1400"
)

# run ROUND TEST MODE LLP SIZE [FLAGS...]: one client run, one line of data.
run() {
  local r=$1 test=$2 mode=$3 llp=$4 size=$5
  shift 5
  local base="$out/r$r-$test-$mode-$llp" args=(-mode "$mode" -test "$test" -s "$size" "$@") fig avg link slink
  [ "$llp" = xdp ] && [ "$mode" != raw-xdp ] && args+=(-llp xdp)
  if [ "$test" = lat ]; then args+=(-n "$n" -w "$w"); else args+=(-D "$dur"); fi
  if ! client "${args[@]}" >"$base.json" 2>"$base.err"; then
    log "   udperf client ${args[*]} failed; its stderr:"; sed 's/^/   | /' "$base.err" >&2
    return 1
  fi
  read -r fig avg link slink < <(jq -r '.results[0] | "\(if .test == "lat" then .t_typical_us else .bw_avg_gbps end) \(.t_avg_us // "-") \(.link) \(.server_link)"' "$base.json")
  if [ "$llp" = xdp ] && { [ "$link" != xdp ] || [ "$slink" != xdp ]; }; then
    log "   $mode on xdp ran with the client on $link and the server on $slink (see $base.json): left out"
    return 1
  fi
  echo "$test $mode $llp $r $fig $avg" >>"$out/data"
}

: >"$out/data"
failed=0
start=$(date -u +%Y-%m-%dT%H:%MZ)
for ((r = 1; r <= rounds; r++)); do
  order=("${cases[@]}")
  if ((r % 2 == 0)); then # every other round backwards
    order=()
    for ((i = ${#cases[@]} - 1; i >= 0; i--)); do order+=("${cases[i]}"); done
  fi
  for c in "${order[@]}"; do
    log "== round $r/$rounds: $c"
    # shellcheck disable=SC2086 # the case's words are its arguments
    run "$r" $c || failed=$((failed + 1))
  done
done

detail=$(jq -r '.results[0].server_link_detail // "-"' "$out/r1-lat-ud-send-xdp.json" 2>/dev/null || echo -)
{
  echo "# AF_XDP beside kernel sockets"
  echo
  echo "Two namespaces joined by a veth pair (MTU 1500, tx checksum offload off on both ends); \`udperf server\` on CPU 0, \`udperf client\` on CPU 1, busy polling; $rounds round(s) from $start, the order reversed every other round; lat: 64 B, -n $n -w $w, one-way µs (half the round trip, the median of each run, t_typical); bw: 1400 B for -D $dur s, goodput Gb/s at the server. $(uname -r), $(go version | cut -d' ' -f3). AF_XDP ends: $detail. \`experiments/xdp.sh\` (ROUNDS=$rounds)."
  echo
  echo "| test | mode | lower layer | median | unit | rounds |"
  echo "|---|---|---|---|---|---|"
  awk -v cases="$(printf '%s\n' "${cases[@]}")" '
    function med(list,   a, k, i, j, t) {
      k = split(list, a, " ")
      for (i = 2; i <= k; i++) for (j = i; j > 1 && a[j-1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
      if (k == 0) return ""
      return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
    }
    { key = $1 " " $2 " " $3; v[key] = v[key] " " $5; nv[key]++ }
    END {
      nc = split(cases, cl, "\n")
      for (i = 1; i <= nc; i++) {
        split(cl[i], p, " "); key = p[1] " " p[2] " " p[3]
        m = med(v[key])
        printf "| %s | %s | %s | %s | %s | %d |\n", p[1], p[2], p[3], m == "" ? "failed" : sprintf("%.3f", m), p[1] == "lat" ? "µs" : "Gb/s", nv[key]
      }
    }' "$out/data"
  echo
  echo "Ratios, each the median of the per-round ratios (rounds where both ran):"
  echo
  echo "| ratio | median | per round |"
  echo "|---|---|---|"
  awk '
    function med(list,   a, k, i, j, t) {
      k = split(list, a, " ")
      for (i = 2; i <= k; i++) for (j = i; j > 1 && a[j-1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
      if (k == 0) return ""
      return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
    }
    { val[$1 " " $2 " " $3, $4] = $5; if ($4 > rounds) rounds = $4 }
    function ratio(name, a, b,   r, l, s, x) {
      l = ""; s = ""
      for (r = 1; r <= rounds; r++)
        if (((a, r) in val) && ((b, r) in val) && val[b, r] > 0) {
          x = val[a, r] / val[b, r]; l = l " " x; s = s (s == "" ? "" : ", ") sprintf("%.2f", x)
        }
      x = med(l)
      printf "| %s | %s | %s |\n", name, x == "" ? "—" : sprintf("%.2f", x), s == "" ? "—" : s
    }
    END {
      ratio("lat ud-send/xdp ÷ raw-udp", "lat ud-send xdp", "lat raw-udp udp")
      ratio("lat ud-send/xdp ÷ raw-xdp", "lat ud-send xdp", "lat raw-xdp xdp")
      ratio("lat rd-send/xdp ÷ raw-udp", "lat rd-send xdp", "lat raw-udp udp")
      ratio("lat ud-send/xdp ÷ ud-send/udp", "lat ud-send xdp", "lat ud-send udp")
      ratio("lat raw-xdp ÷ raw-udp", "lat raw-xdp xdp", "lat raw-udp udp")
      ratio("bw ud-send goodput xdp ÷ udp", "bw ud-send xdp", "bw ud-send udp")
      ratio("bw ud-wr goodput xdp ÷ udp", "bw ud-wr xdp", "bw ud-wr udp")
      ratio("bw rd-write goodput xdp ÷ udp", "bw rd-write xdp", "bw rd-write udp")
    }' "$out/data"
} >"$out/summary.md"
cat "$out/summary.md"
log "== results in $out"
if [ "$failed" -gt 0 ]; then
  log "xdp.sh: $failed run(s) failed; the table uses the rounds that worked (see above)"
  exit 1
fi
