// Command udperf measures udiwarp's latency and bandwidth in every mode,
// beside raw UDP and TCP baselines measured in the same run, in the manner
// of perftest and qperf.
//
// Today it decodes frames: `udperf decode HEX` checks a datagram (or, with
// -stream, a DDP segment as MPA carries it) against docs/wire.md and prints
// its fields or the exact reason it is rejected.
package main
