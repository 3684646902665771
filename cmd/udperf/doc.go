// Command udperf measures udiwarp's latency and bandwidth in every mode,
// beside raw UDP and TCP baselines measured in the same run, in the manner
// of perftest and qperf.
//
// It also decodes frames: `udperf decode HEX` (or `-` for stdin, hex in
// any common shape: xxd, od, hexdump -C, tshark -x) checks a datagram (or,
// with -stream, a DDP segment as MPA carries it) against docs/wire.md and
// prints its fields or the exact reason it is rejected. docs/udperf.md
// documents every command.
package main
