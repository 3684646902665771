// Command udstream will stream media over udiwarp with RDMA Write-Record,
// so that a receiver plays what arrived and knows exactly which bytes were
// lost. It is not built yet: issue 17 (streaming media over Write-Record
// with ffmpeg and VLC) builds it. Until then it says so and exits 2.
package main
