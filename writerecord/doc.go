// Package writerecord is the target side of RDMA Write-Record (seed 003):
// it tracks the messages in progress per (source, STag), decides each
// segment's fate, says when a message is complete whichever segments were
// lost or reordered, and ends it by its deadline and policy (discard or
// deliver-partial). It does no I/O and places nothing: package qp checks
// and places each segment between Admit and Placed. The rules that bound
// what a spoofed segment can do are in docs/wire.md §4.3.
package writerecord
