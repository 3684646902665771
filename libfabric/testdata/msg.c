// msg.c: what udiwarp's FI_EP_MSG endpoints promise, from libfabric's
// side, in one process (fi_connect never blocks, so a process may connect
// to its own listener, as ofi_rxm does):
//   - a passive endpoint's name before fi_listen, FI_OPT_CM_DATA_SIZE;
//   - connection data both ways: fi_connect's in FI_CONNREQ, fi_accept's
//     in the initiator's FI_CONNECTED;
//   - a send before the connection is up: -FI_ENOTCONN; connection data
//     over the limit: -FI_EINVAL;
//   - messages (small, and 1 MiB from the caller's own buffer) with every
//     byte checked; RDMA Write and Read on a registered region;
//   - fi_shutdown: FI_SHUTDOWN on the peer's EQ;
//   - fi_reject with data: an error entry, FI_ECONNREFUSED, its data;
//   - a connection to a port nobody listens on: FI_ECONNREFUSED;
//   - strangers on the listening port (bytes that are no MPA Request,
//     more idle connections than the listener keeps, more whole Requests
//     than may wait for the program: the rest are rejected) change
//     nothing for the next real connection.
// Usage: msg. Prints "ok: msg" when every check passed.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "check.h"

static struct fid_fabric *fabric;
static struct fid_domain *domain;
static struct fid_eq *eq;
static struct fi_info *info;

struct end {
	struct fid_ep *ep;
	struct fid_cq *cq;
};

static void open_end(struct end *e, struct fi_info *fi) {
	struct fi_cq_attr ca = {.format = FI_CQ_FORMAT_DATA, .wait_obj = FI_WAIT_NONE, .size = 64};
	CHECK(fi_cq_open(domain, &ca, &e->cq, NULL) == 0, "cq");
	int r = fi_endpoint(domain, fi, &e->ep, e);
	CHECK(r == 0, "fi_endpoint: %d", r);
	CHECK(fi_ep_bind(e->ep, &eq->fid, 0) == 0, "bind eq");
	CHECK(fi_ep_bind(e->ep, &e->cq->fid, FI_TRANSMIT | FI_RECV) == 0, "bind cq");
	CHECK(fi_enable(e->ep) == 0, "enable");
}

static void close_end(struct end *e) {
	CHECK(fi_close(&e->ep->fid) == 0, "close ep");
	CHECK(fi_close(&e->cq->fid) == 0, "close cq");
}

// event reads the next EQ event (waiting 10 s at most) into buf and
// returns its type; its length in *len.
static uint32_t event(void *buf, size_t room, ssize_t *len) {
	uint32_t ev = 0;
	ssize_t n = fi_eq_sread(eq, &ev, buf, room, 10000, 0);
	CHECK(n > 0, "fi_eq_sread: %zd (%s)", n, fi_strerror((int)-n));
	*len = n;
	return ev;
}

// connect_pair connects client c (made from a copy of info aimed at the
// listener's name) to the listener, which accepts it as s; with their
// connection data checked.
static void connect_pair(struct fid_pep *pep, const void *name, size_t namelen, struct end *c, struct end *s) {
	struct fi_info *ci = fi_dupinfo(info);
	free(ci->dest_addr);
	ci->dest_addr = malloc(namelen);
	memcpy(ci->dest_addr, name, namelen);
	ci->dest_addrlen = namelen;
	free(ci->src_addr), ci->src_addr = NULL, ci->src_addrlen = 0;
	open_end(c, ci);
	char buf[64];
	CHECK(fi_send(c->ep, buf, 8, NULL, 0, NULL) == -FI_ENOTCONN, "a send before connecting");
	CHECK(fi_recv(c->ep, NULL, 0, NULL, 0, NULL) == 0, "a zero-length receive before connecting");
	CHECK(fi_connect(c->ep, name, "hello-cm", 8) == 0, "fi_connect");
	uint8_t ev[sizeof(struct fi_eq_cm_entry) + 256];
	struct fi_eq_cm_entry *cm = (void *)ev;
	ssize_t len;
	CHECK(event(ev, sizeof ev, &len) == FI_CONNREQ, "not FI_CONNREQ");
	CHECK(len == (ssize_t)sizeof *cm + 8 && !memcmp(cm->data, "hello-cm", 8), "FI_CONNREQ's data: %zd bytes", len);
	CHECK(cm->fid == &pep->fid && cm->info && cm->info->handle, "FI_CONNREQ's fid and handle");
	CHECK(cm->info->dest_addr != NULL, "FI_CONNREQ's info names the peer");
	struct fi_info *si = cm->info;
	open_end(s, si);
	fi_freeinfo(si);
	CHECK(fi_recv(s->ep, NULL, 0, NULL, 0, NULL) == 0, "a zero-length receive before accepting");
	CHECK(fi_accept(s->ep, "welcome", 7) == 0, "fi_accept");
	int got = 0;
	for (int i = 0; i < 2; i++) {
		CHECK(event(ev, sizeof ev, &len) == FI_CONNECTED, "not FI_CONNECTED");
		if (cm->fid == &c->ep->fid) {
			CHECK(len == (ssize_t)sizeof *cm + 7 && !memcmp(cm->data, "welcome", 7), "the initiator's FI_CONNECTED: %zd bytes", len);
			got |= 1;
		} else {
			CHECK(cm->fid == &s->ep->fid && len == (ssize_t)sizeof *cm, "the responder's FI_CONNECTED");
			got |= 2;
		}
	}
	CHECK(got == 3, "both ends connected");
	// The zero-length receives posted before the connection complete
	// with the zero-length sends that follow.
	CHECK(fi_send(c->ep, NULL, 0, NULL, 0, &got) == 0, "a zero-length send");
	CHECK(fi_send(s->ep, NULL, 0, NULL, 0, &got) == 0, "a zero-length send back");
	int sends = 0, recvs = 0;
	while (sends < 2 || recvs < 2) {
		struct fi_cq_data_entry e;
		for (int k = 0; k < 2; k++) {
			struct end *x = k ? s : c;
			if (fi_cq_read(x->cq, &e, 1) == 1) {
				if (e.flags & FI_SEND) sends++;
				if (e.flags & FI_RECV) {
					CHECK(e.len == 0, "a zero-length message of %zu bytes", e.len);
					recvs++;
				}
			}
		}
	}
	fi_freeinfo(ci);
}

// exchange sends n bytes of a pattern from a to b and checks them.
static void exchange(struct end *a, struct end *b, size_t n, int seed) {
	uint8_t *out = malloc(n), *in = calloc(1, n);
	for (size_t i = 0; i < n; i++) out[i] = (uint8_t)(i * 7 + seed);
	CHECK(fi_recv(b->ep, in, n, NULL, 0, in) == 0, "fi_recv");
	CHECK(fi_send(a->ep, out, n, NULL, 0, out) == 0, "fi_send of %zu", n);
	int sent = 0, got = 0;
	while (!sent || !got) {
		struct fi_cq_data_entry c;
		if (fi_cq_read(a->cq, &c, 1) == 1) {
			CHECK(c.op_context == out && (c.flags & (FI_SEND | FI_MSG)) == (FI_SEND | FI_MSG), "the send's completion");
			sent = 1;
		}
		if (fi_cq_read(b->cq, &c, 1) == 1) {
			CHECK(c.op_context == in && (c.flags & (FI_RECV | FI_MSG)) == (FI_RECV | FI_MSG) && c.len == n,
			      "the receive's completion: %zu bytes", c.len);
			got = 1;
		}
	}
	CHECK(!memcmp(in, out, n), "%zu bytes arrived changed", n);
	free(out), free(in);
}

static void wait_send(struct end *a, void *ctx, uint64_t flags, struct end *other) {
	for (;;) {
		struct fi_cq_data_entry c;
		ssize_t r = fi_cq_read(a->cq, &c, 1);
		if (other) {
			struct fi_cq_data_entry o;
			CHECK(fi_cq_read(other->cq, &o, 1) == -FI_EAGAIN, "a completion at the target of RMA");
		}
		if (r == -FI_EAVAIL) {
			struct fi_cq_err_entry err = {0};
			fi_cq_readerr(a->cq, &err, 0);
			CHECK(0, "an error completion: %d (%s)", err.err, fi_strerror(err.err));
		}
		if (r == 1) {
			CHECK(c.op_context == ctx && (c.flags & flags) == flags, "a completion of flags %lx", (unsigned long)c.flags);
			return;
		}
	}
}

// stranger connects to the listener at sa and sends what (or nothing).
static int stranger(const struct sockaddr_in *sa, const char *what) {
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(fd >= 0 && connect(fd, (const struct sockaddr *)sa, sizeof *sa) == 0, "a stranger's connect");
	if (what) CHECK(write(fd, what, strlen(what)) == (ssize_t)strlen(what), "a stranger's write");
	return fd;
}

int main(void) {
	struct fi_info *hints = fi_allocinfo();
	hints->ep_attr->type = FI_EP_MSG;
	hints->caps = FI_MSG | FI_RMA;
	hints->domain_attr->mr_mode = FI_MR_PROV_KEY;
	hints->domain_attr->name = strdup("lo");
	hints->fabric_attr->prov_name = strdup("udiwarp");
	int r = fi_getinfo(FI_VERSION(1, 17), "127.0.0.1", NULL, FI_SOURCE, hints, &info);
	CHECK(r == 0 && info, "fi_getinfo: %d", r);
	CHECK(info->ep_attr->type == FI_EP_MSG && (info->caps & FI_RMA), "an MSG entry with FI_RMA");
	CHECK(fi_fabric(info->fabric_attr, &fabric, NULL) == 0, "fabric");
	struct fi_eq_attr ea = {.wait_obj = FI_WAIT_UNSPEC};
	CHECK(fi_eq_open(fabric, &ea, &eq, NULL) == 0, "eq");
	CHECK(fi_domain(fabric, info, &domain, NULL) == 0, "domain");

	struct fid_pep *pep;
	CHECK(fi_passive_ep(fabric, info, &pep, NULL) == 0, "fi_passive_ep");
	size_t cmsize = 0, sl = sizeof cmsize;
	CHECK(fi_getopt(&pep->fid, FI_OPT_ENDPOINT, FI_OPT_CM_DATA_SIZE, &cmsize, &sl) == 0 && cmsize >= 24, "FI_OPT_CM_DATA_SIZE %zu", cmsize);
	struct sockaddr_in name;
	size_t namelen = 0;
	CHECK(fi_getname(&pep->fid, NULL, &namelen) == -FI_ETOOSMALL && namelen == sizeof name, "fi_getname's length");
	CHECK(fi_getname(&pep->fid, &name, &namelen) == 0 && name.sin_port != 0, "the listener's name before fi_listen");
	CHECK(fi_pep_bind(pep, &eq->fid, 0) == 0, "pep bind");
	CHECK(fi_listen(pep) == 0, "fi_listen");

	struct end c, s;
	connect_pair(pep, &name, namelen, &c, &s);
	exchange(&c, &s, 64, 1);
	exchange(&s, &c, 4096, 2);
	exchange(&c, &s, 1 << 20, 3);
	CHECK(fi_inject(c.ep, "injected", 8, 0) == 0, "fi_inject");
	char small[16] = {0};
	CHECK(fi_recv(s.ep, small, sizeof small, NULL, 0, small) == 0, "fi_recv");
	for (;;) {
		struct fi_cq_data_entry e;
		CHECK(fi_cq_read(c.cq, &e, 1) == -FI_EAGAIN, "a completion for an inject");
		if (fi_cq_read(s.cq, &e, 1) == 1) {
			CHECK(e.len == 8 && !memcmp(small, "injected", 8), "the injected message");
			break;
		}
	}

	// RMA: the responder's region, named by its key and offsets into it.
	size_t rsz = 1 << 20;
	uint8_t *region = calloc(1, rsz), *src = malloc(rsz), *back = calloc(1, rsz);
	for (size_t i = 0; i < rsz; i++) src[i] = (uint8_t)(i * 13 + 5);
	struct fid_mr *mr;
	CHECK(fi_mr_reg(domain, region, rsz, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 0, 0, &mr, NULL) == 0, "fi_mr_reg");
	uint64_t key = fi_mr_key(mr);
	CHECK(fi_write(c.ep, src, 1000, NULL, 0, 100, key, src) == 0, "fi_write");
	wait_send(&c, src, FI_RMA | FI_WRITE, &s);
	CHECK(fi_write(c.ep, src + 4096, rsz - 4096, NULL, 0, 4096, key, src + 4096) == 0, "a large fi_write");
	wait_send(&c, src + 4096, FI_RMA | FI_WRITE, &s);
	// A read after the writes on one connection sees them.
	CHECK(fi_read(c.ep, back, rsz, NULL, 0, 0, key, back) == 0, "fi_read");
	wait_send(&c, back, FI_RMA | FI_READ, &s);
	CHECK(!memcmp(back + 100, src, 1000) && !memcmp(back + 4096, src + 4096, rsz - 4096), "what fi_read brought back");
	CHECK(!memcmp(region + 100, src, 1000) && !memcmp(region + 4096, src + 4096, rsz - 4096), "the region after fi_write");
	CHECK(fi_close(&mr->fid) == 0, "close mr");
	free(region), free(src), free(back);

	// fi_shutdown: the peer's EQ says FI_SHUTDOWN.
	CHECK(fi_shutdown(c.ep, 0) == 0, "fi_shutdown");
	uint8_t ev[sizeof(struct fi_eq_cm_entry) + 256];
	struct fi_eq_cm_entry *cm = (void *)ev;
	ssize_t len;
	CHECK(event(ev, sizeof ev, &len) == FI_SHUTDOWN && cm->fid == &s.ep->fid, "FI_SHUTDOWN for the responder");
	close_end(&c);
	close_end(&s);

	// Connection data over the limit.
	struct end x;
	{
		struct fi_info *ci = fi_dupinfo(info);
		free(ci->src_addr), ci->src_addr = NULL, ci->src_addrlen = 0;
		open_end(&x, ci);
		static char big[1024];
		CHECK(fi_connect(x.ep, &name, big, cmsize + 1) == -FI_EINVAL, "connection data over FI_OPT_CM_DATA_SIZE");
		// fi_reject with data: an error entry with it.
		CHECK(fi_connect(x.ep, &name, "x", 1) == 0, "fi_connect");
		CHECK(event(ev, sizeof ev, &len) == FI_CONNREQ, "not FI_CONNREQ");
		CHECK(fi_reject(pep, cm->info->handle, "no", 2) == 0, "fi_reject");
		fi_freeinfo(cm->info);
		uint32_t e;
		ssize_t n = fi_eq_sread(eq, &e, ev, sizeof ev, 10000, 0);
		CHECK(n == -FI_EAVAIL, "a rejected connection's event: %zd", n);
		struct fi_eq_err_entry err = {0};
		char data[16];
		err.err_data = data, err.err_data_size = sizeof data;
		CHECK(fi_eq_readerr(eq, &err, 0) == sizeof err, "fi_eq_readerr");
		CHECK(err.fid == &x.ep->fid && err.err == FI_ECONNREFUSED, "the error entry: fid %p, err %d", (void *)err.fid, err.err);
		CHECK(err.err_data_size == 2 && !memcmp(data, "no", 2), "the rejecting peer's data: %zu bytes", err.err_data_size);
		close_end(&x);
		fi_freeinfo(ci);
	}

	// A port nobody listens on: FI_ECONNREFUSED.
	{
		int l = socket(AF_INET, SOCK_STREAM, 0);
		struct sockaddr_in free_port = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
		socklen_t fl = sizeof free_port;
		CHECK(bind(l, (struct sockaddr *)&free_port, sizeof free_port) == 0 && getsockname(l, (struct sockaddr *)&free_port, &fl) == 0, "a port");
		close(l); // bound, never listened: refused
		struct fi_info *ci = fi_dupinfo(info);
		free(ci->src_addr), ci->src_addr = NULL, ci->src_addrlen = 0;
		open_end(&x, ci);
		CHECK(fi_connect(x.ep, &free_port, NULL, 0) == 0, "fi_connect");
		uint32_t e;
		CHECK(fi_eq_sread(eq, &e, ev, sizeof ev, 10000, 0) == -FI_EAVAIL, "a refused connection's event");
		struct fi_eq_err_entry err = {0};
		CHECK(fi_eq_readerr(eq, &err, 0) == sizeof err && err.err == FI_ECONNREFUSED && err.fid == &x.ep->fid, "refused: %d", err.err);
		close_end(&x);
		fi_freeinfo(ci);
	}

	// fi_close of an endpoint takes its unread events with it: the
	// responder's FI_CONNECTED, closed unread, is never read.
	{
		struct fi_info *ci = fi_dupinfo(info);
		free(ci->src_addr), ci->src_addr = NULL, ci->src_addrlen = 0;
		open_end(&x, ci);
		CHECK(fi_connect(x.ep, &name, NULL, 0) == 0, "fi_connect");
		CHECK(event(ev, sizeof ev, &len) == FI_CONNREQ, "not FI_CONNREQ");
		struct end y;
		struct fi_info *si = cm->info;
		open_end(&y, si);
		fi_freeinfo(si);
		CHECK(fi_accept(y.ep, NULL, 0) == 0, "fi_accept");
		void *gone = &y.ep->fid;
		close_end(&y);
		// What comes is the initiator's: FI_CONNECTED, then FI_SHUTDOWN
		// (its peer closed).
		uint32_t e;
		do {
			e = event(ev, sizeof ev, &len);
			CHECK(cm->fid != gone, "an event (%u) of a closed endpoint", e);
			CHECK(cm->fid == &x.ep->fid, "an event of no endpoint's");
		} while (e != FI_SHUTDOWN);
		close_end(&x);
		fi_freeinfo(ci);
	}

	// Strangers: bytes that are no MPA Request, and more idle connections
	// than the listener keeps (64); then a real connection still works.
	int fds[80], nf = 0;
	fds[nf++] = stranger(&name, "GET / HTTP/1.0\r\n\r\n");
	fds[nf++] = stranger(&name, "MPA ID Req Frame\x80\x02\xff\xff"); // a Request whose private data never comes
	while (nf < 80) fds[nf++] = stranger(&name, NULL);
	connect_pair(pep, &name, namelen, &c, &s);
	exchange(&c, &s, 100, 4);
	uint32_t e;
	CHECK(fi_eq_read(eq, &e, ev, sizeof ev, 0) == -FI_EAGAIN, "an event of a stranger's");
	for (int i = 0; i < nf; i++) close(fds[i]);

	// Connections whose MPA Request came but that the program has not
	// accepted or rejected are bounded (UDW_CONNREQS, 256 in the
	// process): past that a whole Request is rejected at once; once the
	// program rejects the ones it holds, a real connection goes through.
	{
		enum { CAP = 256, OVER = 20 };
		static const char req[20] = "MPA ID Req Frame\x40\x01\x00\x00"; // revision 1, CRC, no private data
		static int sfd[CAP + OVER];
		static fid_t held[CAP];
		for (int i = 0; i < CAP + OVER; i++) {
			sfd[i] = stranger(&name, NULL);
			CHECK(write(sfd[i], req, sizeof req) == sizeof req, "a Request");
		}
		static char named[65536];
		for (int i = 0; i < CAP; i++) {
			CHECK(event(ev, sizeof ev, &len) == FI_CONNREQ, "not FI_CONNREQ");
			held[i] = cm->info->handle;
			named[ntohs(((struct sockaddr_in *)cm->info->dest_addr)->sin_port)] = 1;
			fi_freeinfo(cm->info);
		}
		int refused = 0;
		for (int i = 0; i < CAP + OVER; i++) {
			struct sockaddr_in me;
			socklen_t ml = sizeof me;
			CHECK(getsockname(sfd[i], (struct sockaddr *)&me, &ml) == 0, "getsockname");
			if (named[ntohs(me.sin_port)]) continue;
			struct timeval tv = {.tv_sec = 10};
			setsockopt(sfd[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
			char rep[64];
			ssize_t k = read(sfd[i], rep, sizeof rep);
			CHECK(k >= 20 && !memcmp(rep, "MPA ID Rep Frame", 16) && (rep[16] & 0x20), "a Request past the bound: %zd bytes, not a rejecting Reply", k);
			refused++;
		}
		CHECK(refused == OVER, "%d Requests refused, want %d", refused, OVER);
		CHECK(fi_eq_read(eq, &e, ev, sizeof ev, 0) == -FI_EAGAIN, "an event past the bound");
		for (int i = 0; i < CAP; i++) CHECK(fi_reject(pep, held[i], NULL, 0) == 0, "fi_reject");
		for (int i = 0; i < CAP + OVER; i++) close(sfd[i]);
		struct end c2, s2;
		connect_pair(pep, &name, namelen, &c2, &s2);
		exchange(&c2, &s2, 100, 5);
		close_end(&c2);
		close_end(&s2);
	}

	// An RDMA Write to a key the target never gave ends the connection
	// (RFC 5040's Terminate): FI_SHUTDOWN for both ends.
	char junk[64] = {0};
	CHECK(fi_write(c.ep, junk, sizeof junk, NULL, 0, 0, 0x12345678, junk) == 0, "fi_write to a bad key");
	int ended = 0;
	for (long spin = 0; ended != 3 && spin < 50000000; spin++) {
		struct fi_cq_data_entry ce;
		struct fi_cq_err_entry err = {0};
		if (fi_cq_read(c.cq, &ce, 1) == -FI_EAVAIL) fi_cq_readerr(c.cq, &err, 0);
		if (fi_cq_read(s.cq, &ce, 1) == -FI_EAVAIL) fi_cq_readerr(s.cq, &err, 0);
		if (fi_eq_read(eq, &e, ev, sizeof ev, 0) > 0) {
			CHECK(e == FI_SHUTDOWN, "event %u after a bad key", e);
			ended |= cm->fid == &c.ep->fid ? 1 : cm->fid == &s.ep->fid ? 2 : 0;
		}
	}
	CHECK(ended == 3, "FI_SHUTDOWN after a bad key: %d", ended);
	close_end(&c);
	close_end(&s);

	CHECK(fi_close(&pep->fid) == 0, "close pep");
	CHECK(fi_close(&domain->fid) == 0, "close domain");
	CHECK(fi_close(&eq->fid) == 0, "close eq");
	CHECK(fi_close(&fabric->fid) == 0, "close fabric");
	fi_freeinfo(info);
	fi_freeinfo(hints);
	printf("ok: msg\n");
	return 0;
}
