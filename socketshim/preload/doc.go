// Package preload is udiwarp's LD_PRELOAD library: it runs the UDP
// sockets of unmodified programs (sockperf, dnsmasq, dig, iperf) over
// udiwarp's UD queue pairs. It has no Go API; the package holds its C
// library (c/preload.c), its Go engine (engine/, built -buildmode=c-shared)
// and their tests. docs/preload.md says how to build and use it, how
// sockets, descriptors, waits, signals, fork and daemons are handled, its
// counters and its limits.
package preload
