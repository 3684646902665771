// The engine's half of the interface the C front (../c/udiwarp_fi.c)
// calls: what crosses from Go to C in each batch of completions. Both
// sides include this one definition.
#ifndef UDWF_H
#define UDWF_H
#include <stddef.h>
#include <stdint.h>

// A completion: the operation's context, the bytes it moved, whether it
// was a receive (and of a tagged message, with its tag), its error (0, or
// a positive errno: EMSGSIZE for a message cut to the buffer posted, the
// bytes cut in olen; ECANCELED; EIO; for RMA and atomics EACCES, EINVAL,
// EREMOTEIO: the target refused its access, found it invalid, or could
// not carry it out), its remote CQ data, for a receive its source as a
// struct sockaddr (srclen bytes), and what it completes (op).
struct udwf_comp {
	uint64_t ctx;
	uint64_t len;
	uint64_t olen;
	uint64_t data;
	uint64_t tag;
	uint32_t recv;
	int32_t err;
	uint32_t has_data;
	uint32_t srclen;
	uint32_t tagged;
	uint32_t op; // 0: a message; else what RMA or atomic (UDWF_OP_*)
	uint8_t src[28];
	uint8_t pad[4];
};

// What a completion is for besides a message (struct udwf_comp's op).
#define UDWF_OP_WRITE 1        // an RMA write the endpoint initiated (udwf_rma)
#define UDWF_OP_READ 2         // an RMA read it initiated
#define UDWF_OP_ATOMIC 3       // an atomic whose original value nobody asked for (fi_atomic)
#define UDWF_OP_FETCH 4        // an atomic that fetched it (fi_fetch_atomic, fi_compare_atomic)
#define UDWF_OP_REMOTE_WRITE 5 // at the target: a peer's write with remote CQ data (data)

// The atomics udwf_atomic carries out on a peer's 64-bit word.
#define UDWF_ATOMIC_ADD 1   // RFC 7306 FetchAdd
#define UDWF_ATOMIC_CSWAP 2 // RFC 7306 CmpSwap
#endif
