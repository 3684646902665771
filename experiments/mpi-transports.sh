# Sourced by experiments/mpi-netpipe.sh and experiments/mpi-memory.sh:
# Open MPI's command line for each transport, and the check that Open MPI
# ran over the one it was given. The transports:
#   udiwarp      the ofi MTL over udiwarp's native RDM endpoint (RD QPs:
#                one endpoint for every peer), libfabric's utility
#                providers hidden so that none layers itself first
#   udiwarp-rxm  the ofi MTL over "udiwarp;ofi_rxm": libfabric's RDM layer
#                over udiwarp's MSG endpoints (an RC connection, TCP + MPA,
#                per peer)
#   tcp-btl      Open MPI's own TCP transport (--mca pml ob1 --mca btl
#                tcp,self: a TCP connection per peer, no shared memory)
#   tcp-rxm      the ofi MTL over "tcp;ofi_rxm" (libfabric's TCP provider,
#                a connection per peer)
#   udp-rxd      the ofi MTL over "udp;ofi_rxd" (libfabric's reliability
#                layer over its UDP provider)
# libfabric's providers on loopback (FI_TCP_IFACE=lo, FI_UDP_IFACE=lo).

mpi_transports_all="udiwarp udiwarp-rxm tcp-btl tcp-rxm udp-rxd"

# mpi_label NAME: the series' name in runs.csv and the plots.
mpi_label() {
  case $1 in
    udiwarp) echo "udiwarp RDM (native)" ;;
    udiwarp-rxm) echo "udiwarp;ofi_rxm" ;;
    tcp-btl) echo "Open MPI TCP BTL" ;;
    tcp-rxm) echo "tcp;ofi_rxm" ;;
    udp-rxd) echo "udp;ofi_rxd" ;;
    *) return 1 ;;
  esac
}

# mpi_provider NAME: the libfabric provider the ofi MTL is to pick ("" for
# the TCP BTL).
mpi_provider() {
  case $1 in
    udiwarp) echo "udiwarp" ;;
    udiwarp-rxm) echo "udiwarp;ofi_rxm" ;;
    tcp-rxm) echo "tcp;ofi_rxm" ;;
    udp-rxd) echo "udp;ofi_rxd" ;;
    *) echo "" ;;
  esac
}

# mpi_set_args NAME PROVDIR: sets the array mpi_args, mpirun's options for
# transport NAME, udiwarp's provider loaded from PROVDIR.
mpi_set_args() {
  local name=$1 dir=$2 prov
  prov=$(mpi_provider "$name")
  case $name in
    tcp-btl) mpi_args=(--mca pml ob1 --mca btl tcp,self) ;;
    udiwarp | udiwarp-rxm | tcp-rxm | udp-rxd)
      mpi_args=(--mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include "$prov"
        --mca opal_common_ofi_provider_include "$prov" --mca mtl_ofi_verbose 10
        -x FI_UDP_IFACE=lo -x FI_TCP_IFACE=lo) ;;
    *) echo "unknown transport '$name' (one of: $mpi_transports_all)" >&2; return 1 ;;
  esac
  case $name in
    udiwarp) mpi_args+=(-x FI_PROVIDER_PATH="$dir" -x FI_PROVIDER='^ofi_rxd,ofi_rxm,ofi_mrail') ;;
    udiwarp-rxm) mpi_args+=(-x FI_PROVIDER_PATH="$dir" -x FI_PROVIDER='^ofi_rxd,ofi_mrail') ;;
  esac
}

# mpi_check NAME LOG: whether every rank of the run logged in LOG ran
# over NAME's provider (the ofi MTL's verbose line "mtl:ofi:prov: P"); a
# TCP BTL run, that the ofi MTL was not used.
mpi_check() {
  local prov
  prov=$(mpi_provider "$1")
  if [ -z "$prov" ]; then
    ! grep -q "mtl:ofi:prov:" "$2"
    return
  fi
  awk -v p="$prov" '/mtl:ofi:prov:/ { if ($NF == p) ok = 1; else bad = 1 } END { exit !(ok && !bad) }' "$2"
}

# mpi_need TRANSPORTS...: dies, saying what to install, unless the
# programs the transports need are here.
mpi_need() {
  local c
  for c in mpirun ompi_info make gcc go fi_info timeout; do
    command -v "$c" >/dev/null ||
      die "$c is not installed (Debian: apt-get install openmpi-bin libfabric-bin libfabric-dev gcc make; Go from go.dev)"
  done
  for c in "$@"; do
    mpi_label "$c" >/dev/null || die "TRANSPORTS: unknown transport '$c' (one of: $mpi_transports_all)"
    case $c in
      tcp-rxm) FI_TCP_IFACE=lo fi_info -p tcp -t FI_EP_MSG >/dev/null 2>&1 || die "libfabric's tcp provider is not available (fi_info -p tcp): needed for tcp-rxm" ;;
      udp-rxd) FI_UDP_IFACE=lo fi_info -p udp -t FI_EP_DGRAM >/dev/null 2>&1 || die "libfabric's udp provider is not available (fi_info -p udp): needed for udp-rxd" ;;
    esac
  done
  local info
  info=$(ompi_info --parsable 2>/dev/null || true)
  [[ $info == *mca:mtl:ofi:* ]] ||
    die "Open MPI here has no ofi MTL (ompi_info | grep mtl): it needs Debian's openmpi-bin, built with libfabric"
}

# mpi_build_provider DIR: builds udiwarp's provider from this tree and
# copies its two libraries into DIR.
mpi_build_provider() {
  make -s -C libfabric >/dev/null
  mkdir -p "$1"
  cp libfabric/libudiwarp-fi.so libfabric/libudiwarp_fi_engine.so "$1/"
}
