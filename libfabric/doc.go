// Package libfabric holds udiwarp's libfabric (OFI) provider, named
// udiwarp, and its tests: unmodified libfabric programs (fi_info,
// fi_pingpong) run over it, in one network namespace and across two.
//
// The provider is two shared libraries, built by this directory's
// Makefile (or by the tests themselves):
//
//   - libudiwarp-fi.so, C (c/udiwarp_fi.c): what libfabric loads from
//     FI_PROVIDER_PATH. It exports fi_prov_ini and owns libfabric 1.17's
//     ABI: fi_info, the fabric, domain, address vector, completion queue,
//     memory region and endpoint objects, and their ops tables.
//   - libudiwarp_fi_engine.so, Go built c-shared (engine/): the udiwarp
//     stack, loaded by the C front when the first domain opens (a program
//     that only lists providers never starts a Go runtime), one per
//     process whatever the number of fabrics, domains and endpoints.
//
// An endpoint is a UDP socket the C front opens, binds and waits on, run
// by the engine as a manual socket of the process's one qp.Device with a
// datagram QP answering to a fixed QP number: its address is its
// socket's (FI_SOCKADDR_IN, FI_SOCKADDR_IN6), so names exchanged out of
// band, as fi_pingpong and MPI exchange them, are plain socket addresses.
// Progress is manual: reading a completion queue reads the sockets of its
// endpoints, in the caller's thread, and completions cross from Go to C
// in batches. docs/libfabric.md says how to build, install and use it,
// and what it does not do yet.
package libfabric
