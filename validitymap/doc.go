// Package validitymap keeps, per registered region, the set of byte ranges
// that hold valid data placed by RDMA Write-Record.
package validitymap
