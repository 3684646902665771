#!/usr/bin/env bash
# RD Send/Recv against libfabric's reliable datagram provider
# ("udp;ofi_rxd"), one-way latency (half the round trip), busy polling,
# 64 B .. 64000 B, both as two processes pinned to CPUs 1 and 0 in one
# sitting, beside plain UDP (udperf raw-udp) as the baseline of the
# ratios: experiments/twoproc.sh with these modes and sizes. (This script
# once set RD's one-process ping-pong against fi_pingpong's two
# processes, which is not like for like.) Environment as twoproc.sh's.
set -euo pipefail
cd "$(dirname "$0")/.."
MODES=${MODES:-"raw-udp rd-send"} SIZES=${SIZES:-"64 1024 8192 32768 64000"} exec ./experiments/twoproc.sh
