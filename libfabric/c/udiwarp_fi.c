// udiwarp's libfabric provider: the C front that owns libfabric's ABI
// (built against libfabric 1.17's headers, FI_VERSION(1, 17)) over the Go
// engine, libudiwarp_fi_engine.so (../engine), which it dlopen()s from its
// own directory (or $UDIWARP_FI_ENGINE) when the first domain opens, so
// that a program that only lists providers never starts a Go runtime.
//
// Endpoint types (docs/libfabric.md): FI_EP_DGRAM on udiwarp's UD queue
// pairs (FI_MSG, FI_SOURCE, FI_MULTICAST); FI_EP_RDM on RD queue pairs
// (FI_MSG, FI_TAGGED matched in the engine, FI_RMA and FI_ATOMIC on the
// stack's memory regions); FI_EP_MSG on RC queue pairs over TCP and MPA
// (FI_MSG, FI_RMA; connections with passive endpoints and an EQ). A
// DGRAM or RDM endpoint is a UDP socket this file opens, binds, waits on
// and closes; the engine runs a QP over it (qp.Device.BindFD) that
// answers to a fixed QP number, so an endpoint's address is its socket's
// (FI_SOCKADDR_IN or FI_SOCKADDR_IN6) and is what fi_getname returns. An
// MSG endpoint is a TCP socket of this file's, run by the engine as an
// RC QP on that descriptor (qp.QP.ConnectFD, AcceptFD).
//
// Progress is FI_PROGRESS_MANUAL: reading a completion queue reads the
// sockets of the endpoints bound to it (udwf_poll), as libfabric's own udp
// provider does. A CQ's wait object (FI_WAIT_FD, FI_WAIT_UNSPEC) is an epoll
// descriptor over those sockets; fi_cq_sread waits on it. Besides the
// Go runtime's threads (where the device's timer sends RD's
// retransmissions and delayed acks), this file starts a thread for an
// MSG endpoint while it connects (fi_connect returns at once) and one for
// a passive endpoint while it listens.
//
// What is not here: counters, scalable endpoints, shared contexts,
// collectives; remote CQ data and atomics on MSG endpoints.

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <errno.h>
#include <ifaddrs.h>
#include <limits.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_collective.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <rdma/providers/fi_prov.h>

#define EXPORT __attribute__((visibility("default")))
#define UDW_NAME "udiwarp"
#define UDW_VERSION FI_VERSION(0, 1)
#define UDW_FI_VERSION FI_VERSION(1, 17)

// The largest message of one datagram: IPv4's largest UDP payload, 65,507
// bytes, less DDP's untagged header (18) and the CRC (4). The engine's
// udwf_max_msg says the same; a test holds the two together.
#define UDW_MAX_MSG (65507 - 18 - 4)
#define UDW_TX_SIZE 256
#define UDW_RX_SIZE 256
// RDM endpoints send eagerly, each message in a send slot until its peer
// acknowledges it and into a receive slot of the peer's: 64 of each, of
// the largest message.
#define UDW_RDM_MAX_MSG (8 << 20)
#define UDW_RDM_INJECT 65536
#define UDW_RDM_SIZE 64
// FI_TAG_GENERIC of later libfabric versions: tags of 64 bits, any of
// which a receive may ignore (Open MPI's MTL wants bit 63).
#define UDW_TAG_FORMAT 0xAAAAAAAAAAAAAAAAull
// MSG endpoints are RC queue pairs on TCP: a message of up to 64 KiB is
// copied at the call, a larger one sent from the caller's buffer;
// inject_size says 16 KiB, what ofi_rxm over it can take (its eager
// buffers' size).
#define UDW_MSG_MAX_MSG ((size_t)1 << 30)
#define UDW_MSG_INJECT 16384
// The connection data of fi_connect, fi_accept and fi_reject travels as
// MPA private data (at most 512 bytes, less revision 2's IRD/ORD word).
#define UDW_CM_DATA 256
#define UDW_POLL_BATCH 64

// ---- the engine -----------------------------------------------------------

#include "../engine/udwf.h"

static struct {
	pthread_once_t once;
	int err; // 0, or the -FI_ errno of a failed load
	int (*init)(void);
	long long (*ah)(void *sa, int salen);
	void (*ah_free)(long long i);
	long long (*ep_open)(int fd, int rdm, int tx, int rx, int maxmsg);
	int (*ep_close)(long long h);
	int (*send)(long long h, void *buf, size_t n, long long ah, uint64_t ctx, int signaled, int has_data, uint64_t data);
	int (*recv)(long long h, void *buf, size_t n, uint64_t ctx);
	int (*poll)(long long h, struct udwf_comp *out, int n);
	int (*max_msg)(void);
	int (*join)(long long h, void *sa, int salen, int join);
	int (*tsend)(long long h, void *buf, size_t n, long long ah, int tagged, uint64_t tag, int has_data, uint64_t data,
		     uint64_t ctx, int signaled);
	int (*trecv)(long long h, void *buf, size_t n, long long src, int tagged, uint64_t tag, uint64_t ignore, uint64_t ctx);
	int (*cancel)(long long h, uint64_t ctx);
	int (*tpeek)(long long h, long long src, int tagged, uint64_t tag, uint64_t ignore, uint64_t ctx, int claim, int discard);
	int (*tclaim)(long long h, void *buf, size_t n, uint64_t ctx, int discard);
	long long (*msg_open)(int fd, int tx, int rx);
	int (*msg_connect)(long long h, const void *pd, int pdlen, void *out, int *outlen);
	int (*msg_accept)(long long h, const void *pd, int pdlen, void *out, int *outlen);
	int (*mpa_peek)(int fd, void *out, int *outlen);
	int (*mpa_reject)(int fd, const void *pd, int pdlen);
	int (*msend)(long long h, void *buf, size_t n, uint64_t ctx, int signaled);
	int (*mrecv)(long long h, void *buf, size_t n, uint64_t ctx);
	int (*msg_ended)(long long h);
	long long (*mr_reg)(void *buf, size_t n, int remote_read, int remote_write);
	int (*mr_dereg)(uint32_t stag);
	int (*rma)(long long h, int op, void *buf, size_t n, long long ah, uint32_t key, uint64_t to, int has_data, uint64_t data,
		   uint64_t ctx, int signaled);
	int (*atomic)(long long h, int op, long long ah, uint32_t key, uint64_t to, uint64_t operand, uint64_t compare, void *result,
		      uint64_t ctx, int signaled);
} eng = {.once = PTHREAD_ONCE_INIT};

static struct fi_provider udw_prov;

#define WARN(...) fprintf(stderr, "libfabric udiwarp: " __VA_ARGS__)

// onstack gives every signal handler the program has installed
// SA_ONSTACK: the Go runtime runs a thread that calls into the engine on
// a goroutine stack of a few KiB and gives it an alternate signal stack,
// which a handler uses only with the flag (os/signal, "Go programs that
// use cgo"). The runtime adds it to the handlers it finds when it loads;
// this adds it to those installed since (MPI installs its own).
static void onstack(void) {
	for (int sig = 1; sig < NSIG; sig++) {
		struct sigaction sa;
		if (sig == SIGKILL || sig == SIGSTOP || sigaction(sig, NULL, &sa) != 0) continue;
		if (sa.sa_handler == SIG_DFL || sa.sa_handler == SIG_IGN || (sa.sa_flags & SA_ONSTACK)) continue;
		sa.sa_flags |= SA_ONSTACK;
		sigaction(sig, &sa, NULL);
	}
}

static void load_engine(void) {
	const char *path = getenv("UDIWARP_FI_ENGINE");
	char buf[PATH_MAX];
	if (!path || !*path) {
		Dl_info di;
		if (!dladdr((void *)load_engine, &di) || !di.dli_fname) {
			WARN("cannot find the engine: set UDIWARP_FI_ENGINE\n");
			eng.err = -FI_ENOENT;
			return;
		}
		snprintf(buf, sizeof buf, "%s", di.dli_fname);
		char *slash = strrchr(buf, '/');
		size_t off = slash ? (size_t)(slash - buf + 1) : 0;
		snprintf(buf + off, sizeof buf - off, "libudiwarp_fi_engine.so");
		path = buf;
	}
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		WARN("cannot load the engine: %s\n", dlerror());
		eng.err = -FI_ENOENT;
		return;
	}
	eng.init = dlsym(h, "udwf_init");
	eng.ah = dlsym(h, "udwf_ah");
	eng.ah_free = dlsym(h, "udwf_ah_free");
	eng.ep_open = dlsym(h, "udwf_ep_open");
	eng.ep_close = dlsym(h, "udwf_ep_close");
	eng.send = dlsym(h, "udwf_send");
	eng.recv = dlsym(h, "udwf_recv");
	eng.poll = dlsym(h, "udwf_poll");
	eng.max_msg = dlsym(h, "udwf_max_msg");
	eng.join = dlsym(h, "udwf_join");
	eng.tsend = dlsym(h, "udwf_tsend");
	eng.trecv = dlsym(h, "udwf_trecv");
	eng.cancel = dlsym(h, "udwf_cancel");
	eng.tpeek = dlsym(h, "udwf_tpeek");
	eng.tclaim = dlsym(h, "udwf_tclaim");
	eng.msg_open = dlsym(h, "udwf_msg_open");
	eng.msg_connect = dlsym(h, "udwf_msg_connect");
	eng.msg_accept = dlsym(h, "udwf_msg_accept");
	eng.mpa_peek = dlsym(h, "udwf_mpa_peek");
	eng.mpa_reject = dlsym(h, "udwf_mpa_reject");
	eng.msend = dlsym(h, "udwf_msend");
	eng.mrecv = dlsym(h, "udwf_mrecv");
	eng.msg_ended = dlsym(h, "udwf_msg_ended");
	eng.mr_reg = dlsym(h, "udwf_mr_reg");
	eng.mr_dereg = dlsym(h, "udwf_mr_dereg");
	eng.rma = dlsym(h, "udwf_rma");
	eng.atomic = dlsym(h, "udwf_atomic");
	if (!eng.init || !eng.ah || !eng.ah_free || !eng.ep_open || !eng.ep_close || !eng.send || !eng.recv || !eng.poll ||
	    !eng.max_msg || !eng.join || !eng.tsend || !eng.trecv || !eng.cancel ||
	    !eng.tpeek || !eng.tclaim || !eng.msg_open || !eng.msg_connect || !eng.msg_accept || !eng.mpa_peek ||
	    !eng.mpa_reject || !eng.msend || !eng.mrecv || !eng.msg_ended || !eng.mr_reg || !eng.mr_dereg || !eng.rma ||
	    !eng.atomic) {
		WARN("the engine %s is incomplete\n", path);
		eng.err = -FI_ENOSYS;
		return;
	}
	if (eng.max_msg() != UDW_MAX_MSG) {
		WARN("the engine carries %d-byte messages, this front %d: a mismatched build\n", eng.max_msg(), UDW_MAX_MSG);
		eng.err = -FI_EOTHER;
		return;
	}
	int r = eng.init();
	if (r < 0) {
		WARN("the engine cannot start: %s\n", strerror(-r));
		eng.err = -FI_EOTHER;
		return;
	}
	onstack();
}

static int engine(void) {
	pthread_once(&eng.once, load_engine);
	return eng.err;
}

// fierr turns the engine's -errno into libfabric's (the same numbers for
// the errno values; FI_EAGAIN is EAGAIN).
static int fierr(int r) { return r; }

// ---- getinfo --------------------------------------------------------------

#define UDW_DGRAM_CAPS (FI_MSG | FI_SEND | FI_RECV | FI_SOURCE | FI_MULTICAST)
#define UDW_DGRAM_TX_CAPS (FI_MSG | FI_SEND | FI_MULTICAST)
#define UDW_DGRAM_RX_CAPS (FI_MSG | FI_RECV | FI_SOURCE | FI_MULTICAST)
#define UDW_RDM_CAPS (FI_MSG | FI_TAGGED | FI_SEND | FI_RECV | FI_SOURCE | FI_DIRECTED_RECV)
#define UDW_RDM_TX_CAPS (FI_MSG | FI_TAGGED | FI_SEND)
#define UDW_RDM_RX_CAPS (FI_MSG | FI_TAGGED | FI_RECV | FI_SOURCE | FI_DIRECTED_RECV)
#define UDW_MSG_CAPS (FI_MSG | FI_SEND | FI_RECV)
#define UDW_MSG_TX_CAPS (FI_MSG | FI_SEND)
#define UDW_MSG_RX_CAPS (FI_MSG | FI_RECV)
#define UDW_COMM (FI_LOCAL_COMM | FI_REMOTE_COMM)
// RMA and atomics, on the RDM endpoint when the program takes the
// provider's keys (rma_ok).
#define UDW_RMA_CAPS (FI_RMA | FI_ATOMIC | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE)
#define UDW_RMA_TX_CAPS (FI_RMA | FI_ATOMIC | FI_READ | FI_WRITE)
#define UDW_RMA_RX_CAPS (FI_RMA | FI_ATOMIC | FI_REMOTE_READ | FI_REMOTE_WRITE)

// rma_ok says whether hints let the RDM endpoint offer RMA and atomics.
// A region's key is its STag, which the provider picks (at random) and
// the target's tagged offsets are zero-based (docs/wire.md 4.4): the
// program must take FI_MR_PROV_KEY, and the address a peer passes is an
// offset into the region (no FI_MR_VIRT_ADDR, which a program that
// offers it must then do without). mr_mode 0 (FI_MR_UNSPEC: since 1.5
// the default, "scalable" registration, keys the program picks),
// FI_MR_SCALABLE (the same) and FI_MR_BASIC (virtual addresses) cannot
// be met; a program that asks for neither FI_RMA nor FI_ATOMIC gets
// what it got before, whatever its mr_mode.
static int rma_ok(const struct fi_info *hints) {
	if (!hints || !hints->domain_attr) return 1;
	int m = hints->domain_attr->mr_mode;
	if (m == FI_MR_UNSPEC || m == FI_MR_BASIC || m == FI_MR_SCALABLE) return 0;
	return (m & FI_MR_PROV_KEY) != 0;
}

// RMA on an RDM endpoint (RD) and on an MSG one (RC); atomics on RDM
// only (ofi_rxm, which layers RDM over MSG, carries its own).
static uint64_t rma_caps_of(enum fi_ep_type t) {
	return t == FI_EP_RDM ? UDW_RMA_CAPS : t == FI_EP_MSG ? UDW_RMA_CAPS & ~(uint64_t)FI_ATOMIC : 0;
}

// What each endpoint type offers.
static uint64_t caps_of(enum fi_ep_type t) {
	return t == FI_EP_RDM ? UDW_RDM_CAPS : t == FI_EP_MSG ? UDW_MSG_CAPS : UDW_DGRAM_CAPS;
}
static uint64_t tx_caps_of(enum fi_ep_type t) {
	return t == FI_EP_RDM ? UDW_RDM_TX_CAPS : t == FI_EP_MSG ? UDW_MSG_TX_CAPS : UDW_DGRAM_TX_CAPS;
}
static uint64_t rx_caps_of(enum fi_ep_type t) {
	return t == FI_EP_RDM ? UDW_RDM_RX_CAPS : t == FI_EP_MSG ? UDW_MSG_RX_CAPS : UDW_DGRAM_RX_CAPS;
}
static size_t max_msg_of(enum fi_ep_type t) {
	return t == FI_EP_RDM ? UDW_RDM_MAX_MSG : t == FI_EP_MSG ? UDW_MSG_MAX_MSG : UDW_MAX_MSG;
}
static uint32_t proto_of(enum fi_ep_type t) {
	return t == FI_EP_RDM ? FI_PROTO_IWARP_RDM : t == FI_EP_MSG ? FI_PROTO_IWARP : FI_PROTO_UDP;
}

// sa_len is the length of a struct sockaddr_in or sockaddr_in6, 0 for
// any other family.
static size_t sa_len(const struct sockaddr *sa) {
	if (!sa) return 0;
	switch (sa->sa_family) {
	case AF_INET: return sizeof(struct sockaddr_in);
	case AF_INET6: return sizeof(struct sockaddr_in6);
	}
	return 0;
}

static uint32_t fmt_of(const struct sockaddr *sa) {
	return sa && sa->sa_family == AF_INET6 ? FI_SOCKADDR_IN6 : FI_SOCKADDR_IN;
}

// hints_fit says whether hints ask for nothing an endpoint of type lacks
// (FI_EP_DGRAM or FI_EP_RDM).
static int hints_fit(const struct fi_info *hints, enum fi_ep_type type) {
	int rdm = type == FI_EP_RDM;
	uint64_t caps = caps_of(type) | UDW_COMM;
	uint64_t txcaps = tx_caps_of(type) | UDW_COMM;
	uint64_t rxcaps = rx_caps_of(type) | UDW_COMM;
	if ((rdm || type == FI_EP_MSG) && rma_ok(hints)) caps |= rma_caps_of(type), txcaps |= rma_caps_of(type) & UDW_RMA_TX_CAPS, rxcaps |= rma_caps_of(type) & UDW_RMA_RX_CAPS;
	if (!hints) return 1;
	if (hints->caps & ~caps) return 0;
	if (hints->ep_attr) {
		if (hints->ep_attr->type != FI_EP_UNSPEC && hints->ep_attr->type != type) return 0;
		if (hints->ep_attr->max_msg_size > max_msg_of(type)) return 0;
		if (hints->ep_attr->protocol != FI_PROTO_UNSPEC && hints->ep_attr->protocol != proto_of(type)) return 0;
	}
	if (hints->domain_attr) {
		if (hints->domain_attr->av_type != FI_AV_UNSPEC && hints->domain_attr->av_type != FI_AV_MAP &&
		    hints->domain_attr->av_type != FI_AV_TABLE)
			return 0;
		if (hints->domain_attr->cq_data_size > (rdm ? 8u : 0u)) return 0;
		// Progress is the caller's (FI_PROGRESS_MANUAL): a program that
		// needs the provider to progress on its own finds no match.
		if (hints->domain_attr->data_progress == FI_PROGRESS_AUTO) return 0;
		if (hints->domain_attr->control_progress == FI_PROGRESS_AUTO) return 0;
	}
	if (hints->fabric_attr && hints->fabric_attr->name && strcmp(hints->fabric_attr->name, UDW_NAME)) return 0;
	if (hints->tx_attr && (hints->tx_attr->caps & ~txcaps)) return 0;
	if (hints->rx_attr && (hints->rx_attr->caps & ~rxcaps)) return 0;
	if (hints->addr_format != FI_FORMAT_UNSPEC && hints->addr_format != FI_SOCKADDR_IN &&
	    hints->addr_format != FI_SOCKADDR_IN6 && hints->addr_format != FI_SOCKADDR)
		return 0;
	return 1;
}

// ep_info makes the fi_info of an endpoint of type (FI_EP_DGRAM,
// FI_EP_RDM) on interface ifname (the domain's name) bound to src (NULL:
// any address), to dest when set.
static struct fi_info *ep_info(const struct fi_info *hints, enum fi_ep_type type, const char *ifname,
			       const struct sockaddr *src, const struct sockaddr *dest) {
	int rdm = type == FI_EP_RDM, msg = type == FI_EP_MSG;
	uint64_t all = caps_of(type);
	if ((rdm || msg) && rma_ok(hints)) all |= rma_caps_of(type);
	struct fi_info *fi = fi_allocinfo();
	if (!fi) return NULL;
	fi->caps = all;
	if (hints && hints->caps) fi->caps = hints->caps & (all | UDW_COMM);
	if (!(fi->caps & (FI_SEND | FI_RECV))) fi->caps |= FI_SEND | FI_RECV;
	if (!(fi->caps & (FI_MSG | FI_TAGGED))) fi->caps |= FI_MSG;
	fi->mode = 0;
	fi->addr_format = fmt_of(src ? src : dest);
	if (src) {
		fi->src_addrlen = sa_len(src);
		fi->src_addr = malloc(fi->src_addrlen);
		if (!fi->src_addr) goto fail;
		memcpy(fi->src_addr, src, fi->src_addrlen);
	}
	if (dest) {
		fi->dest_addrlen = sa_len(dest);
		fi->dest_addr = malloc(fi->dest_addrlen);
		if (!fi->dest_addr) goto fail;
		memcpy(fi->dest_addr, dest, fi->dest_addrlen);
	}
	fi->tx_attr->caps = fi->caps & tx_caps_of(type);
	fi->tx_attr->mode = 0;
	fi->tx_attr->op_flags = 0;
	// RD delivers each peer's messages in order, RC (TCP) its stream.
	fi->tx_attr->msg_order = rdm || msg ? FI_ORDER_SAS : FI_ORDER_NONE;
	fi->tx_attr->comp_order = FI_ORDER_NONE;
	// Every send is copied before the call returns: inject takes all.
	fi->tx_attr->inject_size = rdm ? UDW_RDM_INJECT : msg ? UDW_MSG_INJECT : UDW_MAX_MSG;
	fi->tx_attr->size = rdm ? UDW_RDM_SIZE : UDW_TX_SIZE;
	fi->tx_attr->iov_limit = 1;
	fi->tx_attr->rma_iov_limit = 0;
	if (fi->caps & (FI_RMA | FI_ATOMIC)) {
		fi->tx_attr->caps |= fi->caps & UDW_RMA_TX_CAPS;
		fi->tx_attr->rma_iov_limit = 1; // one local buffer, one remote range
	}
	fi->rx_attr->caps = fi->caps & rx_caps_of(type);
	fi->rx_attr->mode = 0;
	fi->rx_attr->op_flags = 0;
	fi->rx_attr->msg_order = rdm || msg ? FI_ORDER_SAS : FI_ORDER_NONE;
	fi->rx_attr->comp_order = FI_ORDER_NONE;
	fi->rx_attr->total_buffered_recv = rdm ? (size_t)UDW_RDM_SIZE * UDW_RDM_INJECT : 0;
	fi->rx_attr->size = rdm ? UDW_RDM_SIZE : UDW_RX_SIZE;
	fi->rx_attr->iov_limit = 1;
	fi->rx_attr->caps |= fi->caps & UDW_RMA_RX_CAPS;
	fi->ep_attr->type = type;
	fi->ep_attr->protocol = proto_of(type);
	fi->ep_attr->protocol_version = 1;
	fi->ep_attr->max_msg_size = max_msg_of(type);
	fi->ep_attr->msg_prefix_size = 0;
	fi->ep_attr->max_order_raw_size = 0;
	fi->ep_attr->max_order_war_size = 0;
	fi->ep_attr->max_order_waw_size = 0;
	fi->ep_attr->mem_tag_format = rdm ? UDW_TAG_FORMAT : 0;
	fi->ep_attr->tx_ctx_cnt = 1;
	fi->ep_attr->rx_ctx_cnt = 1;
	fi->domain_attr->name = strdup(ifname);
	fi->domain_attr->threading = FI_THREAD_SAFE;
	fi->domain_attr->control_progress = FI_PROGRESS_MANUAL;
	fi->domain_attr->data_progress = FI_PROGRESS_MANUAL;
	fi->domain_attr->resource_mgmt = FI_RM_ENABLED;
	fi->domain_attr->av_type = FI_AV_UNSPEC;
	if (hints && hints->domain_attr && hints->domain_attr->av_type != FI_AV_UNSPEC)
		fi->domain_attr->av_type = hints->domain_attr->av_type;
	fi->domain_attr->mr_mode = 0; // any buffer: the engine copies
	fi->domain_attr->mr_key_size = sizeof(uint64_t);
	if (fi->caps & (FI_RMA | FI_ATOMIC)) {
		// A key is a region's STag, the provider's (rma_ok).
		fi->domain_attr->mr_mode = FI_MR_PROV_KEY;
		fi->domain_attr->mr_key_size = sizeof(uint32_t);
	}
	fi->domain_attr->cq_data_size = rdm ? 8 : 0;
	fi->domain_attr->cq_cnt = 1024;
	fi->domain_attr->ep_cnt = 1024;
	fi->domain_attr->tx_ctx_cnt = 1024;
	fi->domain_attr->rx_ctx_cnt = 1024;
	fi->domain_attr->max_ep_tx_ctx = 1;
	fi->domain_attr->max_ep_rx_ctx = 1;
	fi->domain_attr->mr_iov_limit = 1;
	fi->domain_attr->mr_cnt = 65536;
	fi->fabric_attr->name = strdup(UDW_NAME);
	fi->fabric_attr->prov_version = UDW_VERSION;
	fi->fabric_attr->api_version = UDW_FI_VERSION;
	if (!fi->domain_attr->name || !fi->fabric_attr->name) goto fail;
	return fi;
fail:
	fi_freeinfo(fi);
	return NULL;
}

// resolve fills ss with node:service (NULL node: the wildcard address of
// family fam), returning 0 or -FI_ENODATA.
static int resolve(const char *node, const char *service, int fam, int passive, struct sockaddr_storage *ss) {
	struct addrinfo hints = {.ai_family = fam, .ai_socktype = SOCK_DGRAM, .ai_flags = passive ? AI_PASSIVE : 0}, *res;
	if (getaddrinfo(node, service ? service : "0", &hints, &res) != 0) return -FI_ENODATA;
	memcpy(ss, res->ai_addr, res->ai_addrlen);
	freeaddrinfo(res);
	return 0;
}

// ifname_of names the interface holding addr ("lo", "veth0"), or "udiwarp"
// for the wildcard address.
static void ifname_of(const struct sockaddr *addr, char *name, size_t n) {
	snprintf(name, n, "%s", UDW_NAME);
	struct ifaddrs *ifs;
	if (!addr || getifaddrs(&ifs) != 0) return;
	for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
		if (!i->ifa_addr || i->ifa_addr->sa_family != addr->sa_family) continue;
		if (addr->sa_family == AF_INET &&
		    ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == ((const struct sockaddr_in *)addr)->sin_addr.s_addr) {
			snprintf(name, n, "%s", i->ifa_name);
			break;
		}
		if (addr->sa_family == AF_INET6 && !memcmp(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr,
							   &((const struct sockaddr_in6 *)addr)->sin6_addr, sizeof(struct in6_addr))) {
			snprintf(name, n, "%s", i->ifa_name);
			break;
		}
	}
	freeifaddrs(ifs);
}

static void append(struct fi_info **head, struct fi_info **tail, struct fi_info *fi) {
	if (!*head)
		*head = fi;
	else
		(*tail)->next = fi;
	*tail = fi;
}

static int udw_getinfo(uint32_t version, const char *node, const char *service, uint64_t flags, const struct fi_info *hints,
		       struct fi_info **info) {
	(void)version;
	*info = NULL;
	// The endpoint types the hints take, RDM first (the reliable one, for
	// a program that takes the first entry).
	enum fi_ep_type types[3];
	int ntypes = 0;
	if (hints_fit(hints, FI_EP_RDM)) types[ntypes++] = FI_EP_RDM;
	if (hints_fit(hints, FI_EP_DGRAM)) types[ntypes++] = FI_EP_DGRAM;
	if (hints_fit(hints, FI_EP_MSG)) types[ntypes++] = FI_EP_MSG;
	if (!ntypes) return -FI_ENODATA;
	int fam = AF_UNSPEC;
	if (hints && hints->addr_format == FI_SOCKADDR_IN) fam = AF_INET;
	if (hints && hints->addr_format == FI_SOCKADDR_IN6) fam = AF_INET6;
	struct sockaddr_storage src, dst;
	const struct sockaddr *srcp = NULL, *dstp = NULL;
	if (node || service) {
		int r = resolve(node, service, fam == AF_UNSPEC ? AF_INET : fam, (flags & FI_SOURCE) != 0, (flags & FI_SOURCE) ? &src : &dst);
		if (r) return r;
		if (flags & FI_SOURCE)
			srcp = (struct sockaddr *)&src;
		else
			dstp = (struct sockaddr *)&dst;
	}
	if (hints && hints->src_addr && sa_len(hints->src_addr)) srcp = hints->src_addr;
	if (hints && hints->dest_addr && sa_len(hints->dest_addr)) dstp = hints->dest_addr;
	if (srcp && dstp && srcp->sa_family != dstp->sa_family) return -FI_ENODATA;
	struct fi_info *head = NULL, *tail = NULL;
	const char *want = hints && hints->domain_attr ? hints->domain_attr->name : NULL;
	if (srcp) {
		char name[IF_NAMESIZE + 8];
		ifname_of(srcp, name, sizeof name);
		if (want && strcmp(want, name)) return -FI_ENODATA;
		for (int t = 0; t < ntypes; t++) {
			struct fi_info *fi = ep_info(hints, types[t], name, srcp, dstp);
			if (!fi) {
				fi_freeinfo(head);
				return -FI_ENOMEM;
			}
			append(&head, &tail, fi);
		}
		*info = head;
		return 0;
	}
	// No source given: one fi_info per address of every interface that is
	// up, the family's (IPv4 unless asked): an endpoint bound to an
	// interface's address is reachable there, which the wildcard address,
	// as fi_getname would return it, is not. Loopback is listed only
	// where no other interface is up, or when the hints name it (domain
	// "lo"): a program that spreads its processes over the entries, as
	// Open MPI does over entries of one provider, would otherwise bind
	// some of them to 127.0.0.1, a name no other host can reach.
	struct ifaddrs *ifs;
	if (getifaddrs(&ifs) != 0) return -FI_ENODATA;
	for (int pass = 0; pass < 2 && !head; pass++) {
		for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
			if (!i->ifa_addr || !(i->ifa_flags & IFF_UP)) continue;
			int f = i->ifa_addr->sa_family;
			if (f != AF_INET && f != AF_INET6) continue;
			if (fam == AF_UNSPEC ? f != AF_INET : f != fam) continue;
			if (dstp && f != dstp->sa_family) continue;
			if (((i->ifa_flags & IFF_LOOPBACK) != 0) != (pass == 1)) continue;
			if (f == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr)) continue;
			if (want && strcmp(want, i->ifa_name)) continue;
			struct sockaddr_storage a;
			memcpy(&a, i->ifa_addr, sa_len(i->ifa_addr));
			if (f == AF_INET)
				((struct sockaddr_in *)&a)->sin_port = 0;
			else
				((struct sockaddr_in6 *)&a)->sin6_port = 0;
			for (int t = 0; t < ntypes; t++) {
				struct fi_info *fi = ep_info(hints, types[t], i->ifa_name, (struct sockaddr *)&a, dstp);
				if (!fi) {
					freeifaddrs(ifs);
					fi_freeinfo(head);
					return -FI_ENOMEM;
				}
				append(&head, &tail, fi);
			}
		}
	}
	freeifaddrs(ifs);
	if (!head) return -FI_ENODATA;
	*info = head;
	return 0;
}

// ---- stubs ----------------------------------------------------------------

// Every member of an ops table is called by libfabric's inline wrappers
// without a check, so each is a function: these refuse what the provider
// does not do (libfabric's own fi_no_* are not exported to providers).
static int no_bind(struct fid *f, struct fid *b, uint64_t fl) { (void)f, (void)b, (void)fl; return -FI_ENOSYS; }
static int no_control(struct fid *f, int c, void *a) { (void)f, (void)c, (void)a; return -FI_ENOSYS; }
static int no_ops_open(struct fid *f, const char *n, uint64_t fl, void **o, void *c) {
	(void)f, (void)n, (void)fl, (void)o, (void)c;
	return -FI_ENOSYS;
}
static int no_tostr(const struct fid *f, char *b, size_t l) { (void)f, (void)b, (void)l; return -FI_ENOSYS; }
static int no_ops_set(struct fid *f, const char *n, uint64_t fl, void *o, void *c) {
	(void)f, (void)n, (void)fl, (void)o, (void)c;
	return -FI_ENOSYS;
}

// enosys stands for the members of tables the provider leaves empty
// (tagged, RMA, atomic, collective) whose capabilities fi_getinfo never
// offers: returning an int or ssize_t from registers, it serves every
// signature of those tables, as the x86-64 and AArch64 calling
// conventions let a callee ignore its arguments.
static ssize_t enosys(void) { return -FI_ENOSYS; }
#define ENOSYS_AS(type) ((type)(void (*)(void))enosys)

// ---- fabric, domain, EQ ---------------------------------------------------

struct udw_fabric {
	struct fid_fabric f;
};

struct udw_domain {
	struct fid_domain d;
	struct udw_fabric *fab;
	struct fi_info *info;
	atomic_int refs;
};

// An EQ holds the events of the provider's control path: a DGRAM
// endpoint's FI_JOIN_COMPLETE (fi_join); an MSG endpoint's FI_CONNREQ
// (on its passive endpoint's EQ), FI_CONNECTED and FI_SHUTDOWN, with the
// connection data that came with them, and a failed connection's error
// entry (fi_eq_readerr: FI_ECONNREFUSED, the rejecting peer's data in
// err_data). Events are copied in whole.
struct eq_event {
	uint32_t event;
	size_t len; // bytes of u a read returns
	int err;    // an error entry: errent, for fi_eq_readerr
	struct fi_eq_err_entry errent;
	size_t errdata_len;
	uint8_t errdata[UDW_CM_DATA];
	union {
		struct fi_eq_entry e;
		struct fi_eq_cm_entry cm;
		uint8_t raw[sizeof(struct fi_eq_cm_entry) + UDW_CM_DATA];
	} u;
};

struct udw_ep;

struct udw_eq {
	struct fid_eq e;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int efd; // written at each event: what fi_eq_sread polls beside the MSG endpoints
	struct eq_event *ring;
	size_t cap, head, count;
	struct udw_ep **msg; // the connected MSG endpoints bound to it, whose end it reports
	size_t nmsg;
	uint8_t errdata[UDW_CM_DATA]; // the last error entry's data, for a reader that gave no buffer
};

static int fabric_close(struct fid *fid) {
	free(container_of(fid, struct udw_fabric, f.fid));
	return 0;
}

static int eq_close(struct fid *fid) {
	struct udw_eq *q = container_of(fid, struct udw_eq, e.fid);
	if (q->nmsg) return -FI_EBUSY;
	pthread_mutex_destroy(&q->mu);
	pthread_cond_destroy(&q->cv);
	close(q->efd);
	free(q->ring);
	free(q->msg);
	free(q);
	return 0;
}

// eq_push queues an event (the ring grows rather than lose one).
static int eq_push_locked(struct udw_eq *q, const struct eq_event *ev) {
	if (q->count == q->cap) {
		size_t cap = q->cap ? 2 * q->cap : 16;
		struct eq_event *r = malloc(cap * sizeof *r);
		if (!r) return -FI_ENOMEM;
		for (size_t i = 0; i < q->count; i++) r[i] = q->ring[(q->head + i) % q->cap];
		free(q->ring);
		q->ring = r, q->cap = cap, q->head = 0;
	}
	q->ring[(q->head + q->count) % q->cap] = *ev;
	q->count++;
	pthread_cond_broadcast(&q->cv);
	return 0;
}

// eq_wake wakes a reader waiting in eq_wait.
static void eq_wake(struct udw_eq *q) {
	uint64_t one = 1;
	ssize_t w = write(q->efd, &one, sizeof one);
	(void)w;
}

static int eq_push(struct udw_eq *q, const struct eq_event *ev) {
	pthread_mutex_lock(&q->mu);
	int r = eq_push_locked(q, ev);
	pthread_mutex_unlock(&q->mu);
	if (!r) eq_wake(q);
	return r;
}

static int eq_post(struct udw_eq *q, uint32_t event, const struct fi_eq_entry *entry) {
	struct eq_event ev = {.event = event, .len = sizeof ev.u.e};
	ev.u.e = *entry;
	return eq_push(q, &ev);
}

// eq_post_cm queues a connection event for fid with data (len bytes).
static struct eq_event cm_event(uint32_t event, struct fid *fid, struct fi_info *info, const void *data, size_t len) {
	struct eq_event ev = {.event = event};
	if (len > UDW_CM_DATA) len = UDW_CM_DATA;
	ev.u.cm.fid = fid;
	ev.u.cm.info = info;
	if (len) memcpy(ev.u.cm.data, data, len);
	ev.len = sizeof ev.u.cm + len;
	return ev;
}

static int eq_post_cm(struct udw_eq *q, uint32_t event, struct fid *fid, struct fi_info *info, const void *data, size_t len) {
	struct eq_event ev = cm_event(event, fid, info, data, len);
	return eq_push(q, &ev);
}

// eq_post_err queues an error entry for fid: err a positive errno, data
// (len bytes) the peer's (a rejecting peer's connection data).
static int eq_post_err(struct udw_eq *q, struct fid *fid, void *context, int err, const void *data, size_t len) {
	struct eq_event ev = {.event = 0, .err = 1};
	if (len > UDW_CM_DATA) len = UDW_CM_DATA;
	ev.errent.fid = fid;
	ev.errent.context = context;
	ev.errent.err = err;
	ev.errent.prov_errno = err;
	if (len) memcpy(ev.errdata, data, len);
	ev.errdata_len = len;
	return eq_push(q, &ev);
}

// eq_take copies the next event out; the caller holds the lock.
static ssize_t eq_take(struct udw_eq *q, uint32_t *ev, void *buf, size_t len, uint64_t flags) {
	if (!q->count) return -FI_EAGAIN;
	struct eq_event *e = &q->ring[q->head];
	if (e->err) return -FI_EAVAIL;
	if (len < e->len) return -FI_ETOOSMALL;
	if (ev) *ev = e->event;
	memcpy(buf, &e->u, e->len);
	ssize_t n = (ssize_t)e->len;
	if (!(flags & FI_PEEK)) q->head = (q->head + 1) % q->cap, q->count--;
	return n;
}

static void eq_check_ends(struct udw_eq *q);

static ssize_t eq_read(struct fid_eq *eq, uint32_t *ev, void *buf, size_t len, uint64_t flags) {
	struct udw_eq *q = container_of(eq, struct udw_eq, e);
	eq_check_ends(q);
	pthread_mutex_lock(&q->mu);
	ssize_t r = eq_take(q, ev, buf, len, flags);
	pthread_mutex_unlock(&q->mu);
	return r;
}
static ssize_t eq_readerr(struct fid_eq *eq, struct fi_eq_err_entry *buf, uint64_t flags) {
	struct udw_eq *q = container_of(eq, struct udw_eq, e);
	pthread_mutex_lock(&q->mu);
	if (!q->count || !q->ring[q->head].err) {
		pthread_mutex_unlock(&q->mu);
		return -FI_EAGAIN;
	}
	struct eq_event *e = &q->ring[q->head];
	void *data = buf->err_data;
	size_t room = buf->err_data_size;
	*buf = e->errent;
	// API >= 1.5: a caller's buffer takes the data; without one it points
	// at the EQ's own copy, good until the next readerr.
	if (data && room) {
		size_t n = e->errdata_len < room ? e->errdata_len : room;
		memcpy(data, e->errdata, n);
		buf->err_data = data, buf->err_data_size = n;
	} else {
		memcpy(q->errdata, e->errdata, e->errdata_len);
		buf->err_data = e->errdata_len ? q->errdata : NULL, buf->err_data_size = e->errdata_len;
	}
	if (!(flags & FI_PEEK)) q->head = (q->head + 1) % q->cap, q->count--;
	pthread_mutex_unlock(&q->mu);
	return sizeof *buf;
}
static ssize_t eq_write(struct fid_eq *eq, uint32_t ev, const void *buf, size_t len, uint64_t flags) {
	(void)flags;
	struct eq_event e = {.event = ev, .len = len};
	if (len < sizeof(struct fi_eq_entry) || len > sizeof e.u) return -FI_EINVAL;
	memcpy(&e.u, buf, len);
	int r = eq_push(container_of(eq, struct udw_eq, e), &e);
	return r ? r : (ssize_t)len;
}
// wait_left is what remains of a wait of timeout ms (< 0: for ever)
// begun at start: -1 for ever, 0 once it has run out, else ms.
static int wait_left(const struct timespec *start, int timeout) {
	if (timeout < 0) return -1;
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	long ms = (now.tv_sec - start->tv_sec) * 1000 + (now.tv_nsec - start->tv_nsec) / 1000000;
	return ms >= timeout ? 0 : (int)(timeout - ms);
}

static int eq_wait(struct udw_eq *q, int timeout);
static ssize_t eq_sread(struct fid_eq *eq, uint32_t *ev, void *buf, size_t len, int timeout, uint64_t flags) {
	struct udw_eq *q = container_of(eq, struct udw_eq, e);
	struct timespec start;
	clock_gettime(CLOCK_MONOTONIC, &start);
	for (;;) {
		ssize_t r = eq_read(eq, ev, buf, len, flags);
		if (r != -FI_EAGAIN) return r;
		int left = wait_left(&start, timeout);
		if (!left) return -FI_EAGAIN;
		eq_wait(q, left);
	}
}
static const char *eq_strerror(struct fid_eq *eq, int prov_errno, const void *err_data, char *buf, size_t len) {
	(void)eq, (void)err_data;
	const char *s = strerror(prov_errno);
	if (buf && len) snprintf(buf, len, "%s", s);
	return buf && len ? buf : s;
}

static struct fi_ops eq_fi_ops = {.size = sizeof(struct fi_ops), .close = eq_close, .bind = no_bind, .control = no_control,
				  .ops_open = no_ops_open, .tostr = no_tostr, .ops_set = no_ops_set};
static struct fi_ops_eq eq_ops = {.size = sizeof(struct fi_ops_eq), .read = eq_read, .readerr = eq_readerr, .write = eq_write,
				  .sread = eq_sread, .strerror = eq_strerror};

static int eq_open(struct fid_fabric *fabric, struct fi_eq_attr *attr, struct fid_eq **eq, void *context) {
	(void)fabric;
	if (attr && attr->wait_obj != FI_WAIT_NONE && attr->wait_obj != FI_WAIT_UNSPEC && attr->wait_obj != FI_WAIT_MUTEX_COND)
		return -FI_ENOSYS;
	struct udw_eq *q = calloc(1, sizeof *q);
	if (!q) return -FI_ENOMEM;
	q->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (q->efd < 0) {
		free(q);
		return -FI_ENOMEM;
	}
	pthread_mutex_init(&q->mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_cond_init(&q->cv, &ca);
	pthread_condattr_destroy(&ca);
	q->e.fid.fclass = FI_CLASS_EQ;
	q->e.fid.context = context;
	q->e.fid.ops = &eq_fi_ops;
	q->e.ops = &eq_ops;
	*eq = &q->e;
	return 0;
}

static int domain_open(struct fid_fabric *fabric, struct fi_info *info, struct fid_domain **dom, void *context);
static int fabric_passive_ep(struct fid_fabric *f, struct fi_info *info, struct fid_pep **p, void *context);
static int fabric_wait_open(struct fid_fabric *f, struct fi_wait_attr *a, struct fid_wait **w) {
	(void)f, (void)a, (void)w;
	return -FI_ENOSYS;
}
static int fabric_trywait(struct fid_fabric *f, struct fid **fids, int count);
static int fabric_domain2(struct fid_fabric *f, struct fi_info *i, struct fid_domain **d, uint64_t flags, void *c) {
	if (flags) return -FI_EINVAL;
	return domain_open(f, i, d, c);
}

static struct fi_ops fabric_fi_ops = {.size = sizeof(struct fi_ops), .close = fabric_close, .bind = no_bind, .control = no_control,
				      .ops_open = no_ops_open, .tostr = no_tostr, .ops_set = no_ops_set};
static struct fi_ops_fabric fabric_ops = {.size = sizeof(struct fi_ops_fabric), .domain = domain_open,
					  .passive_ep = fabric_passive_ep, .eq_open = eq_open, .wait_open = fabric_wait_open,
					  .trywait = fabric_trywait, .domain2 = fabric_domain2};

static int udw_fabric(struct fi_fabric_attr *attr, struct fid_fabric **fabric, void *context) {
	if (attr && attr->name && strcmp(attr->name, UDW_NAME)) return -FI_ENODATA;
	struct udw_fabric *f = calloc(1, sizeof *f);
	if (!f) return -FI_ENOMEM;
	f->f.fid.fclass = FI_CLASS_FABRIC;
	f->f.fid.context = context;
	f->f.fid.ops = &fabric_fi_ops;
	f->f.ops = &fabric_ops;
	f->f.api_version = UDW_FI_VERSION;
	*fabric = &f->f;
	return 0;
}

// ---- address vectors ------------------------------------------------------

struct av_entry {
	struct sockaddr_storage sa;
	socklen_t len;
	long long ah; // the engine's address handle; -1: a free entry
};

struct udw_av {
	struct fid_av a;
	pthread_mutex_t mu;
	enum fi_av_type type;
	struct av_entry *e;
	size_t n, cap;
	// A hash of the entries' addresses (index + 1; 0 empty), for FI_SOURCE.
	uint32_t *hash;
	size_t hcap;
};

static uint64_t sa_hash(const struct sockaddr *sa, socklen_t len) {
	uint64_t h = 1469598103934665603ull;
	const unsigned char *p = (const unsigned char *)sa;
	for (socklen_t i = 0; i < len; i++) h = (h ^ p[i]) * 1099511628211ull;
	return h;
}

// sa_same compares two addresses by family, address and port.
static int sa_same(const struct sockaddr *a, const struct sockaddr *b) {
	if (a->sa_family != b->sa_family) return 0;
	if (a->sa_family == AF_INET) {
		const struct sockaddr_in *x = (const void *)a, *y = (const void *)b;
		return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
	}
	const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)b;
	return x->sin6_port == y->sin6_port && !memcmp(&x->sin6_addr, &y->sin6_addr, sizeof x->sin6_addr);
}

// canon copies sa with nothing but family, address and port, so that
// equal addresses hash equal.
static socklen_t canon(const struct sockaddr *sa, struct sockaddr_storage *out) {
	memset(out, 0, sizeof *out);
	if (sa->sa_family == AF_INET) {
		struct sockaddr_in *o = (void *)out;
		const struct sockaddr_in *i = (const void *)sa;
		o->sin_family = AF_INET, o->sin_port = i->sin_port, o->sin_addr = i->sin_addr;
		return sizeof *o;
	}
	struct sockaddr_in6 *o = (void *)out;
	const struct sockaddr_in6 *i = (const void *)sa;
	o->sin6_family = AF_INET6, o->sin6_port = i->sin6_port, o->sin6_addr = i->sin6_addr;
	return sizeof *o;
}

static void av_rehash(struct udw_av *av) {
	size_t cap = av->hcap ? av->hcap : 64;
	while (cap < 2 * av->n + 2) cap *= 2;
	uint32_t *h = calloc(cap, sizeof *h);
	if (!h) return; // FI_SOURCE lookups fall back to a scan
	for (size_t i = 0; i < av->n; i++) {
		if (av->e[i].ah < 0) continue;
		size_t k = sa_hash((struct sockaddr *)&av->e[i].sa, av->e[i].len) & (cap - 1);
		while (h[k]) k = (k + 1) & (cap - 1);
		h[k] = (uint32_t)(i + 1);
	}
	free(av->hash);
	av->hash = h, av->hcap = cap;
}

// av_find returns the fi_addr of sa in av, or FI_ADDR_NOTAVAIL.
static fi_addr_t av_find(struct udw_av *av, const struct sockaddr *sa) {
	struct sockaddr_storage c;
	socklen_t len = canon(sa, &c);
	fi_addr_t r = FI_ADDR_NOTAVAIL;
	pthread_mutex_lock(&av->mu);
	if (av->hash) {
		size_t k = sa_hash((struct sockaddr *)&c, len) & (av->hcap - 1);
		for (; av->hash[k]; k = (k + 1) & (av->hcap - 1)) {
			size_t i = av->hash[k] - 1;
			if (av->e[i].ah >= 0 && sa_same((struct sockaddr *)&av->e[i].sa, sa)) {
				r = i;
				break;
			}
		}
	} else {
		for (size_t i = 0; i < av->n; i++)
			if (av->e[i].ah >= 0 && sa_same((struct sockaddr *)&av->e[i].sa, sa)) {
				r = i;
				break;
			}
	}
	pthread_mutex_unlock(&av->mu);
	return r;
}

// av_ah returns the engine's address handle for fi_addr, or -1.
static long long av_ah(struct udw_av *av, fi_addr_t a) {
	if (!av) return -1;
	pthread_mutex_lock(&av->mu);
	long long ah = a < av->n ? av->e[a].ah : -1;
	pthread_mutex_unlock(&av->mu);
	return ah;
}

static int av_insert(struct fid_av *fav, const void *addr, size_t count, fi_addr_t *fi_addr, uint64_t flags, void *context) {
	(void)context;
	struct udw_av *av = container_of(fav, struct udw_av, a);
	if (flags & ~(uint64_t)FI_MORE) return -FI_EBADFLAGS;
	int r = engine();
	if (r) return r;
	const char *p = addr;
	int ok = 0;
	pthread_mutex_lock(&av->mu);
	for (size_t k = 0; k < count; k++) {
		const struct sockaddr *sa = (const void *)p;
		size_t len = sa_len(sa);
		fi_addr_t out = FI_ADDR_NOTAVAIL;
		long long ah = len ? eng.ah((void *)sa, (int)len) : -FI_EINVAL;
		if (ah >= 0) {
			if (av->n == av->cap) {
				size_t cap = av->cap ? 2 * av->cap : 64;
				struct av_entry *e = realloc(av->e, cap * sizeof *e);
				if (!e) {
					eng.ah_free(ah);
					ah = -FI_ENOMEM;
				} else {
					av->e = e, av->cap = cap;
				}
			}
			if (ah >= 0) {
				struct av_entry *e = &av->e[av->n];
				e->len = canon(sa, &e->sa);
				e->ah = ah;
				out = av->n++;
				ok++;
				if (av->n * 2 + 2 > av->hcap)
					av_rehash(av);
				else {
					size_t h = sa_hash((struct sockaddr *)&e->sa, e->len) & (av->hcap - 1);
					while (av->hash[h]) h = (h + 1) & (av->hcap - 1);
					av->hash[h] = (uint32_t)(out + 1);
				}
			}
		}
		if (fi_addr) fi_addr[k] = out;
		p += len ? len : sizeof(struct sockaddr_in);
	}
	pthread_mutex_unlock(&av->mu);
	return ok;
}

static int av_insertsvc(struct fid_av *fav, const char *node, const char *service, fi_addr_t *fi_addr, uint64_t flags,
			void *context) {
	struct sockaddr_storage ss;
	int r = resolve(node, service, AF_UNSPEC, 0, &ss);
	if (r) return r;
	return av_insert(fav, &ss, 1, fi_addr, flags, context);
}

static int av_insertsym(struct fid_av *a, const char *n, size_t nc, const char *s, size_t sc, fi_addr_t *fa, uint64_t fl, void *c) {
	(void)a, (void)n, (void)nc, (void)s, (void)sc, (void)fa, (void)fl, (void)c;
	return -FI_ENOSYS;
}

static int av_remove(struct fid_av *fav, fi_addr_t *fi_addr, size_t count, uint64_t flags) {
	struct udw_av *av = container_of(fav, struct udw_av, a);
	if (flags) return -FI_EBADFLAGS;
	pthread_mutex_lock(&av->mu);
	for (size_t k = 0; k < count; k++) {
		fi_addr_t a = fi_addr[k];
		if (a < av->n && av->e[a].ah >= 0) {
			eng.ah_free(av->e[a].ah);
			av->e[a].ah = -1;
		}
	}
	av_rehash(av);
	pthread_mutex_unlock(&av->mu);
	return 0;
}

static int av_lookup(struct fid_av *fav, fi_addr_t fi_addr, void *addr, size_t *addrlen) {
	struct udw_av *av = container_of(fav, struct udw_av, a);
	pthread_mutex_lock(&av->mu);
	if (fi_addr >= av->n || av->e[fi_addr].ah < 0) {
		pthread_mutex_unlock(&av->mu);
		return -FI_ENOENT;
	}
	size_t len = av->e[fi_addr].len;
	memcpy(addr, &av->e[fi_addr].sa, len < *addrlen ? len : *addrlen);
	pthread_mutex_unlock(&av->mu);
	*addrlen = len;
	return 0;
}

static const char *av_straddr(struct fid_av *fav, const void *addr, char *buf, size_t *len) {
	(void)fav;
	const struct sockaddr *sa = addr;
	char host[INET6_ADDRSTRLEN] = "?";
	unsigned port = 0;
	if (sa->sa_family == AF_INET) {
		inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, host, sizeof host);
		port = ntohs(((const struct sockaddr_in *)sa)->sin_port);
	} else if (sa->sa_family == AF_INET6) {
		inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, host, sizeof host);
		port = ntohs(((const struct sockaddr_in6 *)sa)->sin6_port);
	}
	int n = snprintf(buf, *len, sa->sa_family == AF_INET6 ? "udiwarp://[%s]:%u" : "udiwarp://%s:%u", host, port);
	*len = (size_t)n + 1;
	return buf;
}

static int av_close(struct fid *fid) {
	struct udw_av *av = container_of(fid, struct udw_av, a.fid);
	for (size_t i = 0; i < av->n; i++)
		if (av->e[i].ah >= 0) eng.ah_free(av->e[i].ah);
	free(av->e);
	free(av->hash);
	pthread_mutex_destroy(&av->mu);
	free(av);
	return 0;
}

static int av_bind(struct fid *fid, struct fid *bfid, uint64_t flags) {
	(void)fid, (void)bfid, (void)flags;
	return -FI_ENOSYS; // no EQ: inserts complete at once (no FI_EVENT)
}

static struct fi_ops av_fi_ops = {.size = sizeof(struct fi_ops), .close = av_close, .bind = av_bind, .control = no_control,
				  .ops_open = no_ops_open, .tostr = no_tostr, .ops_set = no_ops_set};
static struct fi_ops_av av_ops = {.size = sizeof(struct fi_ops_av), .insert = av_insert, .insertsvc = av_insertsvc,
				  .insertsym = av_insertsym, .remove = av_remove, .lookup = av_lookup, .straddr = av_straddr,
				  .av_set = ENOSYS_AS(int (*)(struct fid_av *, struct fi_av_set_attr *, struct fid_av_set **, void *))};

static int av_open(struct fid_domain *dom, struct fi_av_attr *attr, struct fid_av **fav, void *context) {
	(void)dom;
	if (attr->flags & ~(uint64_t)0) return -FI_EBADFLAGS;
	if (attr->name || attr->rx_ctx_bits) return -FI_ENOSYS;
	struct udw_av *av = calloc(1, sizeof *av);
	if (!av) return -FI_ENOMEM;
	pthread_mutex_init(&av->mu, NULL);
	av->type = attr->type == FI_AV_UNSPEC ? FI_AV_TABLE : attr->type;
	attr->type = av->type;
	av->a.fid.fclass = FI_CLASS_AV;
	av->a.fid.context = context;
	av->a.fid.ops = &av_fi_ops;
	av->a.ops = &av_ops;
	av_rehash(av);
	*fav = &av->a;
	return 0;
}

// ---- completion queues ----------------------------------------------------

struct cq_entry {
	struct fi_cq_tagged_entry e;
	fi_addr_t src;
	int err;
	size_t olen;
};

struct udw_ep;

struct udw_cq {
	struct fid_cq c;
	pthread_mutex_t mu;
	enum fi_cq_format format;
	enum fi_wait_obj wait;
	int epfd; // the wait object: the bound endpoints' sockets
	struct cq_entry *ring;
	size_t cap, head, count;
	struct udw_ep **eps;
	size_t neps;
	struct fi_cq_err_entry err; // the error readerr returns
	int has_err;
};

struct udw_ep {
	struct fid_ep ep;
	struct udw_domain *dom;
	struct fi_info *info;
	int fd;
	long long h; // the engine's endpoint, once enabled
	struct udw_cq *txcq, *rxcq;
	struct udw_av *av;
	struct udw_eq *eq;
	uint64_t tx_sel, rx_sel; // FI_SELECTIVE_COMPLETION of each side
	int enabled;
	int rdm; // an FI_EP_RDM endpoint (an RD QP), else FI_EP_DGRAM (UD)
	// MSG endpoints (FI_EP_MSG: an RC QP on a TCP socket).
	int msg;
	int cm;			 // where its connection is: CM_IDLE ... CM_ENDED
	atomic_int ended;	 // FI_SHUTDOWN reported
	int on_eq;		 // in eq->msg
	pthread_t connector;	 // fi_connect's: connect(), then MPA's exchange
	int connecting;		 // connector to be joined
	struct sockaddr_storage peer;
	size_t cm_len;
	uint8_t cm_data[UDW_CM_DATA];
};

enum { CM_IDLE, CM_CONNECTING, CM_ACCEPTING, CM_CONNECTED, CM_ENDED };

static size_t entry_size(enum fi_cq_format f) {
	switch (f) {
	case FI_CQ_FORMAT_CONTEXT: return sizeof(struct fi_cq_entry);
	case FI_CQ_FORMAT_MSG: return sizeof(struct fi_cq_msg_entry);
	case FI_CQ_FORMAT_DATA: return sizeof(struct fi_cq_data_entry);
	case FI_CQ_FORMAT_TAGGED: return sizeof(struct fi_cq_tagged_entry);
	default: return 0;
	}
}

// cq_push queues e; the caller holds the CQ's lock. A full queue drops
// the oldest? No: the ring grows (libfabric's resource management keeps
// what was posted within the queue's size; growing keeps a completion
// rather than losing it).
static void cq_push(struct udw_cq *cq, const struct cq_entry *e) {
	if (cq->count == cq->cap) {
		size_t cap = cq->cap * 2;
		struct cq_entry *r = malloc(cap * sizeof *r);
		if (!r) return;
		for (size_t i = 0; i < cq->count; i++) r[i] = cq->ring[(cq->head + i) % cq->cap];
		free(cq->ring);
		cq->ring = r, cq->cap = cap, cq->head = 0;
	}
	cq->ring[(cq->head + cq->count) % cq->cap] = *e;
	cq->count++;
}

static void msg_check_end(struct udw_ep *ep);
static void msg_eq_remove(struct udw_ep *ep);
static int cm_data_size_opt(int level, int name, void *val, size_t *len);
// op_flags are the completion flags of an RMA or atomic completion
// (struct udwf_comp's op), as fi_cq(3) gives them.
static uint64_t op_flags(uint32_t op) {
	switch (op) {
	case UDWF_OP_WRITE: return FI_RMA | FI_WRITE;
	case UDWF_OP_READ: return FI_RMA | FI_READ;
	case UDWF_OP_ATOMIC: return FI_ATOMIC | FI_WRITE;
	case UDWF_OP_FETCH: return FI_ATOMIC | FI_READ;
	case UDWF_OP_REMOTE_WRITE: return FI_RMA | FI_REMOTE_WRITE;
	}
	return 0;
}

// progress polls every endpoint bound to cq: their completions go to
// their own CQs (a send's to its TX CQ, a receive's to its RX CQ, cq or
// another). The caller holds cq's lock; another CQ's is taken to push.
static void progress(struct udw_cq *cq) {
	struct udwf_comp comps[UDW_POLL_BATCH];
	for (size_t k = 0; k < cq->neps; k++) {
		struct udw_ep *ep = cq->eps[k];
		if (!ep->enabled) continue;
		int n = eng.poll(ep->h, comps, UDW_POLL_BATCH);
		for (int i = 0; i < n; i++) {
			struct udwf_comp *c = &comps[i];
			struct udw_cq *to = c->recv ? ep->rxcq : ep->txcq;
			if (!to) continue;
			struct cq_entry e = {0};
			e.e.op_context = (void *)(uintptr_t)c->ctx;
			e.e.flags = (c->tagged ? FI_TAGGED : FI_MSG) | (c->recv ? FI_RECV : FI_SEND);
			if (c->op) e.e.flags = op_flags(c->op);
			e.e.len = c->len;
			e.e.tag = c->tag;
			if (c->has_data) e.e.data = c->data, e.e.flags |= FI_REMOTE_CQ_DATA;
			e.err = c->err;
			e.olen = c->olen;
			e.src = FI_ADDR_NOTAVAIL;
			if (c->recv && ep->av && (ep->info->caps & FI_SOURCE) && c->srclen)
				e.src = av_find(ep->av, (struct sockaddr *)c->src);
			if (to != cq) pthread_mutex_lock(&to->mu);
			cq_push(to, &e);
			if (to != cq) pthread_mutex_unlock(&to->mu);
		}
		if (ep->msg) msg_check_end(ep);
	}
}

static void write_entry(struct udw_cq *cq, void *buf, const struct cq_entry *e) {
	switch (cq->format) {
	case FI_CQ_FORMAT_CONTEXT: ((struct fi_cq_entry *)buf)->op_context = e->e.op_context; break;
	case FI_CQ_FORMAT_MSG: {
		struct fi_cq_msg_entry *m = buf;
		m->op_context = e->e.op_context, m->flags = e->e.flags, m->len = e->e.len;
		break;
	}
	case FI_CQ_FORMAT_DATA: {
		struct fi_cq_data_entry *d = buf;
		d->op_context = e->e.op_context, d->flags = e->e.flags, d->len = e->e.len, d->buf = NULL, d->data = e->e.data;
		break;
	}
	default: *(struct fi_cq_tagged_entry *)buf = e->e;
	}
}

static ssize_t cq_readfrom(struct fid_cq *fcq, void *buf, size_t count, fi_addr_t *src_addr) {
	struct udw_cq *cq = container_of(fcq, struct udw_cq, c);
	pthread_mutex_lock(&cq->mu);
	if (cq->has_err) {
		pthread_mutex_unlock(&cq->mu);
		return -FI_EAVAIL;
	}
	if (cq->count < count) progress(cq);
	size_t n = 0, sz = entry_size(cq->format);
	while (n < count && cq->count > 0) {
		struct cq_entry *e = &cq->ring[cq->head];
		if (e->err) {
			// An error stops the read here: readerr returns it.
			cq->err = (struct fi_cq_err_entry){.op_context = e->e.op_context, .flags = e->e.flags, .len = e->e.len,
							   .olen = e->olen,
							   .err = e->err == EMSGSIZE ? FI_ETRUNC : e->err == ECANCELED ? FI_ECANCELED : e->err == ENOMSG ? FI_ENOMSG
							      : e->err == EACCES ? FI_EACCES : e->err == EREMOTEIO ? FI_EREMOTEIO
							      : e->err == EINVAL ? FI_EINVAL : FI_EIO,
							   .prov_errno = e->err};
			cq->has_err = 1;
			cq->head = (cq->head + 1) % cq->cap, cq->count--;
			break;
		}
		write_entry(cq, (char *)buf + n * sz, e);
		if (src_addr) src_addr[n] = e->src;
		cq->head = (cq->head + 1) % cq->cap, cq->count--;
		n++;
	}
	int err = cq->has_err;
	pthread_mutex_unlock(&cq->mu);
	if (n) return (ssize_t)n;
	return err ? -FI_EAVAIL : -FI_EAGAIN;
}

static ssize_t cq_read(struct fid_cq *cq, void *buf, size_t count) { return cq_readfrom(cq, buf, count, NULL); }

static ssize_t cq_readerr(struct fid_cq *fcq, struct fi_cq_err_entry *buf, uint64_t flags) {
	(void)flags;
	struct udw_cq *cq = container_of(fcq, struct udw_cq, c);
	pthread_mutex_lock(&cq->mu);
	if (!cq->has_err) {
		pthread_mutex_unlock(&cq->mu);
		return -FI_EAGAIN;
	}
	// The caller's err_data is kept (API >= 1.5: it may offer a buffer);
	// this provider has none to give.
	void *data = buf->err_data;
	size_t dsize = buf->err_data_size;
	*buf = cq->err;
	buf->err_data = data, buf->err_data_size = 0;
	(void)dsize;
	cq->has_err = 0;
	pthread_mutex_unlock(&cq->mu);
	return 1;
}

// wait_ready waits up to timeout ms (< 0: for ever) for a bound socket to
// be readable.
static void wait_ready(struct udw_cq *cq, int timeout) {
	struct epoll_event ev[8];
	epoll_wait(cq->epfd, ev, 8, timeout);
}

static ssize_t cq_sreadfrom(struct fid_cq *fcq, void *buf, size_t count, fi_addr_t *src_addr, const void *cond, int timeout) {
	(void)cond;
	struct udw_cq *cq = container_of(fcq, struct udw_cq, c);
	if (cq->wait == FI_WAIT_NONE) return -FI_ENOSYS;
	struct timespec start;
	clock_gettime(CLOCK_MONOTONIC, &start);
	for (;;) {
		ssize_t r = cq_readfrom(fcq, buf, count, src_addr);
		if (r != -FI_EAGAIN) return r;
		int left = wait_left(&start, timeout);
		if (!left) return -FI_EAGAIN;
		wait_ready(cq, left);
	}
}

static ssize_t cq_sread(struct fid_cq *cq, void *buf, size_t count, const void *cond, int timeout) {
	return cq_sreadfrom(cq, buf, count, NULL, cond, timeout);
}

static int cq_signal(struct fid_cq *cq) {
	(void)cq;
	return -FI_ENOSYS;
}

static const char *cq_strerror(struct fid_cq *cq, int prov_errno, const void *err_data, char *buf, size_t len) {
	(void)cq, (void)err_data;
	const char *s = strerror(prov_errno);
	if (buf && len) snprintf(buf, len, "%s", s);
	return buf && len ? buf : s;
}

static int cq_close(struct fid *fid) {
	struct udw_cq *cq = container_of(fid, struct udw_cq, c.fid);
	if (cq->neps) return -FI_EBUSY;
	if (cq->epfd >= 0) close(cq->epfd);
	free(cq->ring);
	free(cq->eps);
	pthread_mutex_destroy(&cq->mu);
	free(cq);
	return 0;
}

static int cq_control(struct fid *fid, int command, void *arg) {
	struct udw_cq *cq = container_of(fid, struct udw_cq, c.fid);
	switch (command) {
	case FI_GETWAIT:
		if (cq->wait != FI_WAIT_FD) return -FI_ENODATA;
		*(int *)arg = cq->epfd;
		return 0;
	case FI_GETWAITOBJ:
		*(enum fi_wait_obj *)arg = cq->wait;
		return 0;
	}
	return -FI_ENOSYS;
}

static struct fi_ops cq_fi_ops = {.size = sizeof(struct fi_ops), .close = cq_close, .bind = no_bind, .control = cq_control,
				  .ops_open = no_ops_open, .tostr = no_tostr, .ops_set = no_ops_set};
static struct fi_ops_cq cq_ops = {.size = sizeof(struct fi_ops_cq), .read = cq_read, .readfrom = cq_readfrom,
				  .readerr = cq_readerr, .sread = cq_sread, .sreadfrom = cq_sreadfrom, .signal = cq_signal,
				  .strerror = cq_strerror};

static int cq_open(struct fid_domain *dom, struct fi_cq_attr *attr, struct fid_cq **fcq, void *context) {
	(void)dom;
	if (attr->flags & ~(uint64_t)FI_AFFINITY) return -FI_EBADFLAGS;
	enum fi_cq_format fmt = attr->format == FI_CQ_FORMAT_UNSPEC ? FI_CQ_FORMAT_CONTEXT : attr->format;
	if (!entry_size(fmt)) return -FI_ENOSYS;
	enum fi_wait_obj w = attr->wait_obj == FI_WAIT_UNSPEC ? FI_WAIT_FD : attr->wait_obj;
	if (w != FI_WAIT_NONE && w != FI_WAIT_FD) return -FI_ENOSYS;
	if (attr->wait_cond != FI_CQ_COND_NONE) return -FI_ENOSYS;
	struct udw_cq *cq = calloc(1, sizeof *cq);
	if (!cq) return -FI_ENOMEM;
	pthread_mutex_init(&cq->mu, NULL);
	cq->format = fmt;
	cq->wait = w;
	cq->cap = attr->size ? attr->size : 1024;
	cq->ring = calloc(cq->cap, sizeof *cq->ring);
	cq->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (!cq->ring || cq->epfd < 0) {
		if (cq->epfd >= 0) close(cq->epfd);
		free(cq->ring);
		free(cq);
		return -FI_ENOMEM;
	}
	cq->c.fid.fclass = FI_CLASS_CQ;
	cq->c.fid.context = context;
	cq->c.fid.ops = &cq_fi_ops;
	cq->c.ops = &cq_ops;
	*fcq = &cq->c;
	return 0;
}

static int cq_add_ep(struct udw_cq *cq, struct udw_ep *ep) {
	pthread_mutex_lock(&cq->mu);
	for (size_t i = 0; i < cq->neps; i++)
		if (cq->eps[i] == ep) {
			pthread_mutex_unlock(&cq->mu);
			return 0;
		}
	struct udw_ep **e = realloc(cq->eps, (cq->neps + 1) * sizeof *e);
	if (!e) {
		pthread_mutex_unlock(&cq->mu);
		return -FI_ENOMEM;
	}
	cq->eps = e;
	cq->eps[cq->neps++] = ep;
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = ep};
	epoll_ctl(cq->epfd, EPOLL_CTL_ADD, ep->fd, &ev);
	pthread_mutex_unlock(&cq->mu);
	return 0;
}

static void cq_remove_ep(struct udw_cq *cq, struct udw_ep *ep) {
	pthread_mutex_lock(&cq->mu);
	for (size_t i = 0; i < cq->neps; i++)
		if (cq->eps[i] == ep) {
			cq->eps[i] = cq->eps[--cq->neps];
			epoll_ctl(cq->epfd, EPOLL_CTL_DEL, ep->fd, NULL);
			break;
		}
	pthread_mutex_unlock(&cq->mu);
}

static int fabric_trywait(struct fid_fabric *f, struct fid **fids, int count) {
	(void)f;
	for (int i = 0; i < count; i++) {
		if (fids[i]->fclass != FI_CLASS_CQ) return -FI_ENOSYS;
		struct udw_cq *cq = container_of(fids[i], struct udw_cq, c.fid);
		pthread_mutex_lock(&cq->mu);
		if (!cq->count && !cq->has_err) progress(cq);
		int busy = cq->count || cq->has_err;
		pthread_mutex_unlock(&cq->mu);
		if (busy) return -FI_EAGAIN;
	}
	return 0;
}

// ---- memory registration --------------------------------------------------

// A registration only names memory: every send is copied and every
// receive lands in the engine's own buffers, so no key ever travels.
// One with remote access (FI_REMOTE_READ, FI_REMOTE_WRITE) is a region
// of the engine's, for peers' RMA and atomics: its key is its STag.
struct udw_mr {
	struct fid_mr m;
	int remote; // registered with the engine, as STag key
};

static int mr_close(struct fid *fid) {
	struct udw_mr *m = container_of(fid, struct udw_mr, m.fid);
	if (m->remote) eng.mr_dereg((uint32_t)m->m.key);
	free(m);
	return 0;
}

static struct fi_ops mr_fi_ops = {.size = sizeof(struct fi_ops), .close = mr_close, .bind = no_bind, .control = no_control,
				  .ops_open = no_ops_open, .tostr = no_tostr, .ops_set = no_ops_set};

static atomic_ullong mr_keys = 1;

// OFI_MR_NOCACHE: what ofi_rxm passes its core for a registration it
// does not want cached (libfabric's ofi_mr.h); nothing here caches.
#define UDW_MR_NOCACHE (1ULL << 60)

static int mr_regattr(struct fid *fid, const struct fi_mr_attr *attr, uint64_t flags, struct fid_mr **mr) {
	(void)fid;
	if (flags & ~UDW_MR_NOCACHE) return -FI_EBADFLAGS;
	if (attr->iov_count > 1) return -FI_EINVAL;
	struct udw_mr *m = calloc(1, sizeof *m);
	if (!m) return -FI_ENOMEM;
	m->m.fid.fclass = FI_CLASS_MR;
	m->m.fid.context = attr->context;
	m->m.fid.ops = &mr_fi_ops;
	m->m.mem_desc = m;
	m->m.key = atomic_fetch_add(&mr_keys, 1);
	if (attr->access & (FI_REMOTE_READ | FI_REMOTE_WRITE)) {
		// Peers read it (FI_REMOTE_READ), write it and run atomics on
		// its 64-bit words (FI_REMOTE_WRITE), naming it by its STag.
		int r = attr->iov_count != 1 || !attr->mr_iov[0].iov_base || !attr->mr_iov[0].iov_len ? -FI_EINVAL : engine();
		long long k = r ? r
				: eng.mr_reg(attr->mr_iov[0].iov_base, attr->mr_iov[0].iov_len, (attr->access & FI_REMOTE_READ) != 0,
					     (attr->access & FI_REMOTE_WRITE) != 0);
		if (k < 0) {
			free(m);
			return fierr((int)k);
		}
		m->m.key = (uint64_t)k;
		m->remote = 1;
	}
	*mr = &m->m;
	return 0;
}

static int mr_regv(struct fid *fid, const struct iovec *iov, size_t count, uint64_t access, uint64_t offset, uint64_t key,
		   uint64_t flags, struct fid_mr **mr, void *context) {
	struct fi_mr_attr a = {.mr_iov = iov, .iov_count = count, .access = access, .offset = offset, .requested_key = key,
			       .context = context};
	return mr_regattr(fid, &a, flags, mr);
}

static int mr_reg(struct fid *fid, const void *buf, size_t len, uint64_t access, uint64_t offset, uint64_t key,
		  uint64_t flags, struct fid_mr **mr, void *context) {
	struct iovec v = {.iov_base = (void *)buf, .iov_len = len};
	return mr_regv(fid, &v, 1, access, offset, key, flags, mr, context);
}

static struct fi_ops_mr mr_ops = {.size = sizeof(struct fi_ops_mr), .reg = mr_reg, .regv = mr_regv, .regattr = mr_regattr};

// ---- endpoints ------------------------------------------------------------

static int ep_enable(struct udw_ep *ep) {
	if (ep->enabled) return 0;
	if (!ep->txcq || !ep->rxcq) return -FI_ENOCQ;
	if (!ep->av && !ep->msg) return -FI_ENOAV;
	if (ep->msg && !ep->eq) return -FI_ENOEQ;
	int r = engine();
	if (r) return r;
	long long h = ep->msg ? eng.msg_open(ep->fd, (int)ep->info->tx_attr->size, (int)ep->info->rx_attr->size)
			      : eng.ep_open(ep->fd, ep->rdm, (int)ep->info->tx_attr->size, (int)ep->info->rx_attr->size,
					    ep->rdm ? UDW_RDM_MAX_MSG : UDW_MAX_MSG);
	if (h < 0) return fierr((int)h);
	ep->h = h;
	ep->enabled = 1;
	onstack();
	return 0;
}

static int ep_close(struct fid *fid) {
	struct udw_ep *ep = container_of(fid, struct udw_ep, ep.fid);
	if (ep->txcq) cq_remove_ep(ep->txcq, ep);
	if (ep->rxcq && ep->rxcq != ep->txcq) cq_remove_ep(ep->rxcq, ep);
	if (ep->connecting) {
		shutdown(ep->fd, SHUT_RDWR); // the connector's wait ends
		pthread_join(ep->connector, NULL);
	}
	if (ep->msg && ep->eq) msg_eq_remove(ep);
	if (ep->enabled) eng.ep_close(ep->h);
	close(ep->fd);
	fi_freeinfo(ep->info);
	free(ep);
	return 0;
}

static int ep_bind(struct fid *fid, struct fid *bfid, uint64_t flags) {
	struct udw_ep *ep = container_of(fid, struct udw_ep, ep.fid);
	if (ep->enabled) return -FI_EOPBADSTATE;
	switch (bfid->fclass) {
	case FI_CLASS_AV:
		ep->av = container_of(bfid, struct udw_av, a.fid);
		return 0;
	case FI_CLASS_EQ: // its events: fi_join's
		ep->eq = container_of(bfid, struct udw_eq, e.fid);
		return 0;
	case FI_CLASS_CQ: {
		struct udw_cq *cq = container_of(bfid, struct udw_cq, c.fid);
		if (flags & ~(uint64_t)(FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION)) return -FI_EBADFLAGS;
		if (flags & FI_TRANSMIT) {
			ep->txcq = cq;
			ep->tx_sel = flags & FI_SELECTIVE_COMPLETION;
		}
		if (flags & FI_RECV) {
			ep->rxcq = cq;
			ep->rx_sel = flags & FI_SELECTIVE_COMPLETION;
		}
		return cq_add_ep(cq, ep);
	}
	}
	return -FI_ENOSYS;
}

static int ep_control(struct fid *fid, int command, void *arg) {
	struct udw_ep *ep = container_of(fid, struct udw_ep, ep.fid);
	switch (command) {
	case FI_ENABLE: return ep_enable(ep);
	case FI_GETOPSFLAG:
	case FI_SETOPSFLAG: (void)arg; return -FI_ENOSYS;
	}
	return -FI_ENOSYS;
}

static struct fi_ops ep_fi_ops = {.size = sizeof(struct fi_ops), .close = ep_close, .bind = ep_bind, .control = ep_control,
				  .ops_open = no_ops_open, .tostr = no_tostr, .ops_set = no_ops_set};

// cancel: a receive of an RDM endpoint still waiting for its message
// completes with FI_ECANCELED; anything else cannot be cancelled.
static ssize_t ep_cancel(fid_t fid, void *context) {
	struct udw_ep *ep = container_of(fid, struct udw_ep, ep.fid);
	if (!ep->enabled || !ep->rdm) return -FI_ENOENT;
	return eng.cancel(ep->h, (uint64_t)(uintptr_t)context) ? 0 : -FI_ENOENT;
}
static int ep_getopt(fid_t fid, int level, int name, void *val, size_t *len) {
	if (container_of(fid, struct udw_ep, ep.fid)->msg) return cm_data_size_opt(level, name, val, len);
	if (level != FI_OPT_ENDPOINT) return -FI_ENOPROTOOPT;
	if (name == FI_OPT_MIN_MULTI_RECV && val && len && *len >= sizeof(size_t)) return -FI_ENOPROTOOPT;
	return -FI_ENOPROTOOPT;
}
static int ep_setopt(fid_t fid, int level, int name, const void *val, size_t len) {
	(void)fid, (void)name, (void)val, (void)len;
	if (level != FI_OPT_ENDPOINT) return -FI_ENOPROTOOPT;
	return -FI_ENOPROTOOPT;
}
static int ep_tx_ctx(struct fid_ep *s, int i, struct fi_tx_attr *a, struct fid_ep **t, void *c) {
	(void)s, (void)i, (void)a, (void)t, (void)c;
	return -FI_ENOSYS;
}
static int ep_rx_ctx(struct fid_ep *s, int i, struct fi_rx_attr *a, struct fid_ep **r, void *c) {
	(void)s, (void)i, (void)a, (void)r, (void)c;
	return -FI_ENOSYS;
}
static ssize_t ep_size_left(struct fid_ep *ep) {
	(void)ep;
	return -FI_ENOSYS;
}

static struct fi_ops_ep ep_ops = {.size = sizeof(struct fi_ops_ep), .cancel = ep_cancel, .getopt = ep_getopt, .setopt = ep_setopt,
				  .tx_ctx = ep_tx_ctx, .rx_ctx = ep_rx_ctx, .rx_size_left = ep_size_left, .tx_size_left = ep_size_left};

// put_addr copies a socket address of len bytes into addr (room for
// *addrlen): -FI_ETOOSMALL, with the length needed, when it does not fit.
static int put_addr(const struct sockaddr_storage *ss, socklen_t len, void *addr, size_t *addrlen) {
	if (*addrlen < len) {
		*addrlen = len;
		return -FI_ETOOSMALL;
	}
	memcpy(addr, ss, len);
	*addrlen = len;
	return 0;
}

static int sock_name(int fd, void *addr, size_t *addrlen);
static int ep_getname(fid_t fid, void *addr, size_t *addrlen) {
	return sock_name(container_of(fid, struct udw_ep, ep.fid)->fd, addr, addrlen);
}
// ---- MSG endpoints: connections -----------------------------------------
//
// An MSG endpoint is an RC queue pair on a TCP socket of this file's:
// fi_connect connects it and runs MPA's exchange, carrying the
// connection data as MPA private data, on a thread of its own (so that
// fi_connect returns at once and two processes may connect to each other
// at the same time), then posts FI_CONNECTED, or an error entry
// (FI_ECONNREFUSED, with a rejecting peer's data), to the endpoint's EQ.
// A passive endpoint listens on a TCP socket bound when it is made (so
// fi_getname names it before fi_listen); fi_listen starts its thread,
// which accepts connections and, once a connection's whole MPA Request
// is there, posts FI_CONNREQ with the initiator's data and an fi_info
// whose handle names the connection; fi_endpoint on that fi_info and
// fi_accept answer it (FI_CONNECTED follows), fi_reject refuses it. The
// end of a connection (the peer's fi_shutdown or close, or a failure) is
// FI_SHUTDOWN on the endpoint's EQ, reported once, when a read of the EQ
// or of a CQ finds it.

// A connection a passive endpoint accepted, waiting for fi_accept or
// fi_reject: the handle of its FI_CONNREQ's fi_info.
struct udw_connreq {
	struct fid fid;
	int fd;
};

// At most UDW_CONNREQS connections of the process's listeners wait for
// the program's fi_accept or fi_reject at once (each holds a socket and
// an EQ event); a whole MPA Request past that is rejected at once, as a
// listen backlog refuses what it cannot hold.
#define UDW_CONNREQS 256
static atomic_int connreqs;

static int connreq_close(struct fid *fid) {
	struct udw_connreq *c = container_of(fid, struct udw_connreq, fid);
	if (c->fd >= 0) close(c->fd);
	free(c);
	atomic_fetch_sub(&connreqs, 1);
	return 0;
}
static struct fi_ops connreq_fi_ops = {.size = sizeof(struct fi_ops), .close = connreq_close, .bind = no_bind,
				       .control = no_control, .ops_open = no_ops_open, .tostr = no_tostr, .ops_set = no_ops_set};

// At most this many accepted connections wait for their MPA Request at
// once; past it the oldest is dropped (anyone may connect and send
// nothing). One that has sent nothing whole for UDW_CONNREQ_WAIT ms is
// dropped too.
#define UDW_PENDING 64
#define UDW_CONNREQ_WAIT 10000

struct udw_pep {
	struct fid_pep p;
	struct fi_info *info;
	int fd;
	struct udw_eq *eq;
	pthread_t thr;
	int listening;
	int stop[2]; // a pipe: the thread's end
};

static void set_nodelay(int fd) {
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static long long now_ms(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

// connreq_post makes the FI_CONNREQ of the connection on fd, whose
// Request carried data (len bytes); 0 or -errno (the caller closes fd).
static int connreq_post(struct udw_pep *pep, int fd, const void *data, size_t len) {
	if (atomic_fetch_add(&connreqs, 1) >= UDW_CONNREQS) {
		atomic_fetch_sub(&connreqs, 1);
		eng.mpa_reject(fd, NULL, 0);
		return -FI_EBUSY;
	}
	struct udw_connreq *c = calloc(1, sizeof *c);
	if (!c) {
		atomic_fetch_sub(&connreqs, 1);
		return -FI_ENOMEM;
	}
	struct fi_info *info = fi_dupinfo(pep->info);
	if (!info) {
		free(c);
		atomic_fetch_sub(&connreqs, 1);
		return -FI_ENOMEM;
	}
	c->fid.fclass = FI_CLASS_CONNREQ;
	c->fid.ops = &connreq_fi_ops;
	c->fd = fd;
	info->handle = &c->fid;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof ss;
	free(info->src_addr), info->src_addr = NULL, info->src_addrlen = 0;
	free(info->dest_addr), info->dest_addr = NULL, info->dest_addrlen = 0;
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 && (info->src_addr = malloc(sl))) {
		memcpy(info->src_addr, &ss, sl);
		info->src_addrlen = sl;
	}
	sl = sizeof ss;
	if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0 && (info->dest_addr = malloc(sl))) {
		memcpy(info->dest_addr, &ss, sl);
		info->dest_addrlen = sl;
	}
	int r = eq_post_cm(pep->eq, FI_CONNREQ, &pep->p.fid, info, data, len);
	if (r) {
		c->fd = -1; // the caller's to close
		connreq_close(&c->fid);
		fi_freeinfo(info);
	}
	return r;
}

// pep_run accepts connections and posts each one's FI_CONNREQ once its
// whole MPA Request has come, until the stop pipe is written.
static void *pep_run(void *arg) {
	struct udw_pep *pep = arg;
	int fds[UDW_PENDING];
	long long since[UDW_PENDING];
	int n = 0;
	for (;;) {
		struct pollfd p[2 + UDW_PENDING];
		p[0] = (struct pollfd){.fd = pep->stop[0], .events = POLLIN};
		p[1] = (struct pollfd){.fd = pep->fd, .events = POLLIN};
		for (int i = 0; i < n; i++) p[2 + i] = (struct pollfd){.fd = fds[i], .events = POLLIN};
		int r = poll(p, 2 + n, n ? 1000 : -1);
		if (r < 0 && errno != EINTR) break;
		if (p[0].revents) break;
		long long now = now_ms();
		// What waits: a whole Request (FI_CONNREQ), not yet (stay), or
		// anything else (dropped).
		for (int i = n - 1; i >= 0; i--) {
			int keep = 0;
			if (r > 0 && p[2 + i].revents) {
				uint8_t data[UDW_CM_DATA + 8];
				int len = sizeof data;
				int k = eng.mpa_peek(fds[i], data, &len);
				if (k == 0 && len <= UDW_CM_DATA && connreq_post(pep, fds[i], data, (size_t)len) == 0) {
					fds[i] = fds[--n], since[i] = since[n];
					continue;
				}
				keep = k == -EAGAIN;
			} else {
				keep = 1;
			}
			if (keep && now - since[i] < UDW_CONNREQ_WAIT) continue;
			close(fds[i]);
			fds[i] = fds[--n], since[i] = since[n];
		}
		if (r > 0 && p[1].revents) {
			int fd = accept4(pep->fd, NULL, NULL, SOCK_CLOEXEC);
			if (fd >= 0) {
				set_nodelay(fd);
				if (n == UDW_PENDING) {
					int old = 0;
					for (int i = 1; i < n; i++)
						if (since[i] < since[old]) old = i;
					close(fds[old]);
					fds[old] = fds[--n], since[old] = since[n];
				}
				fds[n] = fd, since[n] = now, n++;
			}
		}
	}
	for (int i = 0; i < n; i++) close(fds[i]);
	return NULL;
}

static int pep_close(struct fid *fid) {
	struct udw_pep *pep = container_of(fid, struct udw_pep, p.fid);
	if (pep->listening) {
		char c = 0;
		ssize_t w = write(pep->stop[1], &c, 1);
		(void)w;
		pthread_join(pep->thr, NULL);
	}
	close(pep->stop[0]), close(pep->stop[1]);
	close(pep->fd);
	fi_freeinfo(pep->info);
	free(pep);
	return 0;
}

static int pep_bind(struct fid *fid, struct fid *bfid, uint64_t flags) {
	(void)flags;
	struct udw_pep *pep = container_of(fid, struct udw_pep, p.fid);
	if (bfid->fclass != FI_CLASS_EQ) return -FI_EINVAL;
	if (pep->listening) return -FI_EOPBADSTATE;
	pep->eq = container_of(bfid, struct udw_eq, e.fid);
	return 0;
}

static int cm_data_size_opt(int level, int name, void *val, size_t *len) {
	if (level != FI_OPT_ENDPOINT || name != FI_OPT_CM_DATA_SIZE) return -FI_ENOPROTOOPT;
	if (*len < sizeof(size_t)) {
		*len = sizeof(size_t);
		return -FI_ETOOSMALL;
	}
	*(size_t *)val = UDW_CM_DATA;
	*len = sizeof(size_t);
	return 0;
}

static int pep_getopt(fid_t fid, int level, int name, void *val, size_t *len) {
	(void)fid;
	return cm_data_size_opt(level, name, val, len);
}
static int pep_setopt(fid_t fid, int level, int name, const void *val, size_t len) {
	(void)fid, (void)level, (void)name, (void)val, (void)len;
	return -FI_ENOPROTOOPT;
}

static int sock_name(int fd, void *addr, size_t *addrlen) {
	struct sockaddr_storage ss;
	socklen_t len = sizeof ss;
	if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0) return -errno;
	return put_addr(&ss, len, addr, addrlen);
}

static int pep_getname(fid_t fid, void *addr, size_t *addrlen) {
	return sock_name(container_of(fid, struct udw_pep, p.fid)->fd, addr, addrlen);
}

// pep_setname binds the passive endpoint to addr instead (before
// fi_listen).
static int pep_setname(fid_t fid, void *addr, size_t addrlen) {
	struct udw_pep *pep = container_of(fid, struct udw_pep, p.fid);
	if (pep->listening) return -FI_EOPBADSTATE;
	if (!sa_len(addr) || addrlen < sa_len(addr)) return -FI_EINVAL;
	int fd = socket(((struct sockaddr *)addr)->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) return -errno;
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(fd, addr, (socklen_t)sa_len(addr)) != 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	close(pep->fd);
	pep->fd = fd;
	return 0;
}

static int cm_listen(struct fid_pep *p) {
	struct udw_pep *pep = container_of(p, struct udw_pep, p);
	if (pep->listening) return -FI_EOPBADSTATE;
	if (!pep->eq) return -FI_ENOEQ;
	int r = engine(); // the thread reads MPA Requests with it
	if (r) return r;
	if (listen(pep->fd, 128) != 0) return -errno;
	if (pthread_create(&pep->thr, NULL, pep_run, pep) != 0) return -FI_ENOMEM;
	pep->listening = 1;
	return 0;
}

static int cm_reject(struct fid_pep *p, fid_t handle, const void *param, size_t len) {
	(void)p;
	if (!handle || handle->fclass != FI_CLASS_CONNREQ) return -FI_EINVAL;
	if (len > UDW_CM_DATA) return -FI_EINVAL;
	struct udw_connreq *c = container_of(handle, struct udw_connreq, fid);
	int r = eng.mpa_reject(c->fd, param, (int)len);
	connreq_close(&c->fid);
	return r ? -FI_EOTHER : 0;
}

static struct fi_ops pep_fi_ops = {.size = sizeof(struct fi_ops), .close = pep_close, .bind = pep_bind, .control = no_control,
				   .ops_open = no_ops_open, .tostr = no_tostr, .ops_set = no_ops_set};
static struct fi_ops_ep pep_ep_ops;
static struct fi_ops_cm pep_cm_ops;

static int fabric_passive_ep(struct fid_fabric *f, struct fi_info *info, struct fid_pep **p, void *context) {
	(void)f;
	if (!info || !info->ep_attr || info->ep_attr->type != FI_EP_MSG) return -FI_EINVAL;
	struct udw_pep *pep = calloc(1, sizeof *pep);
	if (!pep) return -FI_ENOMEM;
	pep->info = fi_dupinfo(info);
	if (!pep->info || pipe2(pep->stop, O_CLOEXEC) != 0) {
		fi_freeinfo(pep->info);
		free(pep);
		return -FI_ENOMEM;
	}
	const struct sockaddr *src = info->src_addr;
	struct sockaddr_storage any = {0};
	any.ss_family = AF_INET;
	if (!sa_len(src)) src = (struct sockaddr *)&any;
	pep->fd = -1;
	int r = pep_setname(&pep->p.fid, (void *)src, sa_len(src));
	if (r) {
		close(pep->stop[0]), close(pep->stop[1]);
		fi_freeinfo(pep->info);
		free(pep);
		return r;
	}
	pep->p.fid.fclass = FI_CLASS_PEP;
	pep->p.fid.context = context;
	pep->p.fid.ops = &pep_fi_ops;
	pep->p.ops = &pep_ep_ops;
	pep->p.cm = &pep_cm_ops;
	*p = &pep->p;
	return 0;
}

// msg_eq_add puts a connected MSG endpoint on its EQ's list, whose end
// the EQ's reads report.
static void msg_eq_add(struct udw_ep *ep) {
	struct udw_eq *q = ep->eq;
	pthread_mutex_lock(&q->mu);
	struct udw_ep **m = realloc(q->msg, (q->nmsg + 1) * sizeof *m);
	if (m) {
		q->msg = m;
		q->msg[q->nmsg++] = ep;
		ep->on_eq = 1;
	}
	pthread_mutex_unlock(&q->mu);
}

// msg_eq_remove takes a closing MSG endpoint off its EQ: off the list,
// and its events that nobody read yet out of the queue (a program that
// closes an endpoint frees what its events would name: ofi_rxm's
// connections).
static void msg_eq_remove(struct udw_ep *ep) {
	struct udw_eq *q = ep->eq;
	pthread_mutex_lock(&q->mu);
	for (size_t i = 0; ep->on_eq && i < q->nmsg; i++)
		if (q->msg[i] == ep) {
			q->msg[i] = q->msg[--q->nmsg];
			break;
		}
	ep->on_eq = 0;
	size_t kept = 0;
	for (size_t i = 0; i < q->count; i++) {
		struct eq_event *e = &q->ring[(q->head + i) % q->cap];
		struct fid *f = e->err ? e->errent.fid : e->u.e.fid;
		if (f == &ep->ep.fid) continue;
		q->ring[(q->head + kept) % q->cap] = *e;
		kept++;
	}
	q->count = kept;
	pthread_mutex_unlock(&q->mu);
}

// msg_report_end posts the endpoint's FI_SHUTDOWN, once.
static void msg_report_end(struct udw_ep *ep) {
	int no = 0;
	if (!atomic_compare_exchange_strong(&ep->ended, &no, 1)) return;
	eq_post_cm(ep->eq, FI_SHUTDOWN, &ep->ep.fid, NULL, NULL, 0);
}

// msg_check_end reports the end of a connection the engine has read to
// its end (a CQ's progress).
static void msg_check_end(struct udw_ep *ep) {
	if (ep->cm == CM_CONNECTED && !atomic_load(&ep->ended) && eng.msg_ended(ep->h)) msg_report_end(ep);
}

// eq_check_ends reports the end of the connections of q's endpoints:
// the engine read it, or the socket holds nothing but its end.
static void eq_check_ends(struct udw_eq *q) {
	// Under the EQ's lock: an endpoint on its list is not freed meanwhile
	// (ep_close takes it off first).
	int pushed = 0;
	pthread_mutex_lock(&q->mu);
	for (size_t i = 0; i < q->nmsg; i++) {
		struct udw_ep *ep = q->msg[i];
		if (atomic_load(&ep->ended)) continue;
		char c;
		ssize_t k = recv(ep->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
		int no = 0;
		if ((k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR) || eng.msg_ended(ep->h)) &&
		    atomic_compare_exchange_strong(&ep->ended, &no, 1)) {
			struct eq_event ev = cm_event(FI_SHUTDOWN, &ep->ep.fid, NULL, NULL, 0);
			pushed |= eq_push_locked(q, &ev) == 0;
		}
	}
	pthread_mutex_unlock(&q->mu);
	if (pushed) eq_wake(q);
}

// eq_wait waits up to timeout ms (< 0: for ever) for an event, or for a
// connection of the EQ's endpoints to end.
static int eq_wait(struct udw_eq *q, int timeout) {
	pthread_mutex_lock(&q->mu);
	struct pollfd *p = malloc((1 + q->nmsg) * sizeof *p);
	int n = 0;
	if (p) {
		p[n++] = (struct pollfd){.fd = q->efd, .events = POLLIN};
		for (size_t i = 0; i < q->nmsg; i++)
			if (!atomic_load(&q->msg[i]->ended)) p[n++] = (struct pollfd){.fd = q->msg[i]->fd, .events = POLLRDHUP};
	}
	pthread_mutex_unlock(&q->mu);
	struct pollfd one = {.fd = q->efd, .events = POLLIN};
	int r = p ? poll(p, (nfds_t)n, timeout) : poll(&one, 1, timeout);
	free(p);
	uint64_t v;
	ssize_t k = read(q->efd, &v, sizeof v);
	(void)k;
	return r;
}

// msg_connector connects the endpoint's socket and runs MPA's exchange,
// then posts FI_CONNECTED or the error.
static void *msg_connector(void *arg) {
	struct udw_ep *ep = arg;
	int err = 0;
	uint8_t peer[UDW_CM_DATA];
	int plen = 0;
	if (connect(ep->fd, (struct sockaddr *)&ep->peer, (socklen_t)sa_len((struct sockaddr *)&ep->peer)) != 0) {
		err = errno;
	} else {
		set_nodelay(ep->fd);
		plen = sizeof peer;
		int r = eng.msg_connect(ep->h, ep->cm_data, (int)ep->cm_len, peer, &plen);
		if (r) err = -r;
	}
	if (err) {
		ep->cm = CM_ENDED;
		atomic_store(&ep->ended, 1);
		if (err == ECONNABORTED || err == ETIMEDOUT || err == EPROTO) err = FI_ECONNREFUSED;
		eq_post_err(ep->eq, &ep->ep.fid, ep->ep.fid.context, err, peer, err == ECONNREFUSED ? (size_t)plen : 0);
		return NULL;
	}
	ep->cm = CM_CONNECTED;
	msg_eq_add(ep);
	eq_post_cm(ep->eq, FI_CONNECTED, &ep->ep.fid, NULL, peer, (size_t)plen);
	return NULL;
}

static int ep_enable(struct udw_ep *ep);

static int cm_connect(struct fid_ep *fep, const void *addr, const void *param, size_t len) {
	struct udw_ep *ep = container_of(fep, struct udw_ep, ep);
	if (!ep->msg) return -FI_EOPNOTSUPP;
	if (len > UDW_CM_DATA) return -FI_EINVAL;
	if (!sa_len(addr) && !(ep->info->dest_addr && (addr = ep->info->dest_addr))) return -FI_EINVAL;
	if (!sa_len(addr)) return -FI_EINVAL;
	if (!ep->eq) return -FI_ENOEQ;
	if (!ep->enabled) {
		int r = ep_enable(ep);
		if (r) return r;
	}
	if (ep->cm != CM_IDLE) return -FI_EOPBADSTATE;
	memcpy(&ep->peer, addr, sa_len(addr));
	if (len) memcpy(ep->cm_data, param, len);
	ep->cm_len = len;
	ep->cm = CM_CONNECTING;
	if (pthread_create(&ep->connector, NULL, msg_connector, ep) != 0) {
		ep->cm = CM_IDLE;
		return -FI_ENOMEM;
	}
	ep->connecting = 1;
	return 0;
}

static int cm_accept(struct fid_ep *fep, const void *param, size_t len) {
	struct udw_ep *ep = container_of(fep, struct udw_ep, ep);
	if (!ep->msg) return -FI_EOPNOTSUPP;
	if (len > UDW_CM_DATA) return -FI_EINVAL;
	if (!ep->eq) return -FI_ENOEQ;
	if (!ep->enabled) {
		int r = ep_enable(ep);
		if (r) return r;
	}
	if (ep->cm != CM_ACCEPTING) return -FI_EOPBADSTATE;
	uint8_t peer[UDW_CM_DATA];
	int plen = sizeof peer;
	int r = eng.msg_accept(ep->h, param, (int)len, peer, &plen);
	if (r) {
		ep->cm = CM_ENDED;
		return r == -EPROTO ? -FI_ECONNABORTED : r;
	}
	ep->cm = CM_CONNECTED;
	msg_eq_add(ep);
	return eq_post_cm(ep->eq, FI_CONNECTED, &ep->ep.fid, NULL, NULL, 0);
}

static int cm_shutdown(struct fid_ep *fep, uint64_t flags) {
	(void)flags;
	struct udw_ep *ep = container_of(fep, struct udw_ep, ep);
	if (!ep->msg) return -FI_EOPNOTSUPP;
	if (ep->cm != CM_CONNECTED) return -FI_EOPBADSTATE;
	// The peer's EQ says FI_SHUTDOWN; this one's does not (the program
	// knows).
	atomic_store(&ep->ended, 1);
	shutdown(ep->fd, SHUT_RDWR);
	return 0;
}

static int cm_setname(fid_t f, void *a, size_t l) {
	(void)f, (void)a, (void)l;
	return -FI_ENOSYS;
}

static int cm_getpeer(struct fid_ep *fep, void *addr, size_t *addrlen) {
	struct udw_ep *ep = container_of(fep, struct udw_ep, ep);
	if (!ep->msg) return -FI_EOPNOTSUPP;
	struct sockaddr_storage ss;
	socklen_t len = sizeof ss;
	if (getpeername(ep->fd, (struct sockaddr *)&ss, &len) != 0) return -FI_ENOTCONN;
	return put_addr(&ss, len, addr, addrlen);
}

// A multicast membership (fi_join): its fi_addr is the group's entry in
// the endpoint's AV, to send to; fi_close ends it.
struct udw_mc {
	struct fid_mc mc;
	struct udw_ep *ep;
	struct sockaddr_storage group;
	int member; // joined to receive (not FI_SEND only)
};

static int mc_close(struct fid *fid) {
	struct udw_mc *m = container_of(fid, struct udw_mc, mc.fid);
	if (m->member && m->ep->enabled) eng.join(m->ep->h, &m->group, (int)sa_len((struct sockaddr *)&m->group), 0);
	fi_addr_t a = m->mc.fi_addr;
	av_remove(&m->ep->av->a, &a, 1, 0);
	free(m);
	return 0;
}

static struct fi_ops mc_fi_ops = {.size = sizeof(struct fi_ops), .close = mc_close, .bind = no_bind, .control = no_control,
				  .ops_open = no_ops_open, .tostr = no_tostr, .ops_set = no_ops_set};

// cm_join joins the group at addr (a struct sockaddr_in or _in6 of a
// multicast address and the port the members' sockets are bound to);
// FI_JOIN_COMPLETE goes to the endpoint's EQ. With flags FI_SEND only,
// the endpoint only sends to the group and is not a member.
static int cm_join(struct fid_ep *fep, const void *addr, uint64_t flags, struct fid_mc **mc, void *context) {
	struct udw_ep *ep = container_of(fep, struct udw_ep, ep);
	if (!(ep->info->caps & FI_MULTICAST)) return -FI_EOPNOTSUPP;
	if (flags & ~(uint64_t)(FI_SEND | FI_RECV)) return -FI_EBADFLAGS;
	if (!ep->enabled) return -FI_EOPBADSTATE;
	if (!ep->eq) return -FI_ENOEQ;
	size_t len = sa_len(addr);
	if (!len) return -FI_EINVAL;
	int member = !(flags & FI_SEND) || (flags & FI_RECV);
	if (member) {
		int r = eng.join(ep->h, (void *)addr, (int)len, 1);
		if (r) return r;
	}
	struct udw_mc *m = calloc(1, sizeof *m);
	if (!m) return -FI_ENOMEM;
	m->ep = ep, m->member = member;
	memcpy(&m->group, addr, len);
	fi_addr_t a;
	if (av_insert(&ep->av->a, addr, 1, &a, 0, NULL) != 1) {
		if (member) eng.join(ep->h, (void *)addr, (int)len, 0);
		free(m);
		return -FI_EINVAL;
	}
	m->mc.fid.fclass = FI_CLASS_MC;
	m->mc.fid.context = context;
	m->mc.fid.ops = &mc_fi_ops;
	m->mc.fi_addr = a;
	struct fi_eq_entry ev = {.fid = &m->mc.fid, .context = context};
	int r = eq_post(ep->eq, FI_JOIN_COMPLETE, &ev);
	if (r) {
		mc_close(&m->mc.fid);
		return r;
	}
	*mc = &m->mc;
	return 0;
}

static struct fi_ops_cm cm_ops = {.size = sizeof(struct fi_ops_cm), .setname = cm_setname, .getname = ep_getname,
				  .getpeer = cm_getpeer, .connect = cm_connect, .listen = cm_listen, .accept = cm_accept,
				  .reject = cm_reject, .shutdown = cm_shutdown, .join = cm_join};

// do_send sends one buffer to dest; signaled says whether a completion
// follows.
static ssize_t do_send(struct udw_ep *ep, const void *buf, size_t len, fi_addr_t dest, void *context, int signaled) {
	if (!ep->enabled) return -FI_EOPBADSTATE;
	if (len > UDW_MAX_MSG) return -FI_EMSGSIZE;
	if (len && !buf) return -FI_EINVAL;
	long long ah = av_ah(ep->av, dest);
	if (ah < 0) return -FI_EINVAL; // not an address of the endpoint's AV
	int r = eng.send(ep->h, (void *)buf, len, ah, (uint64_t)(uintptr_t)context, signaled, 0, 0);
	if (r == -EAGAIN) {
		// The send queue is full of completions nobody read: progress
		// so that a caller spinning on FI_EAGAIN makes some.
		pthread_mutex_lock(&ep->txcq->mu);
		progress(ep->txcq);
		pthread_mutex_unlock(&ep->txcq->mu);
		return -FI_EAGAIN;
	}
	return fierr(r);
}

static ssize_t do_recv(struct udw_ep *ep, void *buf, size_t len, void *context) {
	if (!ep->enabled) return -FI_EOPBADSTATE;
	if (len && !buf) return -FI_EINVAL;
	int r = eng.recv(ep->h, buf, len, (uint64_t)(uintptr_t)context);
	return r == -EAGAIN ? -FI_EAGAIN : fierr(r);
}

static ssize_t msg_recv(struct fid_ep *fep, void *buf, size_t len, void *desc, fi_addr_t src, void *context) {
	(void)desc, (void)src;
	return do_recv(container_of(fep, struct udw_ep, ep), buf, len, context);
}

static ssize_t msg_recvv(struct fid_ep *fep, const struct iovec *iov, void **desc, size_t count, fi_addr_t src, void *context) {
	(void)desc, (void)src;
	if (count > 1) return -FI_EINVAL;
	return do_recv(container_of(fep, struct udw_ep, ep), count ? iov[0].iov_base : NULL, count ? iov[0].iov_len : 0, context);
}

static ssize_t msg_recvmsg(struct fid_ep *fep, const struct fi_msg *msg, uint64_t flags) {
	if (flags & ~(uint64_t)(FI_COMPLETION | FI_MULTI_RECV)) return -FI_EBADFLAGS;
	if (flags & FI_MULTI_RECV) return -FI_ENOSYS;
	return msg_recvv(fep, msg->msg_iov, msg->desc, msg->iov_count, msg->addr, msg->context);
}

static ssize_t msg_send(struct fid_ep *fep, const void *buf, size_t len, void *desc, fi_addr_t dest, void *context) {
	(void)desc;
	struct udw_ep *ep = container_of(fep, struct udw_ep, ep);
	return do_send(ep, buf, len, dest, context, 1);
}

static ssize_t msg_sendv(struct fid_ep *fep, const struct iovec *iov, void **desc, size_t count, fi_addr_t dest, void *context) {
	(void)desc;
	if (count > 1) return -FI_EINVAL;
	struct udw_ep *ep = container_of(fep, struct udw_ep, ep);
	return do_send(ep, count ? iov[0].iov_base : NULL, count ? iov[0].iov_len : 0, dest, context, 1);
}

static ssize_t msg_sendmsg(struct fid_ep *fep, const struct fi_msg *msg, uint64_t flags) {
	struct udw_ep *ep = container_of(fep, struct udw_ep, ep);
	if (flags & ~(uint64_t)(FI_COMPLETION | FI_INJECT | FI_INJECT_COMPLETE | FI_TRANSMIT_COMPLETE | FI_DELIVERY_COMPLETE |
				FI_REMOTE_CQ_DATA))
		return -FI_EBADFLAGS;
	if (flags & FI_REMOTE_CQ_DATA) return -FI_ENOSYS; // UD carries no immediate data
	if (msg->iov_count > 1) return -FI_EINVAL;
	int signaled = !ep->tx_sel || (flags & FI_COMPLETION);
	return do_send(ep, msg->iov_count ? msg->msg_iov[0].iov_base : NULL, msg->iov_count ? msg->msg_iov[0].iov_len : 0,
		       msg->addr, msg->context, signaled);
}

static ssize_t msg_inject(struct fid_ep *fep, const void *buf, size_t len, fi_addr_t dest) {
	return do_send(container_of(fep, struct udw_ep, ep), buf, len, dest, NULL, 0);
}

static ssize_t msg_senddata(struct fid_ep *e, const void *b, size_t l, void *d, uint64_t data, fi_addr_t a, void *c) {
	(void)e, (void)b, (void)l, (void)d, (void)data, (void)a, (void)c;
	return -FI_ENOSYS;
}

static ssize_t msg_injectdata(struct fid_ep *e, const void *b, size_t l, uint64_t data, fi_addr_t a) {
	(void)e, (void)b, (void)l, (void)data, (void)a;
	return -FI_ENOSYS;
}

static struct fi_ops_msg msg_ops = {.size = sizeof(struct fi_ops_msg), .recv = msg_recv, .recvv = msg_recvv,
				    .recvmsg = msg_recvmsg, .send = msg_send, .sendv = msg_sendv, .sendmsg = msg_sendmsg,
				    .inject = msg_inject, .senddata = msg_senddata, .injectdata = msg_injectdata};

// ---- MSG: messages on a connection ---------------------------------------

#define MSG_EP(fep) container_of(fep, struct udw_ep, ep)
#define SEND_FLAGS                                                                                                     \
	(FI_COMPLETION | FI_INJECT | FI_INJECT_COMPLETE | FI_TRANSMIT_COMPLETE | FI_DELIVERY_COMPLETE | FI_REMOTE_CQ_DATA)

static ssize_t msg_progress_eagain(struct udw_ep *ep) {
	// The send queue is full of completions nobody read: progress, for a
	// caller that spins on FI_EAGAIN.
	if (ep->txcq) {
		pthread_mutex_lock(&ep->txcq->mu);
		progress(ep->txcq);
		pthread_mutex_unlock(&ep->txcq->mu);
	}
	return -FI_EAGAIN;
}

static ssize_t cm_send(struct udw_ep *ep, const void *buf, size_t len, void *context, int signaled) {
	if (!ep->enabled) return -FI_EOPBADSTATE;
	if (ep->cm != CM_CONNECTED) return -FI_ENOTCONN;
	if (len > UDW_MSG_MAX_MSG) return -FI_EMSGSIZE;
	if (!context && !signaled && len > UDW_MSG_INJECT) return -FI_EMSGSIZE;
	if (len && !buf) return -FI_EINVAL;
	int r = eng.msend(ep->h, (void *)buf, len, (uint64_t)(uintptr_t)context, signaled);
	if (r == -EAGAIN) return msg_progress_eagain(ep);
	if (r == -ENOTCONN) return -FI_ENOTCONN;
	return r;
}

static ssize_t cm_recv(struct udw_ep *ep, void *buf, size_t len, void *context) {
	if (!ep->enabled) return -FI_EOPBADSTATE;
	if (len > UDW_MSG_MAX_MSG) return -FI_EINVAL;
	if (len && !buf) return -FI_EINVAL;
	int r = eng.mrecv(ep->h, buf, len, (uint64_t)(uintptr_t)context);
	return r == -EAGAIN ? -FI_EAGAIN : r;
}

static ssize_t cmsg_recv(struct fid_ep *fep, void *buf, size_t len, void *desc, fi_addr_t src, void *context) {
	(void)desc, (void)src;
	return cm_recv(MSG_EP(fep), buf, len, context);
}
static ssize_t cmsg_recvv(struct fid_ep *fep, const struct iovec *iov, void **desc, size_t count, fi_addr_t src, void *context) {
	(void)desc, (void)src;
	if (count > 1) return -FI_EINVAL;
	return cm_recv(MSG_EP(fep), count ? iov[0].iov_base : NULL, count ? iov[0].iov_len : 0, context);
}
static ssize_t cmsg_recvmsg(struct fid_ep *fep, const struct fi_msg *msg, uint64_t flags) {
	if (flags & ~(uint64_t)FI_COMPLETION) return -FI_EBADFLAGS;
	return cmsg_recvv(fep, msg->msg_iov, msg->desc, msg->iov_count, msg->addr, msg->context);
}
static ssize_t cmsg_send(struct fid_ep *fep, const void *buf, size_t len, void *desc, fi_addr_t dest, void *context) {
	(void)desc, (void)dest;
	return cm_send(MSG_EP(fep), buf, len, context, 1);
}
static ssize_t cmsg_sendv(struct fid_ep *fep, const struct iovec *iov, void **desc, size_t count, fi_addr_t dest, void *context) {
	(void)desc, (void)dest;
	if (count > 1) return -FI_EINVAL;
	return cm_send(MSG_EP(fep), count ? iov[0].iov_base : NULL, count ? iov[0].iov_len : 0, context, 1);
}
static ssize_t cmsg_sendmsg(struct fid_ep *fep, const struct fi_msg *msg, uint64_t flags) {
	struct udw_ep *ep = MSG_EP(fep);
	if (flags & ~(uint64_t)SEND_FLAGS) return -FI_EBADFLAGS;
	if (flags & FI_REMOTE_CQ_DATA) return -FI_EOPNOTSUPP;
	if (msg->iov_count > 1) return -FI_EINVAL;
	return cm_send(ep, msg->iov_count ? msg->msg_iov[0].iov_base : NULL, msg->iov_count ? msg->msg_iov[0].iov_len : 0,
		       msg->context, !ep->tx_sel || (flags & FI_COMPLETION));
}
static ssize_t cmsg_inject(struct fid_ep *fep, const void *buf, size_t len, fi_addr_t dest) {
	(void)dest;
	return cm_send(MSG_EP(fep), buf, len, NULL, 0);
}
static ssize_t cmsg_senddata(struct fid_ep *e, const void *b, size_t l, void *d, uint64_t data, fi_addr_t a, void *c) {
	(void)e, (void)b, (void)l, (void)d, (void)data, (void)a, (void)c;
	return -FI_EOPNOTSUPP; // cq_data_size 0
}
static ssize_t cmsg_injectdata(struct fid_ep *e, const void *b, size_t l, uint64_t data, fi_addr_t a) {
	(void)e, (void)b, (void)l, (void)data, (void)a;
	return -FI_EOPNOTSUPP;
}

static struct fi_ops_msg cm_msg_ops = {.size = sizeof(struct fi_ops_msg), .recv = cmsg_recv, .recvv = cmsg_recvv,
				       .recvmsg = cmsg_recvmsg, .send = cmsg_send, .sendv = cmsg_sendv, .sendmsg = cmsg_sendmsg,
				       .inject = cmsg_inject, .senddata = cmsg_senddata, .injectdata = cmsg_injectdata};

// ---- RDM: messages and tagged messages, matched by the engine ----------

// src_ah is the engine's handle for a receive's source: -1 for any (no
// FI_DIRECTED_RECV, or FI_ADDR_UNSPEC), -2 for an fi_addr the AV never
// gave.
static long long src_ah(struct udw_ep *ep, fi_addr_t src) {
	if (!(ep->info->caps & FI_DIRECTED_RECV) || src == FI_ADDR_UNSPEC) return -1;
	long long ah = av_ah(ep->av, src);
	return ah < 0 ? -2 : ah;
}

static ssize_t rdm_send(struct udw_ep *ep, const void *buf, size_t len, fi_addr_t dest, int tagged, uint64_t tag, int has_data,
			uint64_t data, void *context, int signaled) {
	if (!ep->enabled) return -FI_EOPBADSTATE;
	if (len > UDW_RDM_MAX_MSG) return -FI_EMSGSIZE;
	// An inject (no context, no completion) is copied: at most inject_size.
	if (!context && !signaled && len > UDW_RDM_INJECT) return -FI_EMSGSIZE;
	if (len && !buf) return -FI_EINVAL;
	long long ah = av_ah(ep->av, dest);
	if (ah < 0) return -FI_EINVAL;
	int r = eng.tsend(ep->h, (void *)buf, len, ah, tagged, tag, has_data, data, (uint64_t)(uintptr_t)context, signaled);
	if (r == -EAGAIN) {
		// Every send slot waits for its peer's acknowledgement, which
		// only reading the CQ takes in: progress, for a caller that spins
		// on FI_EAGAIN.
		pthread_mutex_lock(&ep->txcq->mu);
		progress(ep->txcq);
		pthread_mutex_unlock(&ep->txcq->mu);
		return -FI_EAGAIN;
	}
	return fierr(r);
}

static ssize_t rdm_recv(struct udw_ep *ep, void *buf, size_t len, fi_addr_t src, int tagged, uint64_t tag, uint64_t ignore,
			void *context) {
	if (!ep->enabled) return -FI_EOPBADSTATE;
	if (len && !buf) return -FI_EINVAL;
	long long ah = src_ah(ep, src);
	if (ah == -2) return -FI_EINVAL;
	int r = eng.trecv(ep->h, buf, len, ah, tagged, tag, ignore, (uint64_t)(uintptr_t)context);
	return r == -EAGAIN ? -FI_EAGAIN : fierr(r);
}

#define RDM_EP(fep) container_of(fep, struct udw_ep, ep)

static int signaled(struct udw_ep *ep, uint64_t flags) { return !ep->tx_sel || (flags & FI_COMPLETION); }

static ssize_t rmsg_recv(struct fid_ep *fep, void *buf, size_t len, void *desc, fi_addr_t src, void *context) {
	(void)desc;
	return rdm_recv(RDM_EP(fep), buf, len, src, 0, 0, 0, context);
}
static ssize_t rmsg_recvv(struct fid_ep *fep, const struct iovec *iov, void **desc, size_t count, fi_addr_t src, void *context) {
	(void)desc;
	if (count > 1) return -FI_EINVAL;
	return rdm_recv(RDM_EP(fep), count ? iov[0].iov_base : NULL, count ? iov[0].iov_len : 0, src, 0, 0, 0, context);
}
static ssize_t rmsg_recvmsg(struct fid_ep *fep, const struct fi_msg *msg, uint64_t flags) {
	if (flags & ~(uint64_t)FI_COMPLETION) return -FI_EBADFLAGS;
	return rmsg_recvv(fep, msg->msg_iov, msg->desc, msg->iov_count, msg->addr, msg->context);
}
static ssize_t rmsg_send(struct fid_ep *fep, const void *buf, size_t len, void *desc, fi_addr_t dest, void *context) {
	(void)desc;
	return rdm_send(RDM_EP(fep), buf, len, dest, 0, 0, 0, 0, context, 1);
}
static ssize_t rmsg_sendv(struct fid_ep *fep, const struct iovec *iov, void **desc, size_t count, fi_addr_t dest, void *context) {
	(void)desc;
	if (count > 1) return -FI_EINVAL;
	return rdm_send(RDM_EP(fep), count ? iov[0].iov_base : NULL, count ? iov[0].iov_len : 0, dest, 0, 0, 0, 0, context, 1);
}
static ssize_t rmsg_sendmsg(struct fid_ep *fep, const struct fi_msg *msg, uint64_t flags) {
	struct udw_ep *ep = RDM_EP(fep);
	if (flags & ~(uint64_t)SEND_FLAGS) return -FI_EBADFLAGS;
	if (msg->iov_count > 1) return -FI_EINVAL;
	return rdm_send(ep, msg->iov_count ? msg->msg_iov[0].iov_base : NULL, msg->iov_count ? msg->msg_iov[0].iov_len : 0,
			msg->addr, 0, 0, (flags & FI_REMOTE_CQ_DATA) != 0, msg->data, msg->context, signaled(ep, flags));
}
static ssize_t rmsg_inject(struct fid_ep *fep, const void *buf, size_t len, fi_addr_t dest) {
	return rdm_send(RDM_EP(fep), buf, len, dest, 0, 0, 0, 0, NULL, 0);
}
static ssize_t rmsg_senddata(struct fid_ep *fep, const void *buf, size_t len, void *desc, uint64_t data, fi_addr_t dest, void *context) {
	(void)desc;
	return rdm_send(RDM_EP(fep), buf, len, dest, 0, 0, 1, data, context, 1);
}
static ssize_t rmsg_injectdata(struct fid_ep *fep, const void *buf, size_t len, uint64_t data, fi_addr_t dest) {
	return rdm_send(RDM_EP(fep), buf, len, dest, 0, 0, 1, data, NULL, 0);
}

static struct fi_ops_msg rdm_msg_ops = {.size = sizeof(struct fi_ops_msg), .recv = rmsg_recv, .recvv = rmsg_recvv,
					.recvmsg = rmsg_recvmsg, .send = rmsg_send, .sendv = rmsg_sendv, .sendmsg = rmsg_sendmsg,
					.inject = rmsg_inject, .senddata = rmsg_senddata, .injectdata = rmsg_injectdata};

static ssize_t tag_recv(struct fid_ep *fep, void *buf, size_t len, void *desc, fi_addr_t src, uint64_t tag, uint64_t ignore,
			void *context) {
	(void)desc;
	return rdm_recv(RDM_EP(fep), buf, len, src, 1, tag, ignore, context);
}
static ssize_t tag_recvv(struct fid_ep *fep, const struct iovec *iov, void **desc, size_t count, fi_addr_t src, uint64_t tag,
			 uint64_t ignore, void *context) {
	(void)desc;
	if (count > 1) return -FI_EINVAL;
	return rdm_recv(RDM_EP(fep), count ? iov[0].iov_base : NULL, count ? iov[0].iov_len : 0, src, 1, tag, ignore, context);
}
// tag_recvmsg: a receive, or MPI's probes: FI_PEEK looks for a message
// without taking it (its completion has its length, tag and data; none
// found: an error completion, FI_ENOMSG), FI_PEEK | FI_CLAIM sets the
// one found aside for a later FI_CLAIM receive with the same context,
// FI_DISCARD drops it.
static ssize_t tag_recvmsg(struct fid_ep *fep, const struct fi_msg_tagged *msg, uint64_t flags) {
	struct udw_ep *ep = RDM_EP(fep);
	if (flags & ~(uint64_t)(FI_COMPLETION | FI_PEEK | FI_CLAIM | FI_DISCARD)) return -FI_EBADFLAGS;
	if (!ep->enabled) return -FI_EOPBADSTATE;
	if ((flags & FI_DISCARD) && !(flags & (FI_PEEK | FI_CLAIM))) return -FI_EINVAL;
	if (flags & FI_PEEK) {
		long long ah = src_ah(ep, msg->addr);
		if (ah == -2) return -FI_EINVAL;
		return fierr(eng.tpeek(ep->h, ah, 1, msg->tag, msg->ignore, (uint64_t)(uintptr_t)msg->context, (flags & FI_CLAIM) != 0,
				       (flags & FI_DISCARD) != 0));
	}
	if (flags & FI_CLAIM) {
		if (msg->iov_count > 1) return -FI_EINVAL;
		int r = eng.tclaim(ep->h, msg->iov_count ? msg->msg_iov[0].iov_base : NULL, msg->iov_count ? msg->msg_iov[0].iov_len : 0,
				   (uint64_t)(uintptr_t)msg->context, (flags & FI_DISCARD) != 0);
		return r == -ENOENT ? -FI_EINVAL : fierr(r);
	}
	return tag_recvv(fep, msg->msg_iov, msg->desc, msg->iov_count, msg->addr, msg->tag, msg->ignore, msg->context);
}
static ssize_t tag_send(struct fid_ep *fep, const void *buf, size_t len, void *desc, fi_addr_t dest, uint64_t tag, void *context) {
	(void)desc;
	return rdm_send(RDM_EP(fep), buf, len, dest, 1, tag, 0, 0, context, 1);
}
static ssize_t tag_sendv(struct fid_ep *fep, const struct iovec *iov, void **desc, size_t count, fi_addr_t dest, uint64_t tag,
			 void *context) {
	(void)desc;
	if (count > 1) return -FI_EINVAL;
	return rdm_send(RDM_EP(fep), count ? iov[0].iov_base : NULL, count ? iov[0].iov_len : 0, dest, 1, tag, 0, 0, context, 1);
}
static ssize_t tag_sendmsg(struct fid_ep *fep, const struct fi_msg_tagged *msg, uint64_t flags) {
	struct udw_ep *ep = RDM_EP(fep);
	if (flags & ~(uint64_t)SEND_FLAGS) return -FI_EBADFLAGS;
	if (msg->iov_count > 1) return -FI_EINVAL;
	return rdm_send(ep, msg->iov_count ? msg->msg_iov[0].iov_base : NULL, msg->iov_count ? msg->msg_iov[0].iov_len : 0,
			msg->addr, 1, msg->tag, (flags & FI_REMOTE_CQ_DATA) != 0, msg->data, msg->context, signaled(ep, flags));
}
static ssize_t tag_inject(struct fid_ep *fep, const void *buf, size_t len, fi_addr_t dest, uint64_t tag) {
	return rdm_send(RDM_EP(fep), buf, len, dest, 1, tag, 0, 0, NULL, 0);
}
static ssize_t tag_senddata(struct fid_ep *fep, const void *buf, size_t len, void *desc, uint64_t data, fi_addr_t dest,
			    uint64_t tag, void *context) {
	(void)desc;
	return rdm_send(RDM_EP(fep), buf, len, dest, 1, tag, 1, data, context, 1);
}
static ssize_t tag_injectdata(struct fid_ep *fep, const void *buf, size_t len, uint64_t data, fi_addr_t dest, uint64_t tag) {
	return rdm_send(RDM_EP(fep), buf, len, dest, 1, tag, 1, data, NULL, 0);
}

static struct fi_ops_tagged rdm_tagged_ops = {.size = sizeof(struct fi_ops_tagged), .recv = tag_recv, .recvv = tag_recvv,
					      .recvmsg = tag_recvmsg, .send = tag_send, .sendv = tag_sendv, .sendmsg = tag_sendmsg,
					      .inject = tag_inject, .senddata = tag_senddata, .injectdata = tag_injectdata};

// ---- RDM: RMA and atomics, on the engine's memory regions -------------------

// A peer's region is named by its key, its STag (32 bits: mr_key_size 4),
// and an offset into it (no FI_MR_VIRT_ADDR). One local buffer, one
// remote range (iov_limit, rma_iov_limit 1), of up to max_msg_size; an
// atomic is one 64-bit word (count 1).
#define RMA_FLAGS (FI_COMPLETION | FI_INJECT | FI_INJECT_COMPLETE | FI_TRANSMIT_COMPLETE | FI_DELIVERY_COMPLETE | FI_MORE)

// rma_again makes progress for a caller that will spin on -FI_EAGAIN
// (every send slot waits for its peer, which only reading the CQ hears).
static ssize_t rma_again(struct udw_ep *ep) {
	pthread_mutex_lock(&ep->txcq->mu);
	progress(ep->txcq);
	pthread_mutex_unlock(&ep->txcq->mu);
	return -FI_EAGAIN;
}

// rdm_rma writes len bytes at buf into the region of key at offset addr
// of dest (read: reads them from there into buf), with remote CQ data
// when has_data is set; inject: no completion, at most inject_size.
static ssize_t rdm_rma(struct udw_ep *ep, int read, void *buf, size_t len, fi_addr_t dest, uint64_t addr, uint64_t key, int has_data,
		       uint64_t data, void *context, int signaled, int inject) {
	if (!ep->enabled) return -FI_EOPBADSTATE;
	if (!(ep->info->caps & FI_RMA)) return -FI_EOPNOTSUPP;
	if (ep->msg) {
		// An MSG endpoint's peer is its connection's: dest is ignored.
		if (ep->cm != CM_CONNECTED) return -FI_ENOTCONN;
		if (has_data) return -FI_EOPNOTSUPP; // cq_data_size 0
		if (len > UDW_MSG_MAX_MSG || (inject && len > UDW_MSG_INJECT)) return -FI_EMSGSIZE;
	} else if (len > UDW_RDM_MAX_MSG || (inject && len > UDW_RDM_INJECT)) {
		return -FI_EMSGSIZE;
	}
	if ((len && !buf) || key > UINT32_MAX) return -FI_EINVAL; // no key of this provider's is wider than 32 bits
	long long ah = ep->msg ? -1 : av_ah(ep->av, dest);
	if (ah < 0 && !ep->msg) return -FI_EINVAL;
	int r = eng.rma(ep->h, read ? UDWF_OP_READ : UDWF_OP_WRITE, buf, len, ah, (uint32_t)key, addr, has_data, data,
			(uint64_t)(uintptr_t)context, signaled);
	return r == -EAGAIN ? rma_again(ep) : fierr(r);
}

// rma_msg checks an fi_msg_rma: one local buffer (or none) of the remote
// range's length.
static int rma_msg(const struct fi_msg_rma *msg, uint64_t flags, uint64_t allowed) {
	if (flags & ~allowed) return -FI_EBADFLAGS;
	if (msg->iov_count > 1 || msg->rma_iov_count != 1) return -FI_EINVAL;
	return (msg->iov_count ? msg->msg_iov[0].iov_len : 0) == msg->rma_iov[0].len ? 0 : -FI_EINVAL;
}

static ssize_t rma_read(struct fid_ep *fep, void *buf, size_t len, void *desc, fi_addr_t src, uint64_t addr, uint64_t key,
			void *context) {
	(void)desc;
	return rdm_rma(RDM_EP(fep), 1, buf, len, src, addr, key, 0, 0, context, 1, 0);
}
static ssize_t rma_readv(struct fid_ep *fep, const struct iovec *iov, void **desc, size_t count, fi_addr_t src, uint64_t addr,
			 uint64_t key, void *context) {
	(void)desc;
	if (count > 1) return -FI_EINVAL;
	return rdm_rma(RDM_EP(fep), 1, count ? iov[0].iov_base : NULL, count ? iov[0].iov_len : 0, src, addr, key, 0, 0, context, 1, 0);
}
static ssize_t rma_readmsg(struct fid_ep *fep, const struct fi_msg_rma *msg, uint64_t flags) {
	struct udw_ep *ep = RDM_EP(fep);
	int r = rma_msg(msg, flags, RMA_FLAGS & ~(uint64_t)FI_INJECT);
	if (r) return r;
	return rdm_rma(ep, 1, msg->iov_count ? msg->msg_iov[0].iov_base : NULL, msg->rma_iov[0].len, msg->addr, msg->rma_iov[0].addr,
		       msg->rma_iov[0].key, 0, 0, msg->context, signaled(ep, flags), 0);
}
static ssize_t rma_write(struct fid_ep *fep, const void *buf, size_t len, void *desc, fi_addr_t dest, uint64_t addr, uint64_t key,
			 void *context) {
	(void)desc;
	return rdm_rma(RDM_EP(fep), 0, (void *)buf, len, dest, addr, key, 0, 0, context, 1, 0);
}
static ssize_t rma_writev(struct fid_ep *fep, const struct iovec *iov, void **desc, size_t count, fi_addr_t dest, uint64_t addr,
			  uint64_t key, void *context) {
	(void)desc;
	if (count > 1) return -FI_EINVAL;
	return rdm_rma(RDM_EP(fep), 0, count ? iov[0].iov_base : NULL, count ? iov[0].iov_len : 0, dest, addr, key, 0, 0, context, 1, 0);
}
static ssize_t rma_writemsg(struct fid_ep *fep, const struct fi_msg_rma *msg, uint64_t flags) {
	struct udw_ep *ep = RDM_EP(fep);
	int r = rma_msg(msg, flags, RMA_FLAGS | FI_REMOTE_CQ_DATA);
	if (r) return r;
	return rdm_rma(ep, 0, msg->iov_count ? msg->msg_iov[0].iov_base : NULL, msg->rma_iov[0].len, msg->addr, msg->rma_iov[0].addr,
		       msg->rma_iov[0].key, (flags & FI_REMOTE_CQ_DATA) != 0, msg->data, msg->context, signaled(ep, flags),
		       (flags & FI_INJECT) != 0);
}
static ssize_t rma_inject(struct fid_ep *fep, const void *buf, size_t len, fi_addr_t dest, uint64_t addr, uint64_t key) {
	return rdm_rma(RDM_EP(fep), 0, (void *)buf, len, dest, addr, key, 0, 0, NULL, 0, 1);
}
static ssize_t rma_writedata(struct fid_ep *fep, const void *buf, size_t len, void *desc, uint64_t data, fi_addr_t dest, uint64_t addr,
			     uint64_t key, void *context) {
	(void)desc;
	return rdm_rma(RDM_EP(fep), 0, (void *)buf, len, dest, addr, key, 1, data, context, 1, 0);
}
static ssize_t rma_injectdata(struct fid_ep *fep, const void *buf, size_t len, uint64_t data, fi_addr_t dest, uint64_t addr,
			      uint64_t key) {
	return rdm_rma(RDM_EP(fep), 0, (void *)buf, len, dest, addr, key, 1, data, NULL, 0, 1);
}

static struct fi_ops_rma rdm_rma_ops = {.size = sizeof(struct fi_ops_rma), .read = rma_read, .readv = rma_readv,
					.readmsg = rma_readmsg, .write = rma_write, .writev = rma_writev, .writemsg = rma_writemsg,
					.inject = rma_inject, .writedata = rma_writedata, .injectdata = rma_injectdata};

// The atomics of RFC 7306 on one 64-bit word: FetchAdd (FI_SUM, and
// FI_ATOMIC_READ as an add of 0) and CmpSwap (FI_CSWAP), of FI_UINT64
// or FI_INT64 (two's complement: the same add and compare).
enum { ATOMIC_BASE, ATOMIC_FETCH, ATOMIC_COMPARE };

static int atomic_valid(enum fi_datatype dt, enum fi_op op, int kind, size_t *count) {
	if (dt != FI_UINT64 && dt != FI_INT64) return -FI_EOPNOTSUPP;
	switch (kind) {
	case ATOMIC_BASE:
		if (op != FI_SUM) return -FI_EOPNOTSUPP;
		break;
	case ATOMIC_FETCH:
		if (op != FI_SUM && op != FI_ATOMIC_READ) return -FI_EOPNOTSUPP;
		break;
	default:
		if (op != FI_CSWAP) return -FI_EOPNOTSUPP;
	}
	if (count) *count = 1;
	return 0;
}

// rdm_atomic runs op on the word at offset addr of the region of key at
// dest: buf the operand, compare what FI_CSWAP compares with, result
// where the original value goes (ATOMIC_FETCH, ATOMIC_COMPARE).
static ssize_t rdm_atomic(struct udw_ep *ep, int kind, const void *buf, size_t count, const void *compare, void *result, fi_addr_t dest,
			  uint64_t addr, uint64_t key, enum fi_datatype dt, enum fi_op op, void *context, int signaled) {
	if (!ep->enabled) return -FI_EOPBADSTATE;
	if (!(ep->info->caps & FI_ATOMIC)) return -FI_EOPNOTSUPP;
	int r = atomic_valid(dt, op, kind, NULL);
	if (r) return r;
	// One word, 8-byte aligned at the target (an offset into a region
	// whose start is aligned, as allocated memory is; else the target
	// refuses it: an error completion, FI_EINVAL).
	if (count != 1 || addr % 8 || key > UINT32_MAX) return -FI_EINVAL;
	if ((op != FI_ATOMIC_READ && !buf) || (kind == ATOMIC_COMPARE && !compare) || (kind != ATOMIC_BASE && !result)) return -FI_EINVAL;
	long long ah = av_ah(ep->av, dest);
	if (ah < 0) return -FI_EINVAL;
	uint64_t operand = 0, cmp = 0;
	if (op != FI_ATOMIC_READ) memcpy(&operand, buf, sizeof operand);
	if (kind == ATOMIC_COMPARE) memcpy(&cmp, compare, sizeof cmp);
	r = eng.atomic(ep->h, kind == ATOMIC_COMPARE ? UDWF_ATOMIC_CSWAP : UDWF_ATOMIC_ADD, ah, (uint32_t)key, addr, operand, cmp,
		       kind == ATOMIC_BASE ? NULL : result, (uint64_t)(uintptr_t)context, signaled);
	return r == -EAGAIN ? rma_again(ep) : fierr(r);
}

// atomic_msg checks an fi_msg_atomic (and the result and compare ioc
// counts, n of them): one operand, one word.
static int atomic_msg(const struct fi_msg_atomic *msg, uint64_t flags, uint64_t allowed, size_t n1, size_t n2) {
	if (flags & ~allowed) return -FI_EBADFLAGS;
	if (msg->iov_count != 1 || msg->rma_iov_count != 1 || n1 != 1 || n2 != 1) return -FI_EINVAL;
	return msg->msg_iov[0].count == msg->rma_iov[0].count ? 0 : -FI_EINVAL;
}

static ssize_t atomic_write(struct fid_ep *fep, const void *buf, size_t count, void *desc, fi_addr_t dest, uint64_t addr, uint64_t key,
			    enum fi_datatype dt, enum fi_op op, void *context) {
	(void)desc;
	return rdm_atomic(RDM_EP(fep), ATOMIC_BASE, buf, count, NULL, NULL, dest, addr, key, dt, op, context, 1);
}
static ssize_t atomic_writev(struct fid_ep *fep, const struct fi_ioc *iov, void **desc, size_t count, fi_addr_t dest, uint64_t addr,
			     uint64_t key, enum fi_datatype dt, enum fi_op op, void *context) {
	(void)desc;
	if (count != 1) return -FI_EINVAL;
	return rdm_atomic(RDM_EP(fep), ATOMIC_BASE, iov[0].addr, iov[0].count, NULL, NULL, dest, addr, key, dt, op, context, 1);
}
static ssize_t atomic_writemsg(struct fid_ep *fep, const struct fi_msg_atomic *msg, uint64_t flags) {
	struct udw_ep *ep = RDM_EP(fep);
	int r = atomic_msg(msg, flags, RMA_FLAGS, 1, 1);
	if (r) return r;
	return rdm_atomic(ep, ATOMIC_BASE, msg->msg_iov[0].addr, msg->msg_iov[0].count, NULL, NULL, msg->addr, msg->rma_iov[0].addr,
			  msg->rma_iov[0].key, msg->datatype, msg->op, msg->context, signaled(ep, flags));
}
static ssize_t atomic_inject(struct fid_ep *fep, const void *buf, size_t count, fi_addr_t dest, uint64_t addr, uint64_t key,
			     enum fi_datatype dt, enum fi_op op) {
	return rdm_atomic(RDM_EP(fep), ATOMIC_BASE, buf, count, NULL, NULL, dest, addr, key, dt, op, NULL, 0);
}
static ssize_t atomic_readwrite(struct fid_ep *fep, const void *buf, size_t count, void *desc, void *result, void *result_desc,
				fi_addr_t dest, uint64_t addr, uint64_t key, enum fi_datatype dt, enum fi_op op, void *context) {
	(void)desc, (void)result_desc;
	return rdm_atomic(RDM_EP(fep), ATOMIC_FETCH, buf, count, NULL, result, dest, addr, key, dt, op, context, 1);
}
static ssize_t atomic_readwritev(struct fid_ep *fep, const struct fi_ioc *iov, void **desc, size_t count, struct fi_ioc *resultv,
				 void **result_desc, size_t result_count, fi_addr_t dest, uint64_t addr, uint64_t key, enum fi_datatype dt,
				 enum fi_op op, void *context) {
	(void)desc, (void)result_desc;
	if (count != 1 || result_count != 1 || resultv[0].count != iov[0].count) return -FI_EINVAL;
	return rdm_atomic(RDM_EP(fep), ATOMIC_FETCH, iov[0].addr, iov[0].count, NULL, resultv[0].addr, dest, addr, key, dt, op, context, 1);
}
static ssize_t atomic_readwritemsg(struct fid_ep *fep, const struct fi_msg_atomic *msg, struct fi_ioc *resultv, void **result_desc,
				   size_t result_count, uint64_t flags) {
	(void)result_desc;
	struct udw_ep *ep = RDM_EP(fep);
	int r = atomic_msg(msg, flags, RMA_FLAGS & ~(uint64_t)FI_INJECT, result_count, 1);
	if (r) return r;
	if (resultv[0].count != msg->msg_iov[0].count) return -FI_EINVAL;
	return rdm_atomic(ep, ATOMIC_FETCH, msg->msg_iov[0].addr, msg->msg_iov[0].count, NULL, resultv[0].addr, msg->addr,
			  msg->rma_iov[0].addr, msg->rma_iov[0].key, msg->datatype, msg->op, msg->context, signaled(ep, flags));
}
static ssize_t atomic_compwrite(struct fid_ep *fep, const void *buf, size_t count, void *desc, const void *compare, void *compare_desc,
				void *result, void *result_desc, fi_addr_t dest, uint64_t addr, uint64_t key, enum fi_datatype dt,
				enum fi_op op, void *context) {
	(void)desc, (void)compare_desc, (void)result_desc;
	return rdm_atomic(RDM_EP(fep), ATOMIC_COMPARE, buf, count, compare, result, dest, addr, key, dt, op, context, 1);
}
static ssize_t atomic_compwritev(struct fid_ep *fep, const struct fi_ioc *iov, void **desc, size_t count, const struct fi_ioc *comparev,
				 void **compare_desc, size_t compare_count, struct fi_ioc *resultv, void **result_desc, size_t result_count,
				 fi_addr_t dest, uint64_t addr, uint64_t key, enum fi_datatype dt, enum fi_op op, void *context) {
	(void)desc, (void)compare_desc, (void)result_desc;
	if (count != 1 || compare_count != 1 || result_count != 1 || comparev[0].count != iov[0].count || resultv[0].count != iov[0].count)
		return -FI_EINVAL;
	return rdm_atomic(RDM_EP(fep), ATOMIC_COMPARE, iov[0].addr, iov[0].count, comparev[0].addr, resultv[0].addr, dest, addr, key, dt, op,
			  context, 1);
}
static ssize_t atomic_compwritemsg(struct fid_ep *fep, const struct fi_msg_atomic *msg, const struct fi_ioc *comparev,
				   void **compare_desc, size_t compare_count, struct fi_ioc *resultv, void **result_desc,
				   size_t result_count, uint64_t flags) {
	(void)compare_desc, (void)result_desc;
	struct udw_ep *ep = RDM_EP(fep);
	int r = atomic_msg(msg, flags, RMA_FLAGS & ~(uint64_t)FI_INJECT, result_count, compare_count);
	if (r) return r;
	if (resultv[0].count != msg->msg_iov[0].count || comparev[0].count != msg->msg_iov[0].count) return -FI_EINVAL;
	return rdm_atomic(ep, ATOMIC_COMPARE, msg->msg_iov[0].addr, msg->msg_iov[0].count, comparev[0].addr, resultv[0].addr, msg->addr,
			  msg->rma_iov[0].addr, msg->rma_iov[0].key, msg->datatype, msg->op, msg->context, signaled(ep, flags));
}
static int atomic_writevalid(struct fid_ep *fep, enum fi_datatype dt, enum fi_op op, size_t *count) {
	(void)fep;
	return atomic_valid(dt, op, ATOMIC_BASE, count);
}
static int atomic_readwritevalid(struct fid_ep *fep, enum fi_datatype dt, enum fi_op op, size_t *count) {
	(void)fep;
	return atomic_valid(dt, op, ATOMIC_FETCH, count);
}
static int atomic_compwritevalid(struct fid_ep *fep, enum fi_datatype dt, enum fi_op op, size_t *count) {
	(void)fep;
	return atomic_valid(dt, op, ATOMIC_COMPARE, count);
}

static struct fi_ops_atomic rdm_atomic_ops = {
	.size = sizeof(struct fi_ops_atomic), .write = atomic_write, .writev = atomic_writev, .writemsg = atomic_writemsg,
	.inject = atomic_inject, .readwrite = atomic_readwrite, .readwritev = atomic_readwritev, .readwritemsg = atomic_readwritemsg,
	.compwrite = atomic_compwrite, .compwritev = atomic_compwritev, .compwritemsg = atomic_compwritemsg,
	.writevalid = atomic_writevalid, .readwritevalid = atomic_readwritevalid, .compwritevalid = atomic_compwritevalid};

// The tables of what a DGRAM endpoint does not offer (fi_getinfo never
// returns FI_TAGGED, FI_RMA or FI_ATOMIC for it).
static struct fi_ops_tagged tagged_ops = {
	.size = sizeof(struct fi_ops_tagged),
	.recv = ENOSYS_AS(ssize_t(*)(struct fid_ep *, void *, size_t, void *, fi_addr_t, uint64_t, uint64_t, void *)),
	.recvv = ENOSYS_AS(ssize_t(*)(struct fid_ep *, const struct iovec *, void **, size_t, fi_addr_t, uint64_t, uint64_t, void *)),
	.recvmsg = ENOSYS_AS(ssize_t(*)(struct fid_ep *, const struct fi_msg_tagged *, uint64_t)),
	.send = ENOSYS_AS(ssize_t(*)(struct fid_ep *, const void *, size_t, void *, fi_addr_t, uint64_t, void *)),
	.sendv = ENOSYS_AS(ssize_t(*)(struct fid_ep *, const struct iovec *, void **, size_t, fi_addr_t, uint64_t, void *)),
	.sendmsg = ENOSYS_AS(ssize_t(*)(struct fid_ep *, const struct fi_msg_tagged *, uint64_t)),
	.inject = ENOSYS_AS(ssize_t(*)(struct fid_ep *, const void *, size_t, fi_addr_t, uint64_t)),
	.senddata = ENOSYS_AS(ssize_t(*)(struct fid_ep *, const void *, size_t, void *, uint64_t, fi_addr_t, uint64_t, void *)),
	.injectdata = ENOSYS_AS(ssize_t(*)(struct fid_ep *, const void *, size_t, uint64_t, fi_addr_t, uint64_t)),
};

static struct fi_ops_rma rma_ops = {
	.size = sizeof(struct fi_ops_rma),
	.read = ENOSYS_AS(ssize_t(*)(struct fid_ep *, void *, size_t, void *, fi_addr_t, uint64_t, uint64_t, void *)),
	.readv = ENOSYS_AS(ssize_t(*)(struct fid_ep *, const struct iovec *, void **, size_t, fi_addr_t, uint64_t, uint64_t, void *)),
	.readmsg = ENOSYS_AS(ssize_t(*)(struct fid_ep *, const struct fi_msg_rma *, uint64_t)),
	.write = ENOSYS_AS(ssize_t(*)(struct fid_ep *, const void *, size_t, void *, fi_addr_t, uint64_t, uint64_t, void *)),
	.writev = ENOSYS_AS(ssize_t(*)(struct fid_ep *, const struct iovec *, void **, size_t, fi_addr_t, uint64_t, uint64_t, void *)),
	.writemsg = ENOSYS_AS(ssize_t(*)(struct fid_ep *, const struct fi_msg_rma *, uint64_t)),
	.inject = ENOSYS_AS(ssize_t(*)(struct fid_ep *, const void *, size_t, fi_addr_t, uint64_t, uint64_t)),
	.writedata = ENOSYS_AS(ssize_t(*)(struct fid_ep *, const void *, size_t, void *, uint64_t, fi_addr_t, uint64_t, uint64_t, void *)),
	.injectdata = ENOSYS_AS(ssize_t(*)(struct fid_ep *, const void *, size_t, uint64_t, fi_addr_t, uint64_t, uint64_t)),
};

typedef ssize_t (*atomic_fn)(void);
static struct fi_ops_atomic atomic_ops;
static struct fi_ops_collective collective_ops;

// fill_enosys points every member of an ops table after its size at
// enosys: the atomic and collective tables, whose signatures are many.
static void fill_enosys(void *table, size_t size) {
	*(size_t *)table = size;
	void (**fns)(void) = (void (**)(void))((char *)table + sizeof(size_t));
	for (size_t i = 0; i < (size - sizeof(size_t)) / sizeof(void (*)(void)); i++) fns[i] = (void (*)(void))enosys;
}

// msg_ep_open makes an MSG endpoint: on the connection of info's handle
// (an FI_CONNREQ's, for fi_accept), or on a TCP socket of its own, bound
// to info's source address, for fi_connect.
static int msg_ep_open(struct udw_domain *dom, struct fi_info *info, struct fid_ep **fep, void *context) {
	if (info->ep_attr->max_msg_size > UDW_MSG_MAX_MSG) return -FI_EINVAL;
	struct udw_connreq *creq = NULL;
	if (info->handle) {
		if (info->handle->fclass != FI_CLASS_CONNREQ) return -FI_EINVAL;
		creq = container_of(info->handle, struct udw_connreq, fid);
		if (creq->fd < 0) return -FI_EINVAL;
	}
	struct udw_ep *ep = calloc(1, sizeof *ep);
	if (!ep) return -FI_ENOMEM;
	ep->dom = dom;
	ep->msg = 1;
	ep->info = fi_dupinfo(info);
	if (!ep->info) {
		free(ep);
		return -FI_ENOMEM;
	}
	ep->info->handle = NULL;
	if (ep->info->tx_attr->size == 0 || ep->info->tx_attr->size > 65536) ep->info->tx_attr->size = UDW_TX_SIZE;
	if (ep->info->rx_attr->size == 0 || ep->info->rx_attr->size > 65536) ep->info->rx_attr->size = UDW_RX_SIZE;
	if (creq) {
		ep->fd = creq->fd;
		creq->fd = -1;
		connreq_close(&creq->fid);
		info->handle = NULL;
		ep->cm = CM_ACCEPTING;
	} else {
		const struct sockaddr *src = info->src_addr;
		int fam = sa_len(src) ? src->sa_family : info->dest_addr && sa_len(info->dest_addr) ? ((struct sockaddr *)info->dest_addr)->sa_family : AF_INET;
		ep->fd = socket(fam, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (ep->fd < 0 || (sa_len(src) && bind(ep->fd, src, (socklen_t)sa_len(src)) != 0)) {
			int e = errno;
			if (ep->fd >= 0) close(ep->fd);
			fi_freeinfo(ep->info);
			free(ep);
			return -e;
		}
	}
	ep->ep.fid.fclass = FI_CLASS_EP;
	ep->ep.fid.context = context;
	ep->ep.fid.ops = &ep_fi_ops;
	ep->ep.ops = &ep_ops;
	ep->ep.cm = &cm_ops;
	ep->ep.msg = &cm_msg_ops;
	ep->ep.tagged = &tagged_ops;
	ep->ep.rma = &rdm_rma_ops; // an MSG endpoint's RMA: the same calls, on its connection
	ep->ep.atomic = &atomic_ops;
	ep->ep.collective = &collective_ops;
	*fep = &ep->ep;
	return 0;
}

static int ep_open(struct fid_domain *fdom, struct fi_info *info, struct fid_ep **fep, void *context) {
	struct udw_domain *dom = container_of(fdom, struct udw_domain, d);
	if (!info || !info->ep_attr) return -FI_ENOPROTOOPT;
	if (info->ep_attr->type == FI_EP_MSG) return msg_ep_open(dom, info, fep, context);
	if (info->ep_attr->type != FI_EP_DGRAM && info->ep_attr->type != FI_EP_RDM) return -FI_ENOPROTOOPT;
	int rdm = info->ep_attr->type == FI_EP_RDM;
	if (info->ep_attr->max_msg_size > (rdm ? UDW_RDM_MAX_MSG : UDW_MAX_MSG)) return -FI_EINVAL;
	struct udw_ep *ep = calloc(1, sizeof *ep);
	if (!ep) return -FI_ENOMEM;
	ep->dom = dom;
	ep->rdm = rdm;
	ep->info = fi_dupinfo(info);
	if (!ep->info) {
		free(ep);
		return -FI_ENOMEM;
	}
	size_t deflt = rdm ? UDW_RDM_SIZE : UDW_TX_SIZE, most = rdm ? 1024 : 65536;
	if (ep->info->tx_attr->size == 0 || ep->info->tx_attr->size > most) ep->info->tx_attr->size = deflt;
	if (ep->info->rx_attr->size == 0 || ep->info->rx_attr->size > most) ep->info->rx_attr->size = deflt;
	const struct sockaddr *src = info->src_addr;
	int fam = src ? src->sa_family : (info->addr_format == FI_SOCKADDR_IN6 ? AF_INET6 : AF_INET);
	ep->fd = socket(fam, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (ep->fd < 0) {
		int e = errno;
		fi_freeinfo(ep->info);
		free(ep);
		return -e;
	}
	// Several endpoints may bind one port: the members of a multicast
	// group are bound to the group's.
	int one = 1;
	setsockopt(ep->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_storage any = {0};
	any.ss_family = (sa_family_t)fam;
	const struct sockaddr *bind_to = src ? src : (struct sockaddr *)&any;
	if (bind(ep->fd, bind_to, (socklen_t)sa_len(bind_to)) != 0) {
		int e = errno;
		close(ep->fd);
		fi_freeinfo(ep->info);
		free(ep);
		return -e;
	}
	ep->ep.fid.fclass = FI_CLASS_EP;
	ep->ep.fid.context = context;
	ep->ep.fid.ops = &ep_fi_ops;
	ep->ep.ops = &ep_ops;
	ep->ep.cm = &cm_ops;
	ep->ep.msg = rdm ? &rdm_msg_ops : &msg_ops;
	ep->ep.tagged = rdm ? &rdm_tagged_ops : &tagged_ops;
	ep->ep.rma = rdm ? &rdm_rma_ops : &rma_ops;
	ep->ep.atomic = rdm ? &rdm_atomic_ops : &atomic_ops;
	ep->ep.collective = &collective_ops;
	*fep = &ep->ep;
	return 0;
}

static int ep_open2(struct fid_domain *d, struct fi_info *i, struct fid_ep **e, uint64_t flags, void *c) {
	if (flags) return -FI_EBADFLAGS;
	return ep_open(d, i, e, c);
}

// ---- domain ---------------------------------------------------------------

static int domain_close(struct fid *fid) {
	struct udw_domain *d = container_of(fid, struct udw_domain, d.fid);
	fi_freeinfo(d->info);
	free(d);
	return 0;
}

static struct fi_ops domain_fi_ops = {.size = sizeof(struct fi_ops), .close = domain_close, .bind = no_bind,
				      .control = no_control, .ops_open = no_ops_open, .tostr = no_tostr, .ops_set = no_ops_set};

static int dom_scalable_ep(struct fid_domain *d, struct fi_info *i, struct fid_ep **e, void *c) {
	(void)d, (void)i, (void)e, (void)c;
	return -FI_ENOSYS;
}
static int dom_cntr_open(struct fid_domain *d, struct fi_cntr_attr *a, struct fid_cntr **cn, void *c) {
	(void)d, (void)a, (void)cn, (void)c;
	return -FI_ENOSYS;
}
static int dom_poll_open(struct fid_domain *d, struct fi_poll_attr *a, struct fid_poll **p) {
	(void)d, (void)a, (void)p;
	return -FI_ENOSYS;
}
static int dom_stx_ctx(struct fid_domain *d, struct fi_tx_attr *a, struct fid_stx **s, void *c) {
	(void)d, (void)a, (void)s, (void)c;
	return -FI_ENOSYS;
}
static int dom_srx_ctx(struct fid_domain *d, struct fi_rx_attr *a, struct fid_ep **e, void *c) {
	(void)d, (void)a, (void)e, (void)c;
	return -FI_ENOSYS;
}
// dom_query_atomic: what the RDM endpoint's atomics carry out (atomic_valid),
// one 8-byte word a call; none on tagged receive buffers.
static int dom_query_atomic(struct fid_domain *d, enum fi_datatype t, enum fi_op o, struct fi_atomic_attr *a, uint64_t f) {
	(void)d;
	if (f & ~(uint64_t)(FI_FETCH_ATOMIC | FI_COMPARE_ATOMIC | FI_TAGGED)) return -FI_EBADFLAGS;
	if ((f & FI_FETCH_ATOMIC) && (f & FI_COMPARE_ATOMIC)) return -FI_EINVAL;
	if (f & FI_TAGGED) return -FI_EOPNOTSUPP;
	int r = atomic_valid(t, o, f & FI_FETCH_ATOMIC ? ATOMIC_FETCH : f & FI_COMPARE_ATOMIC ? ATOMIC_COMPARE : ATOMIC_BASE,
			     a ? &a->count : NULL);
	if (!r && a) a->size = sizeof(uint64_t);
	return r;
}
static int dom_query_collective(struct fid_domain *d, enum fi_collective_op o, struct fi_collective_attr *a, uint64_t f) {
	(void)d, (void)o, (void)a, (void)f;
	return -FI_ENOSYS;
}

static struct fi_ops_domain domain_ops = {.size = sizeof(struct fi_ops_domain), .av_open = av_open, .cq_open = cq_open,
					  .endpoint = ep_open, .scalable_ep = dom_scalable_ep, .cntr_open = dom_cntr_open,
					  .poll_open = dom_poll_open, .stx_ctx = dom_stx_ctx, .srx_ctx = dom_srx_ctx,
					  .query_atomic = dom_query_atomic, .query_collective = dom_query_collective,
					  .endpoint2 = ep_open2};

static int domain_open(struct fid_fabric *fabric, struct fi_info *info, struct fid_domain **dom, void *context) {
	int r = engine();
	if (r) return r;
	struct udw_domain *d = calloc(1, sizeof *d);
	if (!d) return -FI_ENOMEM;
	d->fab = container_of(fabric, struct udw_fabric, f);
	d->info = fi_dupinfo(info);
	d->d.fid.fclass = FI_CLASS_DOMAIN;
	d->d.fid.context = context;
	d->d.fid.ops = &domain_fi_ops;
	d->d.ops = &domain_ops;
	d->d.mr = &mr_ops;
	*dom = &d->d;
	return 0;
}

// ---- the provider -----------------------------------------------------------

static void udw_cleanup(void) {}

static struct fi_provider udw_prov = {
	.version = UDW_VERSION,
	.fi_version = UDW_FI_VERSION,
	.name = UDW_NAME,
	.getinfo = udw_getinfo,
	.fabric = udw_fabric,
	.cleanup = udw_cleanup,
};

EXPORT struct fi_provider *fi_prov_ini(void) {
	fill_enosys(&pep_ep_ops, sizeof pep_ep_ops);
	pep_ep_ops.getopt = pep_getopt, pep_ep_ops.setopt = pep_setopt;
	fill_enosys(&pep_cm_ops, sizeof pep_cm_ops);
	pep_cm_ops.setname = pep_setname, pep_cm_ops.getname = pep_getname, pep_cm_ops.listen = cm_listen,
	pep_cm_ops.reject = cm_reject;
	fill_enosys(&atomic_ops, sizeof atomic_ops);
	fill_enosys(&collective_ops, sizeof collective_ops);
	return &udw_prov;
}
