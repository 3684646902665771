#!/usr/bin/env bash
# NetPIPE (NPopenmpi) between two Open MPI ranks on this host, bound to
# one core each (mpirun's default for two ranks), over three transports
# in one sitting, the order rotated every round:
#   tcp-btl     Open MPI's own TCP transport (--mca pml ob1 --mca btl tcp,self)
#   udp-rxd     the ofi MTL over libfabric's "udp;ofi_rxd"
#   udiwarp     the ofi MTL over udiwarp's native RDM endpoint
# Figures: NetPIPE's half round trip (µs) at 64 B, 64 KiB and 1 MiB, the
# median over the rounds, and its ratio to udp-rxd and to tcp-btl.
# Output: a markdown table on stdout; raw NetPIPE outputs under $OUT.
# Environment: ROUNDS (3), REPEATS NetPIPE's -n (200), OUT. Needs
# openmpi-bin, netpipe-openmpi, libfabric-bin, libfabric-dev, gcc, Go.
# Run it alone on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-3}
repeats=${REPEATS:-200}
out=${OUT:-$(mktemp -d /tmp/mpi-netpipe.XXXXXX)}
mkdir -p "$out/prov"
make -s -C libfabric >/dev/null
cp libfabric/libudiwarp-fi.so libfabric/libudiwarp_fi_engine.so "$out/prov/"

run() { # run NAME ROUND
  local name=$1 r=$2 args=()
  case $name in
    tcp-btl) args=(--mca pml ob1 --mca btl tcp,self) ;;
    udp-rxd) args=(--mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include "udp;ofi_rxd"
      --mca opal_common_ofi_provider_include "udp;ofi_rxd" -x FI_UDP_IFACE=lo) ;;
    udiwarp) args=(--mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include udiwarp
      --mca opal_common_ofi_provider_include udiwarp -x FI_PROVIDER_PATH="$out/prov"
      -x FI_PROVIDER='^ofi_rxd,ofi_rxm,ofi_mrail') ;;
  esac
  timeout 600 mpirun --allow-run-as-root -np 2 "${args[@]}" NPopenmpi -l 64 -u 1048576 -p 0 -n "$repeats" \
    -o "$out/$name-$r.np" >"$out/$name-$r.log" 2>&1 || echo "$name round $r failed: $out/$name-$r.log" >&2
}
names=(tcp-btl udp-rxd udiwarp)
start=$(date -u '+%Y-%m-%d %H:%M UTC')
for r in $(seq "$rounds"); do
  for k in 0 1 2; do run "${names[$(((k + r) % 3))]}" "$r"; done
done
echo "NetPIPE (NPopenmpi -p 0 -n $repeats), two Open MPI 4.1 ranks bound to the two cores, loopback; half round trip µs, the median of $rounds rounds from $start (transports rotated each round); $(uname -r). \`experiments/mpi-netpipe.sh\`."
echo
echo "| transport | 64 B µs | 64 KiB µs | 1 MiB µs | ratio to udp;ofi_rxd (64 B / 64 KiB / 1 MiB) | ratio to Open MPI TCP |"
echo "|---|---:|---:|---:|---|---|"
# NetPIPE's output file: bytes, Mbps, seconds (a round trip's half).
med() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
declare -A fig
for name in "${names[@]}"; do
  for s in 64 65536 1048576; do
    fig[$name,$s]=$(for f in "$out/$name"-*.np; do awk -v s="$s" '$1 == s {printf "%.2f\n", $3 * 1e6}' "$f"; done | med)
  done
done
for name in "${names[@]}"; do
  rr="" rt=""
  for s in 64 65536 1048576; do
    rr+=$(awk -v a="${fig[$name,$s]}" -v b="${fig[udp-rxd,$s]}" 'BEGIN {printf "%.2fx ", a / b}')
    rt+=$(awk -v a="${fig[$name,$s]}" -v b="${fig[tcp-btl,$s]}" 'BEGIN {printf "%.2fx ", a / b}')
  done
  echo "| $name | ${fig[$name,64]} | ${fig[$name,65536]} | ${fig[$name,1048576]} | $rr| $rt|"
done
echo >&2 "raw outputs in $out"
