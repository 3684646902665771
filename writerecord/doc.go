// Package writerecord is the target side of RDMA Write-Record (seed 003):
// it tracks the messages in progress per (source, STag) — bytes placed,
// first arrival, MSN — decides each segment's fate (place it, or drop an
// older message's straggler, discarding a message a newer MSN supersedes),
// says when a message is complete whichever segments were lost or
// reordered, and applies each message's deadline with the policy discard
// or deliver-partial. State exists only while a message is in progress and
// is capped per engine and per source.
//
// The engine does no I/O and places nothing: package qp checks and places
// each segment between Admit and Placed, and records what Placed and
// Expire return as completion entries or in a validitymap.Map.
package writerecord
