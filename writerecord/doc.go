// Package writerecord is the target side of RDMA Write-Record: it places
// each valid segment into the registered region at once, tracks the
// messages in progress per (source, STag, MSN), applies their timeouts and
// the partial-delivery policy, and records the valid byte ranges as
// completion entries or in a validity map, atomically as the application
// sees them.
package writerecord
