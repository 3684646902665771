#!/usr/bin/env bash
# AF_XDP beside kernel sockets (issue 35, part 3): `udperf server` in
# network namespace A pinned to CPU 0 (taskset -c 0), `udperf client` in
# namespace B pinned to CPU 1, joined by a veth pair (MTU 1500), busy
# polling. Every round runs every case once, the order reversed every
# other round (ROUNDS, default 5). The one-size cases:
#
#   lat, 64 B:  raw-udp (kernel sockets), raw-xdp (plain UDP on AF_XDP,
#               no stack: that path's floor), ud-send on udp and on xdp,
#               rd-send on xdp, ud-wr on xdp
#   bw, 1400 B: raw-udp and raw-xdp (the floor of each path), ud-send,
#               ud-wr and rd-write, each on udp and on xdp
#               (ud-wr and rd-write with -mtu 1400: an AF_XDP link takes
#               no IP fragments, so every datagram fits the veth's MTU)
#
# and the size sweeps, seed 003's FIG 15 and FIG 16 over the veth:
#
#   lat, LAT_SIZES (64 256 1024 1400): up to 1400 B raw-udp, raw-xdp,
#               ud-send on udp and xdp, ud-wr and rd-send on xdp; above
#               1400 B (a UD Send or a raw datagram would be IP
#               fragments, which AF_XDP does not take) ud-wr and rd-send
#               on udp and xdp; ud-wr and rd-send with -mtu 1400
#   bw, BW_SIZES (1400 16384 262144 1048576): ud-wr and rd-write on udp
#               and xdp with -mtu 1400; ud-send on udp and xdp up to 1400 B
#
# A sweep case that is a one-size case (lat at 64 B, bw at 1400 B) is
# that run, not a second one; the others run SWEEP_N round trips after
# SWEEP_W warm-up (lat) or SWEEP_D seconds (bw), and above 64 KiB a lat
# run's round trips shrink with the size (SWEEP_N * 65536 / size, never
# under 100), as udperf's -a does.
#
# "on xdp" is `udperf client -llp xdp`: the client's queue pairs run on
# AF_XDP, and the server, started without -llp, follows the request; the
# script checks that both ends' JSON says xdp (link, server_link).
#
# Usage: experiments/xdp.sh [RESULTS_DIR]   (as root; default
# experiments/results/DATE-xdp). RESULTS_DIR gets every run's JSON
# (rN-TEST-MODE-LLP.json for a one-size case, rN-TEST-MODE-LLP-SIZE.json
# for a sweep's, with its stderr beside it), the server's log, data (a
# line per one-size run: test mode llp round median_us|gbps mean_us),
# runs.csv (a row per run, one-size and sweep: figure xdp-latency or
# xdp-goodput, series, x = bytes, round, value = t_typical µs or goodput
# Gb/s, unit, test, mode, llp, mean µs, iterations or seconds, the
# client's command), xdp-latency.png/.svg and xdp-goodput.png/.svg
# (`go run ./experiments -plot RESULTS_DIR`: a line per series through
# the medians of the rounds, min-max bars) and summary.md: the median
# over the rounds of each one-size case (t_typical_us for lat,
# bw_avg_gbps for bw), and the ratios, each the median of the per-round
# ratios (the two runs of a round are back to back, as udperf compare
# does): ud-send/xdp over raw-udp and over raw-xdp, rd-send/xdp over
# raw-udp, ud-send/xdp over ud-send/udp, and xdp's goodput over udp's
# for ud-send, ud-wr and rd-write; then the sweeps' medians, a row per
# series and a column per size. summary.md is printed at the end.
#
# Environment: ROUNDS (5), N lat round trips (20000), W warm-up (2000),
# D a bw run's seconds (1), LAT_SIZES, BW_SIZES (above), SWEEP_N (5000,
# or N if less), SWEEP_W (500, or W if less), SWEEP_D (D), PORT the
# server's control port (18600). The defaults are 44 runs a round (14
# one-size, 30 of the sweeps), 40-50 s on two cores (each run costs some
# 0.4 s besides its measurement: the client's start, the control
# connection, the queue pairs and AF_XDP sockets): five rounds take about
# 4 minutes.
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
lat_sizes=${LAT_SIZES:-64 256 1024 1400}
bw_sizes=${BW_SIZES:-1400 16384 262144 1048576}
sweep_n=${SWEEP_N:-$((n < 5000 ? n : 5000))}
sweep_w=${SWEEP_W:-$((w < 500 ? w : 500))}
sweep_d=${SWEEP_D:-$dur}
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
for x in $lat_sizes $bw_sizes; do
  [[ "$x" =~ ^[1-9][0-9]*$ ]] || die "LAT_SIZES=\"$lat_sizes\" BW_SIZES=\"$bw_sizes\": want sizes in bytes"
done
for x in "N=$n" "W=$w" "SWEEP_N=$sweep_n" "SWEEP_W=$sweep_w"; do
  [[ "${x#*=}" =~ ^[0-9]+$ ]] || die "$x: want a number"
done

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

# The one-size cases: test mode llp size [flags...]. data and summary.md's
# first two tables are theirs.
cases=(
  "lat raw-udp udp 64"
  "lat raw-xdp xdp 64"
  "lat ud-send udp 64"
  "lat ud-send xdp 64"
  "lat rd-send xdp 64"
  "lat ud-wr xdp 64"
  "bw raw-udp udp 1400"
  "bw raw-xdp xdp 1400"
  "bw ud-send udp 1400"
  "bw ud-send xdp 1400"
  "bw ud-wr udp 1400 -mtu 1400"
  "bw ud-wr xdp 1400 -mtu 1400"
  "bw rd-write udp 1400 -mtu 1400"
  "bw rd-write xdp 1400 -mtu 1400"
)
# The sweeps' cases, less those that are one-size cases. Every run is
# "one|sweep TEST MODE LLP SIZE [FLAGS...]"; a test's sizes in the order
# given, a size's cases together, so that a round's reversal swaps
# neighbours' order.
declare -A one_size=()
for c in "${cases[@]}"; do
  read -r t m l s _ <<<"$c"
  one_size["$t $m $l $s"]=1
done
runs=()
for c in "${cases[@]}"; do runs+=("one $c"); done
sweep() { # TEST MODE LLP SIZE [FLAGS...]
  [ -n "${one_size["$1 $2 $3 $4"]:-}" ] || runs+=("sweep $*")
}
for s in $lat_sizes; do
  if ((s <= 1400)); then
    sweep lat raw-udp udp "$s"
    sweep lat raw-xdp xdp "$s"
    sweep lat ud-send udp "$s"
    sweep lat ud-send xdp "$s"
    sweep lat ud-wr xdp "$s" -mtu 1400
    sweep lat rd-send xdp "$s" -mtu 1400
  else
    sweep lat ud-wr udp "$s" -mtu 1400
    sweep lat ud-wr xdp "$s" -mtu 1400
    sweep lat rd-send udp "$s" -mtu 1400
    sweep lat rd-send xdp "$s" -mtu 1400
  fi
done
for s in $bw_sizes; do
  if ((s <= 1400)); then
    sweep bw ud-send udp "$s"
    sweep bw ud-send xdp "$s"
  fi
  sweep bw ud-wr udp "$s" -mtu 1400
  sweep bw ud-wr xdp "$s" -mtu 1400
  sweep bw rd-write udp "$s" -mtu 1400
  sweep bw rd-write xdp "$s" -mtu 1400
done

# label MODE LLP: the series' name in runs.csv and the plots.
label() {
  local on=sockets
  [ "$2" = xdp ] && on=AF_XDP
  case $1 in
    raw-udp) echo "raw-udp (kernel sockets)" ;;
    raw-xdp) echo "raw-xdp (AF_XDP, no stack)" ;;
    ud-send) echo "UD Send, $on" ;;
    ud-wr) echo "UD Write-Record, $on" ;;
    rd-send) echo "RD Send, $on" ;;
    rd-write) echo "RD Write, $on" ;;
    *) echo "$1, $on" ;;
  esac
}

# run ROUND KIND TEST MODE LLP SIZE [FLAGS...]: one client run; a line of
# data (a one-size case) or of sweep (a sweep's), and a row of runs.csv.
run() {
  local r=$1 kind=$2 test=$3 mode=$4 llp=$5 size=$6
  shift 6
  local base="$out/r$r-$test-$mode-$llp" args=(-mode "$mode" -test "$test" -s "$size" "$@") fig avg link slink iters lab
  [ "$llp" = xdp ] && [ "$mode" != raw-xdp ] && args+=(-llp xdp)
  if [ "$kind" = one ]; then
    if [ "$test" = lat ]; then iters=$n; args+=(-n "$n" -w "$w"); else iters=$dur; args+=(-D "$dur"); fi
  else
    base+="-$size"
    if [ "$test" = lat ]; then
      local sn=$sweep_n sw=$sweep_w
      if ((size > 65536)); then
        sn=$((sweep_n * 65536 / size)) sw=$((sweep_w * 65536 / size))
        ((sn >= 100)) || sn=100
      fi
      iters=$sn
      args+=(-n "$sn" -w "$sw")
    else
      iters=$sweep_d
      args+=(-D "$sweep_d")
    fi
  fi
  if ! client "${args[@]}" >"$base.json" 2>"$base.err"; then
    log "   udperf client ${args[*]} failed; its stderr:"; sed 's/^/   | /' "$base.err" >&2
    return 1
  fi
  read -r fig avg link slink < <(jq -r '.results[0] | "\(if .test == "lat" then .t_typical_us else .bw_avg_gbps end) \(.t_avg_us // "-") \(.link) \(.server_link)"' "$base.json")
  if [ "$llp" = xdp ] && { [ "$link" != xdp ] || [ "$slink" != xdp ]; }; then
    log "   $mode on xdp ran with the client on $link and the server on $slink (see $base.json): left out"
    return 1
  fi
  lab=$(label "$mode" "$llp")
  if [ "$kind" = one ]; then
    echo "$test $mode $llp $r $fig $avg" >>"$out/data"
  fi
  echo "$test $size $r $fig $lab" >>"$out/sweep"
  if [ "$test" = lat ]; then
    printf 'xdp-latency,"%s",%s,%s,%s,us,lat,%s,%s,%s,%s,"udperf client -poll busy %s"\n' "$lab" "$size" "$r" "$fig" "$mode" "$llp" "$avg" "$iters" "${args[*]}" >>"$out/runs.csv"
  else
    printf 'xdp-goodput,"%s",%s,%s,%s,Gb/s,bw,%s,%s,%s,%s,"udperf client -poll busy %s"\n' "$lab" "$size" "$r" "$fig" "$mode" "$llp" "$avg" "$iters" "${args[*]}" >>"$out/runs.csv"
  fi
}

: >"$out/data"
: >"$out/sweep"
echo "figure,series,x,round,value,unit,test,mode,llp,mean_us,iterations_or_seconds,command" >"$out/runs.csv"
failed=0
start=$(date -u +%Y-%m-%dT%H:%MZ)
t0=$SECONDS
log "== ${#runs[@]} runs a round: lat at $lat_sizes B, bw at $bw_sizes B"
for ((r = 1; r <= rounds; r++)); do
  order=("${runs[@]}")
  if ((r % 2 == 0)); then # every other round backwards
    order=()
    for ((i = ${#runs[@]} - 1; i >= 0; i--)); do order+=("${runs[i]}"); done
  fi
  log "== round $r/$rounds ($((SECONDS - t0)) s so far)"
  for c in "${order[@]}"; do
    log "== round $r/$rounds: ${c#* }"
    # shellcheck disable=SC2086 # the case's words are its arguments
    run "$r" $c || failed=$((failed + 1))
  done
done
log "== $rounds round(s) in $((SECONDS - t0)) s"

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
      ratio("bw raw-xdp ÷ raw-udp (the floor)", "bw raw-xdp xdp", "bw raw-udp udp")
      ratio("bw ud-send goodput xdp ÷ udp", "bw ud-send xdp", "bw ud-send udp")
      ratio("bw ud-send/xdp ÷ raw-xdp", "bw ud-send xdp", "bw raw-xdp xdp")
      ratio("bw ud-wr goodput xdp ÷ udp", "bw ud-wr xdp", "bw ud-wr udp")
      ratio("bw rd-write goodput xdp ÷ udp", "bw rd-write xdp", "bw rd-write udp")
    }' "$out/data"
  for t in lat bw; do
    if [ "$t" = lat ]; then sizes=$lat_sizes; else sizes=$bw_sizes; fi
    echo
    if [ "$t" = lat ]; then
      echo "Latency against message size (\`xdp-latency.png\`): one-way µs, t_typical, the median of the rounds (sweep sizes: -n $sweep_n -w $sweep_w, fewer above 64 KiB; ud-wr and rd-send -mtu 1400 but at 64 B):"
    else
      echo "Goodput against message size (\`xdp-goodput.png\`): Gb/s at the server, the median of the rounds (sweep sizes: -D $sweep_d; ud-wr and rd-write -mtu 1400):"
    fi
    echo
    awk -v t="$t" -v sizes="$sizes" '
      function med(list,   a, k, i, j, x) {
        k = split(list, a, " ")
        for (i = 2; i <= k; i++) for (j = i; j > 1 && a[j-1] + 0 > a[j] + 0; j--) { x = a[j]; a[j] = a[j-1]; a[j-1] = x }
        if (k == 0) return ""
        return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
      }
      $1 == t {
        lab = $5; for (i = 6; i <= NF; i++) lab = lab " " $i
        if (!(lab in seen)) { seen[lab] = 1; order[++ns] = lab }
        v[lab, $2] = v[lab, $2] " " $4
      }
      END {
        nz = split(sizes, sz, " ")
        h = "| series |"; d = "|---|"
        for (i = 1; i <= nz; i++) { h = h " " sz[i] " B |"; d = d "---|" }
        print h; print d
        for (k = 1; k <= ns; k++) {
          l = "| " order[k] " |"
          for (i = 1; i <= nz; i++) { m = med(v[order[k], sz[i]]); l = l " " (m == "" ? "—" : sprintf(t == "lat" ? "%.2f" : "%.3f", m)) " |" }
          print l
        }
      }' "$out/sweep"
  done
} >"$out/summary.md"
cat "$out/summary.md"
log "== plotting into $out"
go run ./experiments -plot "$out" >&2 || log "   the plot failed; runs.csv is in $out (go run ./experiments -plot $out)"
log "== results in $out"
if [ "$failed" -gt 0 ]; then
  log "xdp.sh: $failed run(s) failed; the table uses the rounds that worked (see above)"
  exit 1
fi
