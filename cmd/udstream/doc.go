// Command udstream streams media over udiwarp with RDMA Write-Record, so
// that a receiver plays what arrived and knows exactly which bytes were
// lost; the same stream can go over RD, UD Send, RC or plain UDP for
// comparison. A stream goes only to a receiver that proved its address
// (it echoes the sender's cookie), and its chunks and end carry a tag
// only the two ends know, so an off-path host can neither aim it at a
// victim nor end or derail it. docs/udstream.md is its manual.
package main
