// badinput: what a libfabric program can get wrong on a udiwarp DGRAM
// endpoint, and the error each must return; the endpoint keeps working
// after all of them. Run with FI_PROVIDER_PATH naming the provider's
// directory; prints "ok: all checks passed" and exits 0, or names the
// first check that failed and exits 1.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>

#include "check.h"

struct end {
	struct fid_ep *ep;
	struct fid_cq *cq;
	struct fid_av *av;
};

static struct fi_info *info;
static struct fid_fabric *fabric;
static struct fid_domain *domain;

static void open_end(struct end *e, int enable) {
	struct fi_cq_attr ca = {.format = FI_CQ_FORMAT_MSG, .wait_obj = FI_WAIT_FD, .size = 64};
	struct fi_av_attr aa = {.type = FI_AV_TABLE};
	CHECK(fi_cq_open(domain, &ca, &e->cq, NULL) == 0, "fi_cq_open");
	CHECK(fi_av_open(domain, &aa, &e->av, NULL) == 0, "fi_av_open");
	CHECK(fi_endpoint(domain, info, &e->ep, NULL) == 0, "fi_endpoint");
	CHECK(fi_ep_bind(e->ep, &e->cq->fid, FI_TRANSMIT | FI_RECV) == 0, "bind cq");
	CHECK(fi_ep_bind(e->ep, &e->av->fid, 0) == 0, "bind av");
	if (enable) CHECK(fi_enable(e->ep) == 0, "fi_enable");
}

// wait_comp reads one completion within 5 s; returns what fi_cq_sread did.
static ssize_t wait_comp(struct end *e, struct fi_cq_msg_entry *c) { return fi_cq_sread(e->cq, c, 1, NULL, 5000); }

int main(void) {
	struct fi_info *hints = fi_allocinfo();
	hints->ep_attr->type = FI_EP_DGRAM;
	hints->caps = FI_MSG;
	hints->fabric_attr->prov_name = strdup("udiwarp");
	hints->domain_attr->name = strdup("lo");
	CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info) == 0, "fi_getinfo");
	CHECK(fi_fabric(info->fabric_attr, &fabric, NULL) == 0, "fi_fabric");
	CHECK(fi_domain(fabric, info, &domain, NULL) == 0, "fi_domain");

	// Hints the provider cannot meet: no match, not a crash.
	struct fi_info *bad = fi_dupinfo(hints), *none = NULL;
	bad->ep_attr->max_msg_size = 1 << 20;
	CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, bad, &none) == -FI_ENODATA, "a 1 MiB DGRAM message was offered");
	fi_freeinfo(bad);

	struct end a, b, c;
	open_end(&a, 1);
	open_end(&b, 1);
	char name[64];
	size_t len = sizeof name;
	CHECK(fi_getname(&b.ep->fid, name, &len) == 0, "fi_getname");
	size_t small = 1;
	CHECK(fi_getname(&b.ep->fid, name, &small) == -FI_ETOOSMALL && small == len, "fi_getname into 1 byte: %zu", small);
	fi_addr_t to;
	CHECK(fi_av_insert(a.av, name, 1, &to, 0, NULL) == 1, "fi_av_insert");

	static char buf[70000], rbuf[70000];
	memset(buf, 'x', sizeof buf);
	// A send to an address the AV never gave, over the largest message,
	// from a NULL buffer: refused at once, nothing sent.
	CHECK(fi_send(a.ep, buf, 8, NULL, to + 7, NULL) == -FI_EINVAL, "send to an unknown fi_addr");
	CHECK(fi_send(a.ep, buf, 65486, NULL, to, NULL) == -FI_EMSGSIZE, "send over the largest message");
	CHECK(fi_send(a.ep, NULL, 8, NULL, to, NULL) == -FI_EINVAL, "send from NULL");
	CHECK(fi_recv(b.ep, NULL, 8, NULL, FI_ADDR_UNSPEC, NULL) == -FI_EINVAL, "receive into NULL");
	// A bad fi_av_insert: an address of no family it knows.
	char junk[16] = {0};
	fi_addr_t j;
	CHECK(fi_av_insert(a.av, junk, 1, &j, 0, NULL) == 0 && j == FI_ADDR_NOTAVAIL, "junk address inserted");

	// A receive too small: FI_ETRUNC, with the bytes cut in olen.
	CHECK(fi_recv(b.ep, rbuf, 100, NULL, FI_ADDR_UNSPEC, (void *)0x51) == 0, "fi_recv");
	CHECK(fi_send(a.ep, buf, 1000, NULL, to, (void *)0x52) == 0, "fi_send 1000");
	struct fi_cq_msg_entry ce;
	CHECK(wait_comp(&a, &ce) == 1 && ce.op_context == (void *)0x52, "send completion");
	ssize_t r = wait_comp(&b, &ce);
	CHECK(r == -FI_EAVAIL, "a truncated receive read as %zd", r);
	struct fi_cq_err_entry ee = {0};
	CHECK(fi_cq_readerr(b.cq, &ee, 0) == 1, "fi_cq_readerr");
	CHECK(ee.err == FI_ETRUNC && ee.olen == 900 && ee.len == 100 && ee.op_context == (void *)0x51,
	      "truncation: err %d olen %zu len %zu", ee.err, ee.olen, ee.len);
	CHECK(memcmp(rbuf, buf, 100) == 0, "the first 100 bytes");

	// An endpoint not enabled refuses to send.
	open_end(&c, 0);
	CHECK(fi_send(c.ep, buf, 8, NULL, to, NULL) == -FI_EOPBADSTATE, "send before fi_enable");

	// After all that, a message of the largest size goes through whole.
	CHECK(fi_recv(b.ep, rbuf, sizeof rbuf, NULL, FI_ADDR_UNSPEC, (void *)0x61) == 0, "fi_recv");
	for (int i = 0; i < 65485; i++) buf[i] = (char)(i * 7);
	CHECK(fi_send(a.ep, buf, 65485, NULL, to, (void *)0x62) == 0, "fi_send 65485");
	CHECK(wait_comp(&a, &ce) == 1, "send completion");
	CHECK(wait_comp(&b, &ce) == 1 && ce.len == 65485 && ce.op_context == (void *)0x61, "receive of 65485: len %zu", ce.len);
	CHECK(memcmp(rbuf, buf, 65485) == 0, "the largest message's bytes");

	fi_close(&c.ep->fid);
	fi_close(&c.av->fid);
	fi_close(&c.cq->fid);
	struct end *ends[] = {&a, &b};
	for (int i = 0; i < 2; i++) {
		struct end *e = ends[i];
		CHECK(fi_close(&e->ep->fid) == 0, "close ep");
		CHECK(fi_close(&e->av->fid) == 0, "close av");
		CHECK(fi_close(&e->cq->fid) == 0, "close cq");
	}
	CHECK(fi_close(&domain->fid) == 0, "close domain");
	CHECK(fi_close(&fabric->fid) == 0, "close fabric");
	fi_freeinfo(info);
	fi_freeinfo(hints);
	printf("ok: all checks passed\n");
	return 0;
}
