#!/usr/bin/env bash
# NetPIPE (NPopenmpi) between two Open MPI ranks on this host, bound to
# one core each (mpirun's default for two ranks), over five transports
# in one sitting (experiments/mpi-transports.sh says what each is):
#   udiwarp      the ofi MTL over udiwarp's native RDM endpoint
#   udiwarp-rxm  the ofi MTL over "udiwarp;ofi_rxm" (RC connections)
#   tcp-btl      Open MPI's own TCP transport (--mca pml ob1 --mca btl tcp,self)
#   tcp-rxm      the ofi MTL over "tcp;ofi_rxm"
#   udp-rxd      the ofi MTL over "udp;ofi_rxd"
# Two measurements (seed 003's FIG 5 and FIG 6), each a NetPIPE run per
# transport per round, the transports' order rotated every round:
#   lat   ping-pong latency: NPopenmpi -l 1 -u MAX_SIZE -p 0 -n REPEATS,
#         NetPIPE's sizes (powers of two and the halves between: 1, 2,
#         3, 4, 6, 8, 12, ... 1 MiB), half the round trip, µs
#   bibw  bidirectional bandwidth: NPopenmpi -2 -a (both ranks send at
#         once, receives preposted), the same sizes; the bytes of both
#         directions over the time of one exchange, Gb/s
# NetPIPE's figure for a size is the best of its trials, each the mean of
# REPEATS exchanges. A run whose ranks did not all run over the intended
# provider (the ofi MTL's verbose line) counts as failed.
#
# Output: markdown tables on stdout (also $OUT/table.md): latency at 64 B,
# 64 KiB and 1 MiB, the median of the rounds, with its ratio to udp;ofi_rxd
# and to Open MPI's TCP; the same for bidirectional bandwidth. In $OUT:
# runs.csv (a row per size per run: figure mpi-latency or mpi-bibw,
# series, x = bytes a message, round, value, unit, transport, command),
# mpi-latency.png and mpi-bibw.png (and .svg; `go run
# ./experiments -plot $OUT`), every NetPIPE output (.np) and mpirun log.
#
# Environment: ROUNDS (3), REPEATS NetPIPE's -n (50; the first sitting
# in BENCHMARKS.md used 100), TRANSPORTS (all five), MODES ("lat bibw"),
# MAX_SIZE (1048576), RUN_TIMEOUT seconds per mpirun (300), OUT (a new
# temporary directory). About 5 minutes at the defaults on two cores,
# most of it udp;ofi_rxd's and udiwarp's large messages (a run takes
# about 1 s to start, then 3 trials of REPEATS exchanges a size). Needs openmpi-bin (with the ofi MTL),
# netpipe-openmpi, libfabric-bin, libfabric-dev, gcc, make, Go. Run it
# alone on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
. experiments/mpi-transports.sh
rounds=${ROUNDS:-3}
repeats=${REPEATS:-50}
transports=(${TRANSPORTS:-$mpi_transports_all})
modes=${MODES:-"lat bibw"}
max_size=${MAX_SIZE:-1048576}
run_timeout=${RUN_TIMEOUT:-300}
out=${OUT:-$(mktemp -d /tmp/mpi-netpipe.XXXXXX)}
mkdir -p "$out"

die() { echo "mpi-netpipe.sh: $*" >&2; exit 1; }
log() { echo "$*" >&2; }
mpi_need "${transports[@]}"
command -v NPopenmpi >/dev/null || die "NPopenmpi is not installed (Debian: apt-get install netpipe-openmpi)"
for m in $modes; do case $m in lat | bibw) ;; *) die "MODES: unknown mode '$m' (lat, bibw)" ;; esac; done

# The provider, built from this tree, is loaded from a copy outside $OUT
# (which may be a results directory to commit), removed at the end.
provdir=$(mktemp -d /tmp/udiwarp-prov.XXXXXX)
trap "rm -rf '$provdir'" EXIT # expanded now: a function's local cannot stand in for it
log "== building the provider into $provdir"
mpi_build_provider "$provdir"

echo "figure,series,x,round,value,unit,transport,repeats,command" >"$out/runs.csv"
run() { # run NAME MODE ROUND
  local name=$1 mode=$2 r=$3 np=() base label fig
  base="$out/$name-$mode-$r"
  mpi_set_args "$name" "$provdir"
  np=(NPopenmpi -l 1 -u "$max_size" -p 0 -n "$repeats" -o "$base.np")
  [ "$mode" = bibw ] && np+=(-2 -a)
  rm -f "$base.np"
  if ! timeout -k 10 "$run_timeout" mpirun --allow-run-as-root -np 2 "${mpi_args[@]}" "${np[@]}" >"$base.log" 2>&1; then
    log "   $name $mode round $r failed (or ran over ${run_timeout}s): $base.log"; return
  fi
  if ! mpi_check "$name" "$base.log"; then
    log "   $name $mode round $r: Open MPI did not run over $(mpi_provider "$name") (mtl_ofi_verbose lines in $base.log)"; return
  fi
  label=$(mpi_label "$name")
  # NetPIPE's output: bytes, Mbps (2^20 bits/s), seconds. With -2 the
  # bytes are both directions' (twice the message) and the seconds one
  # exchange's; without, the seconds are half a round trip.
  if [ "$mode" = lat ]; then
    awk -v s="$label" -v r="$r" -v n="$name" -v rep="$repeats" -v c="mpirun -np 2 ${mpi_args[*]} ${np[*]}" \
      'NF >= 3 {printf "mpi-latency,\"%s\",%d,%d,%.3f,us,%s,%d,\"%s\"\n", s, $1, r, $3 * 1e6, n, rep, c}' "$base.np" >>"$out/runs.csv"
  else
    awk -v s="$label" -v r="$r" -v n="$name" -v rep="$repeats" -v c="mpirun -np 2 ${mpi_args[*]} ${np[*]}" \
      'NF >= 3 && $3 > 0 {printf "mpi-bibw,\"%s\",%d,%d,%.4f,Gb/s,%s,%d,\"%s\"\n", s, $1 / 2, r, $1 * 8 / $3 / 1e9, n, rep, c}' "$base.np" >>"$out/runs.csv"
  fi
}

start=$(date -u '+%Y-%m-%d %H:%M UTC')
t0=$SECONDS
n=${#transports[@]}
for r in $(seq "$rounds"); do
  log "== round $r of $rounds ($((SECONDS - t0)) s so far)"
  for mode in $modes; do
    for k in $(seq 0 $((n - 1))); do run "${transports[$(((k + r) % n))]}" "$mode" "$r"; done
  done
done
log "== $((SECONDS - t0)) s of runs"

# table FIGURE UNIT DIGITS: the medians at 64 B, 64 KiB and 1 MiB of each
# transport, and their ratios to udp;ofi_rxd's and Open MPI TCP's.
table() {
  awk -F, -v fig="$1" -v unit="$2" -v list="${transports[*]}" '
    function median(list,   n, a, i, j, t) {
      n = split(list, a, " ")
      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    function ratio(a, b) { return (a == "" || b == "" || b == 0) ? "—" : sprintf("%.2fx", a / b) }
    $1 == fig && ($3 == 64 || $3 == 65536 || $3 == 1048576) { v[$7, $3] = v[$7, $3] " " $5 }
    END {
      split("64 65536 1048576", sz, " ")
      nt = split(list, tr, " ")
      for (i = 1; i <= nt; i++) for (j = 1; j <= 3; j++) if ((tr[i], sz[j]) in v) m[tr[i], sz[j]] = median(v[tr[i], sz[j]])
      for (i = 1; i <= nt; i++) {
        t = tr[i]; cells = ""; rr = ""; rt = ""
        for (j = 1; j <= 3; j++) {
          s = sz[j]; x = ((t, s) in m) ? m[t, s] : ""
          cells = cells sprintf(" %s |", x == "" ? "—" : sprintf(unit == "us" ? "%.2f" : "%.3f", x))
          rr = rr " " ratio(x, m["udp-rxd", s]); rt = rt " " ratio(x, m["tcp-btl", s])
        }
        printf "| %s |%s%s |%s |\n", t, cells, rr, rt
      }
    }' "$out/runs.csv"
}

{
  echo "NetPIPE (NPopenmpi -l 1 -u $max_size -p 0 -n $repeats), two Open MPI $(ompi_info --parsable 2>/dev/null | awk -F: '/^ompi:version:full:/ {print $4; exit}') ranks bound to the two cores, loopback; the median of $rounds rounds from $start (transports rotated each round); $(uname -r). \`experiments/mpi-netpipe.sh\` (ROUNDS=$rounds REPEATS=$repeats)."
  if [[ " $modes " == *" lat "* ]]; then
    echo
    echo "Ping-pong latency, half round trip (seed 003 FIG 5):"
    echo
    echo "| transport | 64 B µs | 64 KiB µs | 1 MiB µs | ratio to udp;ofi_rxd (64 B / 64 KiB / 1 MiB) | ratio to Open MPI TCP |"
    echo "|---|---:|---:|---:|---|---|"
    table mpi-latency us
  fi
  if [[ " $modes " == *" bibw "* ]]; then
    echo
    echo "Bidirectional bandwidth, NPopenmpi -2 -a, both directions' bytes over one exchange's time (seed 003 FIG 6):"
    echo
    echo "| transport | 64 B Gb/s | 64 KiB Gb/s | 1 MiB Gb/s | ratio to udp;ofi_rxd (64 B / 64 KiB / 1 MiB) | ratio to Open MPI TCP |"
    echo "|---|---:|---:|---:|---|---|"
    table mpi-bibw gbps
  fi
} | tee "$out/table.md"

log "== plotting into $out"
go run ./experiments -plot "$out" >&2 || log "   the plot failed; runs.csv is in $out (go run ./experiments -plot $out)"
log "== raw outputs in $out"
