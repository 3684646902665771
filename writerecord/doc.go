// Package writerecord is the target side of RDMA Write-Record (seed 003):
// it tracks the messages in progress per (source, STag) — bytes placed,
// first arrival, MSN — decides each segment's fate (place it, or drop an
// older message's straggler; a message a newer MSN supersedes ends by its
// policy),
// says when a message is complete whichever segments were lost or
// reordered, and applies each message's deadline with the policy discard
// or deliver-partial. State exists only while a message is in progress and
// is capped per engine, per source and, in runs of bytes, per message.
//
// Sources are not authenticated, so the rules (docs/wire.md §4.3) bound
// what a spoofed segment can do: an MSN more than MSNWindow ahead of the
// message holding its key supersedes nothing, a holder the source's own
// messages keep passing over ends after two of them, and a segment of the
// holder's MSN with another extent never counts towards it. One datagram
// costs a flow at most three messages, never a deadline's wait; each
// segment costs O(log MaxRanges).
//
// The engine does no I/O and places nothing: package qp checks and places
// each segment between Admit and Placed, and records what Placed and
// Expire return as completion entries or in a validitymap.Map.
package writerecord
