// Command udstream streams media over udiwarp with RDMA Write-Record, so a
// receiver plays what arrived and knows exactly which bytes were lost.
package main
