#!/usr/bin/env bash
# The memory of an MPI job's ranks as the ranks grow, on this host (seed
# 003's FIG 8 analogue): N ranks (RANKS, oversubscribing the two cores),
# each of which exchanges messages with every other rank (the pairwise
# MPI_Sendrecv of 64 B and 1 MiB and the MPI_Alltoall of
# experiments/mpi-memory.py), and then reads its own VmRSS and VmHWM from
# /proc/self/status; rank 0 gathers and prints them. Over (TRANSPORTS;
# experiments/mpi-transports.sh says what each is):
#   udiwarp      udiwarp's native RDM endpoint: one RD endpoint a rank,
#                whatever the number of peers
#   udiwarp-rxm  "udiwarp;ofi_rxm": an RC connection (TCP + MPA) per peer
#   tcp-btl      Open MPI's TCP BTL: a TCP connection per peer
# (tcp-rxm and udp-rxd may be named too.) The transports' order is
# rotated every round; each mpirun is bounded by RUN_TIMEOUT and the
# program's exchange by its count of messages.
#
# Figures per run: the mean over the ranks of VmRSS after the exchange
# (MiB), and of its growth since before it (after MPI_Init and a
# barrier); the table gives the median over the rounds, with VmHWM.
# Output: a markdown table on stdout (also $OUT/table.md); in $OUT:
# runs.csv (a row per run and figure: mpi-memory, VmRSS per rank, and
# mpi-memory-growth, its growth; series, x = ranks, round, value in MiB,
# transport, the ranks' min and max, VmHWM, the command),
# mpi-memory.png and mpi-memory-growth.png (and .svg; `go run
# ./experiments -plot $OUT`), every run's log.
#
# Environment: ROUNDS (3), RANKS ("2 4 8"), TRANSPORTS ("udiwarp
# udiwarp-rxm tcp-btl"), SIZES the exchange's message sizes ("64
# 1048576"), RUN_TIMEOUT seconds per mpirun (300), OUT (a new temporary
# directory). About 2 minutes at the defaults on two cores. Needs
# openmpi-bin (with the ofi MTL), python3-mpi4py for /usr/bin/python3,
# libfabric-bin, libfabric-dev, gcc, make, Go.
set -euo pipefail
cd "$(dirname "$0")/.."
. experiments/mpi-transports.sh
rounds=${ROUNDS:-3}
ranks=${RANKS:-"2 4 8"}
transports=(${TRANSPORTS:-udiwarp udiwarp-rxm tcp-btl})
sizes=${SIZES:-"64 1048576"}
run_timeout=${RUN_TIMEOUT:-300}
out=${OUT:-$(mktemp -d /tmp/mpi-memory.XXXXXX)}
mkdir -p "$out"
python=/usr/bin/python3

die() { echo "mpi-memory.sh: $*" >&2; exit 1; }
log() { echo "$*" >&2; }
mpi_need "${transports[@]}"
[ -x "$python" ] && "$python" -c 'import mpi4py' 2>/dev/null ||
  die "mpi4py is not installed for $python (Debian: apt-get install python3-mpi4py)"
for n in $ranks; do [[ $n =~ ^[0-9]+$ && $n -ge 2 && $n -le 64 ]] || die "RANKS: '$n' is not a count of ranks from 2 to 64"; done

# The provider, built from this tree, is loaded from a copy outside $OUT
# (which may be a results directory to commit), removed at the end.
provdir=$(mktemp -d /tmp/udiwarp-prov.XXXXXX)
trap "rm -rf '$provdir'" EXIT # expanded now: a function's local cannot stand in for it
log "== building the provider into $provdir"
mpi_build_provider "$provdir"

echo "figure,series,x,round,value,unit,transport,ranks,rss_min_mib,rss_max_mib,hwm_mib,rss_before_mib,command" >"$out/runs.csv"
: >"$out/data"
run() { # run NAME RANKS ROUND
  local name=$1 n=$2 r=$3 base label cmd
  base="$out/$name-$n-$r"
  mpi_set_args "$name" "$provdir"
  cmd=(mpirun --allow-run-as-root --oversubscribe -np "$n" "${mpi_args[@]}" "$python" experiments/mpi-memory.py $sizes)
  if ! timeout -k 10 "$run_timeout" "${cmd[@]}" >"$base.log" 2>&1 || ! grep -q "^ok: $n ranks" "$base.log"; then
    log "   $name with $n ranks, round $r, failed (or ran over ${run_timeout}s): $base.log"; return
  fi
  if ! mpi_check "$name" "$base.log"; then
    log "   $name with $n ranks, round $r: Open MPI did not run over $(mpi_provider "$name") (mtl_ofi_verbose lines in $base.log)"; return
  fi
  label=$(mpi_label "$name")
  # MEM rank=R ranks=N rss_before_kib=B rss_kib=A hwm_kib=H, a line a rank.
  awk -v s="$label" -v r="$r" -v t="$name" -v n="$n" -v c="${cmd[*]}" -v data="$out/data" '
    /^MEM / {
      for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
      k++; rss += v["rss_kib"]; before += v["rss_before_kib"]; hwm += v["hwm_kib"]
      if (k == 1 || v["rss_kib"] < lo) lo = v["rss_kib"]
      if (k == 1 || v["rss_kib"] > hi) hi = v["rss_kib"]
    }
    END {
      if (k != n) { print "   expected " n " MEM lines, got " k > "/dev/stderr"; exit 1 }
      m = rss / k / 1024; b = before / k / 1024; h = hwm / k / 1024
      printf "mpi-memory,\"%s\",%d,%d,%.3f,MiB,%s,%d,%.3f,%.3f,%.3f,%.3f,\"%s\"\n", s, n, r, m, t, n, lo / 1024, hi / 1024, h, b, c
      printf "mpi-memory-growth,\"%s\",%d,%d,%.3f,MiB,%s,%d,,,,%.3f,\"%s\"\n", s, n, r, m - b, t, n, b, c
      printf "%s %d %d %.2f %.2f %.2f\n", t, n, r, m, m - b, h >> data
    }' "$base.log" >>"$out/runs.csv" || log "   $name with $n ranks, round $r: $base.log is not what mpi-memory.py prints"
}

start=$(date -u '+%Y-%m-%d %H:%M UTC')
t0=$SECONDS
nt=${#transports[@]}
for r in $(seq "$rounds"); do
  log "== round $r of $rounds ($((SECONDS - t0)) s so far)"
  for n in $ranks; do
    for k in $(seq 0 $((nt - 1))); do run "${transports[$(((k + r) % nt))]}" "$n" "$r"; done
  done
done
log "== $((SECONDS - t0)) s of runs"

{
  echo "Memory of an MPI rank after every pair of ranks exchanged messages ($sizes bytes, pairwise MPI_Sendrecv, then MPI_Alltoall; experiments/mpi-memory.py under /usr/bin/python3, mpi4py $("$python" -c 'import mpi4py; print(mpi4py.__version__)')): N Open MPI $(ompi_info --parsable 2>/dev/null | awk -F: '/^ompi:version:full:/ {print $4; exit}') ranks on this host's $(nproc) cores (--oversubscribe), loopback; VmRSS and VmHWM from /proc/self/status, the mean over the ranks, MiB; the median of $rounds rounds from $start (transports rotated each round); $(uname -r). \`experiments/mpi-memory.sh\` (ROUNDS=$rounds)."
  echo
  echo "| transport | ranks | VmRSS per rank, MiB | growth in the exchange, MiB | VmHWM per rank, MiB | run means of VmRSS |"
  echo "|---|---:|---:|---:|---:|---|"
  awk -v list="${transports[*]}" -v ranks="$ranks" '
    function median(list,   n, a, i, j, t) {
      n = split(list, a, " ")
      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    { k = $1 SUBSEP $2; rss[k] = rss[k] " " $4; grow[k] = grow[k] " " $5; hwm[k] = hwm[k] " " $6 }
    END {
      nt = split(list, tr, " "); nr = split(ranks, rk, " ")
      for (i = 1; i <= nt; i++) for (j = 1; j <= nr; j++) {
        k = tr[i] SUBSEP rk[j]
        if (!(k in rss)) { printf "| %s | %s | — | — | — | failed |\n", tr[i], rk[j]; continue }
        printf "| %s | %s | %.1f | %.1f | %.1f | %s |\n", tr[i], rk[j], median(rss[k]), median(grow[k]), median(hwm[k]), rss[k]
      }
    }' "$out/data"
} | tee "$out/table.md"

log "== plotting into $out"
go run ./experiments -plot "$out" >&2 || log "   the plot failed; runs.csv is in $out (go run ./experiments -plot $out)"
log "== raw outputs in $out"
