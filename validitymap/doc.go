// Package validitymap keeps, per registered region, the set of byte ranges
// that hold valid data placed by RDMA Write-Record: seed 003's second
// recording design, where the application reads validity from a map
// instead of the completion queue.
//
// A Map is an interval set over byte offsets: Insert merges a range with
// its neighbours, Valid asks whether a range is wholly valid, All and
// Snapshot list the valid ranges, Invalidate removes a range the
// application has consumed. One goroutine may write while others read.
// Every operation is O(log n) in the number of disjoint ranges, memory is
// proportional to it, and a Map never holds more than its limit of
// disjoint ranges (see Insert and Invalidate for what happens at it).
package validitymap
