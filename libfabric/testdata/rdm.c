// rdm: what a native udiwarp FI_EP_RDM endpoint promises, checked from
// libfabric's side. Two endpoints a and b on loopback:
//   - tag matching: a message that comes before its receive (unexpected)
//     waits for it; receives match by tag under their ignore bits, in the
//     order posted; an untagged receive never takes a tagged message, nor
//     the other way round;
//   - FI_DIRECTED_RECV: a receive from c does not take a's message;
//   - FI_REMOTE_CQ_DATA arrives in the completion (FI_CQ_FORMAT_TAGGED);
//   - FI_SOURCE: fi_cq_readfrom names the sender;
//   - a receive too small: FI_ETRUNC with olen; fi_cancel: FI_ECANCELED;
//   - more unexpected messages than receive slots (copied out of their
//     slots within the endpoint's budget, or holding them and their
//     senders back past it): nothing is lost, every one arrives in order
//     once receives are posted;
//   - messages arrive in the order sent (FI_ORDER_SAS);
//   - an endpoint's socket has the kernel receive buffer the stack gives
//     its own (8 MiB: with the default, a burst of loopback's 64 KiB
//     frames overflowed it and a megabyte message waited for
//     retransmissions), where this process may set it (root).
// Prints "ok: rdm" and exits 0, or names the check that failed.
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include "check.h"

struct end {
	struct fid_ep *ep;
	struct fid_cq *cq;
	struct fid_av *av;
	fi_addr_t peer[3]; // by index of the other ends
};

static struct fi_info *info;
static struct fid_fabric *fabric;
static struct fid_domain *domain;

static void open_end(struct end *e) {
	struct fi_cq_attr ca = {.format = FI_CQ_FORMAT_TAGGED, .wait_obj = FI_WAIT_FD, .size = 512};
	struct fi_av_attr aa = {.type = FI_AV_MAP};
	CHECK(fi_cq_open(domain, &ca, &e->cq, NULL) == 0, "fi_cq_open");
	CHECK(fi_av_open(domain, &aa, &e->av, NULL) == 0, "fi_av_open");
	CHECK(fi_endpoint(domain, info, &e->ep, NULL) == 0, "fi_endpoint");
	CHECK(fi_ep_bind(e->ep, &e->cq->fid, FI_TRANSMIT | FI_RECV) == 0, "bind cq");
	CHECK(fi_ep_bind(e->ep, &e->av->fid, 0) == 0, "bind av");
	CHECK(fi_enable(e->ep) == 0, "fi_enable");
}

// next reads e's next completion within 5 s (the sends' included).
static ssize_t next(struct end *e, struct fi_cq_tagged_entry *c, fi_addr_t *src) {
	return fi_cq_sreadfrom(e->cq, c, 1, src, NULL, 5000);
}

static struct end *all[3];

// recv_done reads e's completions until a receive's, which it returns.
// Progress is manual: the other ends read their CQs meanwhile, so that
// their sends go (an RD session's handshake included) and are
// acknowledged; their send completions are dropped.
static void recv_done(struct end *e, struct fi_cq_tagged_entry *c, fi_addr_t *src) {
	for (int spins = 0; spins < 5000000; spins++) {
		ssize_t r = fi_cq_readfrom(e->cq, c, 1, src);
		if (r == 1 && (c->flags & FI_RECV)) return;
		CHECK(r == 1 || r == -FI_EAGAIN, "reading the CQ: %zd", r);
		for (int i = 0; i < 3; i++) {
			struct fi_cq_tagged_entry o;
			if (all[i] != e) CHECK(fi_cq_read(all[i]->cq, &o, 1) != -FI_EAVAIL, "an error on another end");
		}
	}
	CHECK(0, "no receive completion");
}

// rcvbuf finds this process's socket bound to name (an endpoint's, from
// fi_getname) among its descriptors and returns its SO_RCVBUF, or -1.
static int rcvbuf(const void *name, size_t len) {
	DIR *d = opendir("/proc/self/fd");
	CHECK(d, "/proc/self/fd");
	int got = -1;
	for (struct dirent *de; (de = readdir(d));) {
		int fd = atoi(de->d_name);
		struct sockaddr_storage ss;
		socklen_t sl = sizeof ss;
		if (fd <= 2 || getsockname(fd, (struct sockaddr *)&ss, &sl) != 0 || sl != len || memcmp(&ss, name, len)) continue;
		int v = 0;
		socklen_t vl = sizeof v;
		if (getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, &vl) == 0) got = v;
	}
	closedir(d);
	return got;
}

int main(void) {
	struct fi_info *hints = fi_allocinfo();
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_MSG | FI_TAGGED | FI_DIRECTED_RECV | FI_SOURCE;
	hints->domain_attr->cq_data_size = 8;
	hints->fabric_attr->prov_name = strdup("udiwarp");
	hints->domain_attr->name = strdup("lo");
	CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info) == 0, "fi_getinfo");
	CHECK(!strcmp(info->fabric_attr->prov_name, "udiwarp"), "the first entry is %s, not the native one", info->fabric_attr->prov_name);
	CHECK(info->ep_attr->mem_tag_format >> 63, "mem_tag_format %#lx", (unsigned long)info->ep_attr->mem_tag_format);
	CHECK(fi_fabric(info->fabric_attr, &fabric, NULL) == 0, "fi_fabric");
	CHECK(fi_domain(fabric, info, &domain, NULL) == 0, "fi_domain");
	struct end e[3];
	for (int i = 0; i < 3; i++) open_end(&e[i]);
	for (int i = 0; i < 3; i++) {
		char name[64];
		size_t len = sizeof name;
		CHECK(fi_getname(&e[i].ep->fid, name, &len) == 0, "fi_getname");
		// The kernel reports twice what was set (its bookkeeping).
		if (geteuid() == 0) CHECK(rcvbuf(name, len) >= 8 << 20, "the endpoint's SO_RCVBUF is %d", rcvbuf(name, len));
		for (int j = 0; j < 3; j++) CHECK(fi_av_insert(e[j].av, name, 1, &e[j].peer[i], 0, NULL) == 1, "fi_av_insert");
	}
	struct end *a = &e[0], *b = &e[1], *c = &e[2];
	all[0] = a, all[1] = b, all[2] = c;
	struct fi_cq_tagged_entry ce;
	fi_addr_t src;
	char buf[4][128];

	// Unexpected, then matched by tag under ignore; untagged apart.
	CHECK(fi_tsend(a->ep, "tag 0x1234", 11, NULL, a->peer[1], 0x1234, (void *)1) == 0, "tsend");
	CHECK(fi_send(a->ep, "untagged", 9, NULL, a->peer[1], (void *)2) == 0, "send");
	CHECK(fi_tsenddata(a->ep, "with data", 10, NULL, 0xfeedULL, a->peer[1], 0x5678, (void *)3) == 0, "tsenddata");
	// Wait until all three are acknowledged: they are at b, unexpected.
	// Progress is manual: b takes them in (and acknowledges them) only as
	// it reads its CQ, where nothing completes, no receive being posted.
	for (int n = 0; n < 3;) {
		ssize_t r = fi_cq_read(b->cq, &ce, 1);
		CHECK(r == -FI_EAGAIN, "b completed something with no receive posted: %zd", r);
		r = fi_cq_read(a->cq, &ce, 1);
		if (r == -FI_EAGAIN) continue;
		CHECK(r == 1 && (ce.flags & FI_SEND), "send completions: %zd", r);
		n++;
	}
	// A tagged receive for 0x12xx (ignore the low byte): takes the first
	// tagged message only, not the untagged one before it in b's queue.
	CHECK(fi_trecv(b->ep, buf[0], 128, NULL, FI_ADDR_UNSPEC, 0x1200, 0xff, (void *)10) == 0, "trecv");
	recv_done(b, &ce, &src);
	CHECK(ce.op_context == (void *)10 && ce.tag == 0x1234 && (ce.flags & FI_TAGGED) && !strcmp(buf[0], "tag 0x1234") && src == b->peer[0],
	      "tagged: ctx %p tag %#lx src %lu", ce.op_context, (unsigned long)ce.tag, (unsigned long)src);
	CHECK(fi_recv(b->ep, buf[1], 128, NULL, FI_ADDR_UNSPEC, (void *)11) == 0, "recv");
	recv_done(b, &ce, &src);
	CHECK(ce.op_context == (void *)11 && (ce.flags & FI_MSG) && !strcmp(buf[1], "untagged"), "untagged");
	// Directed: a receive from c does not take a's message; one from a does.
	CHECK(fi_trecv(b->ep, buf[2], 128, NULL, b->peer[2], 0x5678, 0, (void *)12) == 0, "trecv from c");
	CHECK(fi_trecv(b->ep, buf[3], 128, NULL, b->peer[0], 0x5678, 0, (void *)13) == 0, "trecv from a");
	recv_done(b, &ce, &src);
	CHECK(ce.op_context == (void *)13 && (ce.flags & FI_REMOTE_CQ_DATA) && ce.data == 0xfeed && !strcmp(buf[3], "with data"),
	      "directed: ctx %p data %#lx flags %#lx", ce.op_context, (unsigned long)ce.data, (unsigned long)ce.flags);
	// c's message does go to the receive waiting for c.
	CHECK(fi_tsend(c->ep, "from c", 7, NULL, c->peer[1], 0x5678, (void *)4) == 0, "tsend from c");
	recv_done(b, &ce, &src);
	CHECK(ce.op_context == (void *)12 && !strcmp(buf[2], "from c") && src == b->peer[2], "from c");

	// Too small: FI_ETRUNC, olen; then fi_cancel of a waiting receive.
	CHECK(fi_trecv(b->ep, buf[0], 4, NULL, FI_ADDR_UNSPEC, 7, 0, (void *)20) == 0, "trecv 4");
	CHECK(fi_tsend(a->ep, "0123456789", 10, NULL, a->peer[1], 7, (void *)5) == 0, "tsend 10");
	ssize_t r;
	do r = next(b, &ce, &src);
	while (r == 1);
	CHECK(r == -FI_EAVAIL, "a truncated receive read as %zd", r);
	struct fi_cq_err_entry ee = {0};
	CHECK(fi_cq_readerr(b->cq, &ee, 0) == 1 && ee.err == FI_ETRUNC && ee.len == 4 && ee.olen == 6 && ee.op_context == (void *)20,
	      "truncation: err %d len %zu olen %zu", ee.err, ee.len, ee.olen);
	CHECK(fi_trecv(b->ep, buf[0], 128, NULL, FI_ADDR_UNSPEC, 99, 0, (void *)21) == 0, "trecv 99");
	CHECK(fi_cancel(&b->ep->fid, (void *)21) == 0, "fi_cancel");
	do r = next(b, &ce, &src);
	while (r == 1);
	CHECK(r == -FI_EAVAIL && fi_cq_readerr(b->cq, &ee, 0) == 1 && ee.err == FI_ECANCELED && ee.op_context == (void *)21,
	      "cancel: %zd err %d", r, ee.err);
	CHECK(fi_cancel(&b->ep->fid, (void *)21) == -FI_ENOENT, "cancelled twice");

	// MPI's probes: FI_PEEK finds a message without taking it (FI_ENOMSG
	// until it has come), FI_PEEK | FI_CLAIM sets it aside, so that a
	// second peek no longer sees it, and FI_CLAIM receives it.
	CHECK(fi_tsend(a->ep, "probe me", 9, NULL, a->peer[1], 0x77, (void *)6) == 0, "tsend 0x77");
	struct iovec iov = {.iov_base = buf[1], .iov_len = 128};
	struct fi_msg_tagged tm = {.msg_iov = &iov, .iov_count = 1, .addr = FI_ADDR_UNSPEC, .tag = 0x77, .context = (void *)30};
	for (int found = 0, tries = 0; !found; tries++) {
		CHECK(tries < 1000000, "the probed message never came");
		CHECK(fi_trecvmsg(b->ep, &tm, FI_PEEK) == 0, "peek");
		for (;;) {
			CHECK(fi_cq_read(a->cq, &ce, 1) != -FI_EAVAIL, "a's send failed"); // a's progress
			r = fi_cq_read(b->cq, &ce, 1);
			if (r == 1) {
				CHECK(ce.op_context == (void *)30 && ce.len == 9 && ce.tag == 0x77, "peek found: len %zu tag %#lx", ce.len, (unsigned long)ce.tag);
				found = 1;
				break;
			}
			if (r == -FI_EAVAIL) {
				CHECK(fi_cq_readerr(b->cq, &ee, 0) == 1 && ee.err == FI_ENOMSG && ee.op_context == (void *)30, "peek: err %d", ee.err);
				break;
			}
		}
	}
	tm.context = (void *)31;
	CHECK(fi_trecvmsg(b->ep, &tm, FI_PEEK | FI_CLAIM) == 0, "peek and claim");
	CHECK(next(b, &ce, NULL) == 1 && ce.op_context == (void *)31 && ce.len == 9, "claimed");
	tm.context = (void *)32;
	CHECK(fi_trecvmsg(b->ep, &tm, FI_PEEK) == 0, "peek after the claim");
	CHECK(next(b, &ce, NULL) == -FI_EAVAIL && fi_cq_readerr(b->cq, &ee, 0) == 1 && ee.err == FI_ENOMSG, "a claimed message was seen again");
	tm.context = (void *)31;
	memset(buf[1], 0, 128);
	CHECK(fi_trecvmsg(b->ep, &tm, FI_CLAIM) == 0, "claim");
	CHECK(next(b, &ce, NULL) == 1 && ce.op_context == (void *)31 && ce.len == 9 && !strcmp(buf[1], "probe me"), "the claimed message");
	CHECK(fi_trecvmsg(b->ep, &tm, FI_CLAIM) == -FI_EINVAL, "claimed twice");

	// Bad input: an fi_addr the AV never gave, a message over the limit.
	CHECK(fi_tsend(a->ep, buf[0], 8, NULL, a->peer[1] + 100, 1, NULL) == -FI_EINVAL, "tsend to an unknown fi_addr");
	static char big[(8 << 20) + 1];
	CHECK(fi_tsend(a->ep, big, sizeof big, NULL, a->peer[1], 1, NULL) == -FI_EMSGSIZE, "tsend over 8 MiB");
	CHECK(fi_trecv(b->ep, buf[0], 8, NULL, b->peer[0] + 100, 1, 0, NULL) == -FI_EINVAL, "trecv from an unknown fi_addr");

	// More unexpected messages than b's receive slots (64): b copies them
	// out of their slots (or, past its budget, holds its sender back);
	// once b posts receives, every one arrives, in the order sent.
	enum { N = 200 };
	int sent = 0, got = 0, acked = 0;
	static char rb[N][16];
	while (sent < N) {
		char m[16];
		snprintf(m, sizeof m, "m%d", sent);
		r = fi_tinject(a->ep, m, strlen(m) + 1, a->peer[1], 42);
		if (r == -FI_EAGAIN) {
			// a's send slots wait for b's acknowledgements, which b gives
			// only as it takes messages in: b takes them (into slots, as
			// unexpected) when it reads its CQ.
			r = fi_cq_read(b->cq, &ce, 1);
			CHECK(r == -FI_EAGAIN, "b completed something with no receive posted: %zd", r);
			if (sent >= 64 + 64) break; // more than b's slots and a's
			continue;
		}
		CHECK(r == 0, "tinject: %zd", r);
		sent++;
	}
	CHECK(sent >= 64, "only %d sent before back-pressure", sent);
	for (int i = 0; i < N; i++) CHECK(fi_trecv(b->ep, rb[i], 16, NULL, FI_ADDR_UNSPEC, 42, 0, (void *)(uintptr_t)(1000 + i)) == 0, "trecv %d", i);
	while (got < N) {
		while (sent < N) {
			char m[16];
			snprintf(m, sizeof m, "m%d", sent);
			r = fi_tinject(a->ep, m, strlen(m) + 1, a->peer[1], 42);
			if (r == -FI_EAGAIN) break;
			CHECK(r == 0, "tinject: %zd", r);
			sent++;
		}
		r = fi_cq_read(b->cq, &ce, 1);
		if (r == -FI_EAGAIN) {
			// a takes its acknowledgements in; none of its sends fails
			// (receiver-not-ready is waited out, not an error).
			CHECK(fi_cq_read(a->cq, &ce, 1) != -FI_EAVAIL, "a send failed");
			continue;
		}
		CHECK(r == 1, "b's CQ: %zd", r);
		CHECK(ce.op_context == (void *)(uintptr_t)(1000 + got), "receive %d completed out of order: %p", got, ce.op_context);
		char want[16];
		snprintf(want, sizeof want, "m%d", got);
		CHECK(!strcmp(rb[got], want), "message %d is %s", got, rb[got]);
		got++;
	}
	(void)acked;
	CHECK(fi_cq_read(a->cq, &ce, 1) != -FI_EAVAIL, "a send failed");
	for (int i = 0; i < 3; i++) {
		CHECK(fi_close(&e[i].ep->fid) == 0, "close ep");
		CHECK(fi_close(&e[i].av->fid) == 0, "close av");
		CHECK(fi_close(&e[i].cq->fid) == 0, "close cq");
	}
	fi_close(&domain->fid);
	fi_close(&fabric->fid);
	fi_freeinfo(info);
	fi_freeinfo(hints);
	printf("ok: rdm\n");
	return 0;
}
