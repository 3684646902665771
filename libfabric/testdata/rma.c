// rma: RMA and atomics on a native udiwarp FI_EP_RDM endpoint, checked
// from libfabric's side by two processes on loopback: a (the parent, the
// initiator) and b (the child, the target), which exchange their
// endpoints' names over a socket pair and b's keys in a message.
//   - fi_getinfo: FI_RMA and FI_ATOMIC with FI_MR_PROV_KEY, keys of 4
//     bytes, no FI_MR_VIRT_ADDR; none for FI_MR_BASIC, FI_MR_SCALABLE or
//     mr_mode 0; without FI_RMA, mr_mode 0 as before;
//   - fi_write then fi_read back, 64 B and 1 MiB (fi_writemsg, fi_readv
//     too), every byte compared; fi_inject_write; fi_writedata and
//     fi_inject_writedata, whose completions at b carry the data and
//     FI_RMA | FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA and consume no
//     receive;
//   - fi_fetch_atomic FI_SUM (old values checked), fi_atomic FI_SUM
//     several times, FI_ATOMIC_READ, FI_INT64, fi_compare_atomic FI_CSWAP
//     that succeeds and one that fails; fi_query_atomic and the valid
//     calls;
//   - errors: a wrong key, an offset past the region, a write to a
//     read-only region, a wrong key for an atomic (error completions,
//     FI_EACCES), a word in a region that starts unaligned (FI_EINVAL);
//     a misaligned atomic, an fi_addr the AV never gave, a key wider
//     than 32 bits (-FI_EINVAL); over the largest message or the inject
//     size (-FI_EMSGSIZE); each followed by an operation that works.
// Prints "ok: rma" (a) and "ok: rma target" (b) and exits 0, or names
// the check that failed.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include "check.h"

#define RMA_CAPS (FI_MSG | FI_RMA | FI_ATOMIC | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE)
#define REGION (2 << 20)
#define BIG (1 << 20)

static struct fi_info *info;
static struct fid_fabric *fabric;
static struct fid_domain *domain;
static struct fid_ep *ep;
static struct fid_cq *cq;
static struct fid_av *av;
static fi_addr_t peer;

// What b tells a: its regions' keys.
struct keys {
	uint64_t region, words, ro, odd;
};

static struct fi_info *hints_with(uint64_t caps, int mr_mode) {
	struct fi_info *h = fi_allocinfo();
	h->ep_attr->type = FI_EP_RDM;
	h->caps = caps;
	h->domain_attr->mr_mode = mr_mode;
	h->domain_attr->cq_data_size = 8;
	h->fabric_attr->prov_name = strdup("udiwarp");
	h->domain_attr->name = strdup("lo");
	return h;
}

// wait_one reads the next completion; an error one is read with
// fi_cq_readerr into *ee and returns -FI_EAVAIL.
static ssize_t wait_one(struct fi_cq_data_entry *c, struct fi_cq_err_entry *ee) {
	for (;;) {
		ssize_t r = fi_cq_sread(cq, c, 1, NULL, 100);
		if (r == -FI_EAGAIN) continue;
		if (r == -FI_EAVAIL) {
			memset(ee, 0, sizeof *ee);
			CHECK(fi_cq_readerr(cq, ee, 0) == 1, "fi_cq_readerr");
			return r;
		}
		CHECK(r == 1, "fi_cq_sread: %zd", r);
		return r;
	}
}

// done waits for the completion of the operation with context ctx, which
// must succeed with flags.
static void done(void *ctx, uint64_t flags) {
	struct fi_cq_data_entry c;
	struct fi_cq_err_entry ee;
	ssize_t r = wait_one(&c, &ee);
	CHECK(r == 1, "operation %p failed: err %d (%s)", ctx, ee.err, fi_strerror(ee.err));
	CHECK(c.op_context == ctx && c.flags == flags, "completion %p flags %#lx, want %p %#lx", c.op_context, (unsigned long)c.flags, ctx,
	      (unsigned long)flags);
}

// failed waits for the error completion of the operation with context
// ctx: err, flags.
static void failed(void *ctx, int err, uint64_t flags) {
	struct fi_cq_data_entry c;
	struct fi_cq_err_entry ee;
	ssize_t r = wait_one(&c, &ee);
	CHECK(r == -FI_EAVAIL, "operation %p succeeded (flags %#lx); want error %d", ctx, (unsigned long)c.flags, err);
	CHECK(ee.op_context == ctx && ee.err == err && ee.flags == flags, "error completion %p err %d (%s) flags %#lx, want %p %d %#lx",
	      ee.op_context, ee.err, fi_strerror(ee.err), (unsigned long)ee.flags, ctx, err, (unsigned long)flags);
}

static void fill(unsigned char *p, size_t n, unsigned seed) {
	for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 7 + seed + (i >> 8));
}

static void open_all(int sock) {
	struct fi_info *hints = hints_with(RMA_CAPS, FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY);
	CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info) == 0, "fi_getinfo with FI_RMA | FI_ATOMIC");
	fi_freeinfo(hints);
	CHECK(!strcmp(info->fabric_attr->prov_name, "udiwarp") && info->ep_attr->type == FI_EP_RDM, "the first entry is %s",
	      info->fabric_attr->prov_name);
	CHECK((info->caps & RMA_CAPS) == RMA_CAPS, "caps %#lx", (unsigned long)info->caps);
	CHECK(info->domain_attr->mr_mode == FI_MR_PROV_KEY && info->domain_attr->mr_key_size == 4, "mr_mode %#x key size %zu",
	      info->domain_attr->mr_mode, info->domain_attr->mr_key_size);
	CHECK(info->tx_attr->rma_iov_limit == 1 && info->tx_attr->iov_limit == 1 && info->domain_attr->mr_iov_limit == 1 &&
		  info->domain_attr->cq_data_size == 8,
	      "limits");
	CHECK(fi_fabric(info->fabric_attr, &fabric, NULL) == 0, "fi_fabric");
	CHECK(fi_domain(fabric, info, &domain, NULL) == 0, "fi_domain");
	struct fi_cq_attr ca = {.format = FI_CQ_FORMAT_DATA, .wait_obj = FI_WAIT_FD, .size = 256};
	struct fi_av_attr aa = {.type = FI_AV_TABLE};
	CHECK(fi_cq_open(domain, &ca, &cq, NULL) == 0, "fi_cq_open");
	CHECK(fi_av_open(domain, &aa, &av, NULL) == 0, "fi_av_open");
	CHECK(fi_endpoint(domain, info, &ep, NULL) == 0, "fi_endpoint");
	CHECK(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV) == 0, "bind cq");
	CHECK(fi_ep_bind(ep, &av->fid, 0) == 0, "bind av");
	CHECK(fi_enable(ep) == 0, "fi_enable");
	char name[64], other[64];
	size_t len = sizeof name;
	CHECK(fi_getname(&ep->fid, name, &len) == 0, "fi_getname");
	CHECK(write(sock, name, sizeof name) == sizeof name && read(sock, other, sizeof other) == sizeof other, "exchanging names");
	CHECK(fi_av_insert(av, other, 1, &peer, 0, NULL) == 1, "fi_av_insert");
}

static void close_all(void) {
	CHECK(fi_close(&ep->fid) == 0, "close ep");
	CHECK(fi_close(&av->fid) == 0, "close av");
	CHECK(fi_close(&cq->fid) == 0, "close cq");
	fi_close(&domain->fid);
	fi_close(&fabric->fid);
	fi_freeinfo(info);
}

// target is b: it registers its regions, sends their keys, and reads its
// CQ (manual progress: a's operations on b's memory go only while b
// reads) until a's last message; meanwhile a's two writes with data
// complete here, consuming no receive.
static int target(int sock) {
	open_all(sock);
	unsigned char *region, *ro;
	uint64_t *words;
	CHECK(posix_memalign((void **)&region, 4096, REGION) == 0 && posix_memalign((void **)&words, 64, 64) == 0 &&
		  posix_memalign((void **)&ro, 4096, 4096) == 0,
	      "memory");
	memset(region, 0, REGION);
	fill(ro, 4096, 99);
	words[0] = 100, words[1] = 5, words[2] = 7;
	struct fid_mr *mr, *wmr, *romr, *oddmr;
	CHECK(fi_mr_reg(domain, region, REGION, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 0, 0, &mr, NULL) == 0, "fi_mr_reg region");
	CHECK(fi_mr_reg(domain, words, 64, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 0, 0, &wmr, NULL) == 0, "fi_mr_reg words");
	CHECK(fi_mr_reg(domain, ro, 4096, FI_REMOTE_READ, 0, 0, 0, &romr, NULL) == 0, "fi_mr_reg read-only");
	// A region that starts 4 bytes into a word: its offset 0 is no
	// 8-byte-aligned word.
	CHECK(fi_mr_reg(domain, (char *)words + 36, 16, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 0, 0, &oddmr, NULL) == 0, "fi_mr_reg odd");
	struct keys k = {fi_mr_key(mr), fi_mr_key(wmr), fi_mr_key(romr), fi_mr_key(oddmr)};
	CHECK(k.region <= UINT32_MAX && k.words <= UINT32_MAX && k.ro <= UINT32_MAX && k.region != k.words, "keys %#lx %#lx %#lx",
	      (unsigned long)k.region, (unsigned long)k.words, (unsigned long)k.ro);
	char bye[8];
	CHECK(fi_recv(ep, bye, sizeof bye, NULL, FI_ADDR_UNSPEC, (void *)1) == 0, "fi_recv");
	CHECK(fi_send(ep, &k, sizeof k, NULL, peer, (void *)2) == 0, "fi_send keys");
	uint64_t want[] = {0xabcdef0123456789ull, 2};
	unsigned char expect[100];
	int datas = 0;
	for (int got_bye = 0; !got_bye;) {
		struct fi_cq_data_entry c;
		struct fi_cq_err_entry ee;
		CHECK(wait_one(&c, &ee) == 1, "b: an error completion: err %d (%s)", ee.err, fi_strerror(ee.err));
		if (c.flags & FI_REMOTE_CQ_DATA) {
			CHECK(datas < 2, "b: a third write with data");
			CHECK(c.flags == (FI_RMA | FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA) && c.data == want[datas] && c.op_context == NULL,
			      "b: write with data %d: flags %#lx data %#lx ctx %p", datas, (unsigned long)c.flags, (unsigned long)c.data,
			      c.op_context);
			// The write's bytes are placed before its completion.
			fill(expect, 100, 40 + datas);
			CHECK(!memcmp(region + 300 + 100 * datas, expect, datas ? 10 : 100), "b: the bytes of write with data %d", datas);
			datas++;
		} else if (c.flags & FI_RECV) {
			CHECK(c.op_context == (void *)1 && !strcmp(bye, "bye"), "b: a's last message");
			got_bye = 1;
		} else {
			CHECK(c.op_context == (void *)2 && c.flags == (FI_MSG | FI_SEND), "b: the keys' send: %p %#lx", c.op_context,
			      (unsigned long)c.flags);
		}
	}
	CHECK(datas == 2, "b: %d writes with data", datas);
	// a's atomics, seen from here.
	CHECK(words[0] == 100 + 5 + 7 + 55 && words[1] == 2 && words[2] == 70, "b: words %lu %lu %lu", (unsigned long)words[0],
	      (unsigned long)words[1], (unsigned long)words[2]);
	CHECK(fi_close(&mr->fid) == 0 && fi_close(&wmr->fid) == 0 && fi_close(&romr->fid) == 0 && fi_close(&oddmr->fid) == 0, "b: fi_close of the regions");
	close_all();
	printf("ok: rma target\n");
	return 0;
}

static int initiator(int sock) {
	// What fi_getinfo offers for other memory registration modes.
	struct fi_info *hints, *got;
	int modes[] = {FI_MR_BASIC, FI_MR_SCALABLE, 0, FI_MR_LOCAL | FI_MR_VIRT_ADDR};
	for (int i = 0; i < 4; i++) {
		hints = hints_with(FI_MSG | FI_RMA, modes[i]);
		CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &got) == -FI_ENODATA, "FI_RMA offered for mr_mode %#x", modes[i]);
		fi_freeinfo(hints);
	}
	hints = hints_with(FI_MSG | FI_TAGGED, 0);
	CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &got) == 0, "no entry for FI_TAGGED with mr_mode 0");
	CHECK(got->domain_attr->mr_mode == 0 && !(got->caps & (FI_RMA | FI_ATOMIC)), "without FI_RMA: mr_mode %#x caps %#lx",
	      got->domain_attr->mr_mode, (unsigned long)got->caps);
	fi_freeinfo(got);
	fi_freeinfo(hints);

	open_all(sock);
	struct keys k;
	CHECK(fi_recv(ep, &k, sizeof k, NULL, FI_ADDR_UNSPEC, (void *)1) == 0, "fi_recv");
	done((void *)1, FI_MSG | FI_RECV);
	unsigned char *src = malloc(BIG), *dst = malloc(BIG);
	CHECK(src && dst, "memory");

	// Write, then read back: 64 bytes, then 1 MiB (the caller's buffers
	// registered for the operation), every byte compared.
	fill(src, 64, 1);
	CHECK(fi_write(ep, src, 64, NULL, peer, 0, k.region, (void *)10) == 0, "fi_write 64");
	done((void *)10, FI_RMA | FI_WRITE);
	memset(dst, 0, 64);
	CHECK(fi_read(ep, dst, 64, NULL, peer, 0, k.region, (void *)11) == 0, "fi_read 64");
	done((void *)11, FI_RMA | FI_READ);
	CHECK(!memcmp(src, dst, 64), "64 bytes read back differ");
	fill(src, BIG, 2);
	struct iovec iov = {.iov_base = src, .iov_len = BIG};
	struct fi_rma_iov riov = {.addr = 1000, .len = BIG, .key = k.region};
	struct fi_msg_rma msg = {.msg_iov = &iov, .iov_count = 1, .addr = peer, .rma_iov = &riov, .rma_iov_count = 1, .context = (void *)12};
	CHECK(fi_writemsg(ep, &msg, FI_COMPLETION) == 0, "fi_writemsg 1 MiB");
	done((void *)12, FI_RMA | FI_WRITE);
	memset(dst, 0, BIG);
	struct iovec div = {.iov_base = dst, .iov_len = BIG};
	CHECK(fi_readv(ep, &div, NULL, 1, peer, 1000, k.region, (void *)13) == 0, "fi_readv 1 MiB");
	done((void *)13, FI_RMA | FI_READ);
	for (size_t i = 0; i < BIG; i++) CHECK(src[i] == dst[i], "1 MiB read back: byte %zu is %u, wrote %u", i, dst[i], src[i]);

	// Inject: no completion; the bytes arrive (read until they have).
	unsigned char inj[32], back[32];
	fill(inj, 32, 3);
	CHECK(fi_inject_write(ep, inj, 32, peer, 200, k.region) == 0, "fi_inject_write");
	for (int tries = 0;; tries++) {
		CHECK(tries < 100000, "the injected bytes never arrived");
		CHECK(fi_read(ep, back, 32, NULL, peer, 200, k.region, (void *)14) == 0, "fi_read after inject");
		done((void *)14, FI_RMA | FI_READ);
		if (!memcmp(inj, back, 32)) break;
	}

	// Writes with remote CQ data: b checks their completions and bytes.
	unsigned char wd[100];
	fill(wd, 100, 40);
	CHECK(fi_writedata(ep, wd, 100, NULL, 0xabcdef0123456789ull, peer, 300, k.region, (void *)15) == 0, "fi_writedata");
	done((void *)15, FI_RMA | FI_WRITE);
	fill(wd, 10, 41);
	CHECK(fi_inject_writedata(ep, wd, 10, 2, peer, 400, k.region) == 0, "fi_inject_writedata");

	// Atomics on b's words: 100, 5, 7.
	uint64_t v, old = 0;
	v = 5;
	CHECK(fi_fetch_atomic(ep, &v, 1, NULL, &old, NULL, peer, 0, k.words, FI_UINT64, FI_SUM, (void *)20) == 0, "fi_fetch_atomic");
	done((void *)20, FI_ATOMIC | FI_READ);
	CHECK(old == 100, "fetch-add: old %lu", (unsigned long)old);
	v = 7;
	CHECK(fi_fetch_atomic(ep, &v, 1, NULL, &old, NULL, peer, 0, k.words, FI_UINT64, FI_SUM, (void *)21) == 0, "fi_fetch_atomic");
	done((void *)21, FI_ATOMIC | FI_READ);
	CHECK(old == 105, "fetch-add: old %lu", (unsigned long)old);
	uint64_t adds[10];
	for (int i = 0; i < 10; i++) {
		adds[i] = (uint64_t)i + 1;
		CHECK(fi_atomic(ep, &adds[i], 1, NULL, peer, 0, k.words, FI_UINT64, FI_SUM, (void *)(uintptr_t)(30 + i)) == 0, "fi_atomic %d", i);
	}
	for (int i = 0; i < 10; i++) done((void *)(uintptr_t)(30 + i), FI_ATOMIC | FI_WRITE);
	CHECK(fi_fetch_atomic(ep, NULL, 1, NULL, &old, NULL, peer, 0, k.words, FI_UINT64, FI_ATOMIC_READ, (void *)22) == 0, "FI_ATOMIC_READ");
	done((void *)22, FI_ATOMIC | FI_READ);
	CHECK(old == 167, "after ten adds: %lu", (unsigned long)old);
	int64_t s = -3, sold = 0;
	CHECK(fi_fetch_atomic(ep, &s, 1, NULL, &sold, NULL, peer, 8, k.words, FI_INT64, FI_SUM, (void *)23) == 0, "FI_INT64");
	done((void *)23, FI_ATOMIC | FI_READ);
	CHECK(sold == 5, "FI_INT64 old %ld", (long)sold);
	uint64_t cmp = 7, swap = 70;
	CHECK(fi_compare_atomic(ep, &swap, 1, NULL, &cmp, NULL, &old, NULL, peer, 16, k.words, FI_UINT64, FI_CSWAP, (void *)24) == 0, "cswap");
	done((void *)24, FI_ATOMIC | FI_READ);
	CHECK(old == 7, "cswap that succeeds: old %lu", (unsigned long)old);
	swap = 700;
	CHECK(fi_compare_atomic(ep, &swap, 1, NULL, &cmp, NULL, &old, NULL, peer, 16, k.words, FI_UINT64, FI_CSWAP, (void *)25) == 0, "cswap");
	done((void *)25, FI_ATOMIC | FI_READ);
	CHECK(old == 70, "cswap that fails: old %lu", (unsigned long)old);

	// What the atomics are, asked.
	struct fi_atomic_attr aattr;
	size_t count = 0;
	CHECK(fi_query_atomic(domain, FI_UINT64, FI_SUM, &aattr, 0) == 0 && aattr.count == 1 && aattr.size == 8, "query FI_SUM");
	CHECK(fi_query_atomic(domain, FI_INT64, FI_ATOMIC_READ, &aattr, FI_FETCH_ATOMIC) == 0 && aattr.count == 1, "query FI_ATOMIC_READ");
	CHECK(fi_query_atomic(domain, FI_UINT64, FI_CSWAP, &aattr, FI_COMPARE_ATOMIC) == 0 && aattr.count == 1, "query FI_CSWAP");
	CHECK(fi_query_atomic(domain, FI_UINT64, FI_MIN, &aattr, 0) == -FI_EOPNOTSUPP, "query FI_MIN");
	CHECK(fi_query_atomic(domain, FI_UINT32, FI_SUM, &aattr, 0) == -FI_EOPNOTSUPP, "query FI_UINT32");
	CHECK(fi_query_atomic(domain, FI_UINT64, FI_ATOMIC_READ, &aattr, 0) == -FI_EOPNOTSUPP, "query FI_ATOMIC_READ, not fetching");
	CHECK(fi_query_atomic(domain, FI_UINT64, FI_CSWAP_NE, &aattr, FI_COMPARE_ATOMIC) == -FI_EOPNOTSUPP, "query FI_CSWAP_NE");
	CHECK(fi_atomicvalid(ep, FI_UINT64, FI_SUM, &count) == 0 && count == 1, "fi_atomicvalid");
	CHECK(fi_fetch_atomicvalid(ep, FI_INT64, FI_SUM, &count) == 0 && count == 1, "fi_fetch_atomicvalid");
	CHECK(fi_compare_atomicvalid(ep, FI_UINT64, FI_CSWAP, &count) == 0 && count == 1, "fi_compare_atomicvalid");
	CHECK(fi_atomicvalid(ep, FI_DOUBLE, FI_SUM, &count) == -FI_EOPNOTSUPP, "fi_atomicvalid FI_DOUBLE");
	CHECK(fi_compare_atomicvalid(ep, FI_UINT64, FI_MSWAP, &count) == -FI_EOPNOTSUPP, "fi_compare_atomicvalid FI_MSWAP");
	CHECK(fi_atomic(ep, &v, 1, NULL, peer, 0, k.words, FI_UINT64, FI_BOR, NULL) == -FI_EOPNOTSUPP, "fi_atomic FI_BOR");

	// Errors at the target: error completions, and both ends go on.
	CHECK(fi_write(ep, src, 64, NULL, peer, 0, k.region ^ 1, (void *)40) == 0, "fi_write, wrong key");
	failed((void *)40, FI_EACCES, FI_RMA | FI_WRITE);
	CHECK(fi_read(ep, dst, 64, NULL, peer, REGION - 10, k.region, (void *)41) == 0, "fi_read past the end");
	failed((void *)41, FI_EACCES, FI_RMA | FI_READ);
	CHECK(fi_write(ep, src, 64, NULL, peer, 0, k.ro, (void *)42) == 0, "fi_write to a read-only region");
	failed((void *)42, FI_EACCES, FI_RMA | FI_WRITE);
	CHECK(fi_fetch_atomic(ep, &v, 1, NULL, &old, NULL, peer, 0, k.words ^ 0x100, FI_UINT64, FI_SUM, (void *)43) == 0, "atomic, wrong key");
	failed((void *)43, FI_EACCES, FI_ATOMIC | FI_READ);
	CHECK(fi_fetch_atomic(ep, &v, 1, NULL, &old, NULL, peer, 0, k.odd, FI_UINT64, FI_SUM, (void *)45) == 0, "atomic, unaligned word");
	failed((void *)45, FI_EINVAL, FI_ATOMIC | FI_READ);
	CHECK(fi_read(ep, dst, 4096, NULL, peer, 0, k.ro, (void *)44) == 0, "fi_read of the read-only region");
	done((void *)44, FI_RMA | FI_READ);
	unsigned char want_ro[4096];
	fill(want_ro, 4096, 99);
	CHECK(!memcmp(dst, want_ro, 4096), "the read-only region read back differs");
	// Errors at the call.
	CHECK(fi_fetch_atomic(ep, &v, 1, NULL, &old, NULL, peer, 4, k.words, FI_UINT64, FI_SUM, NULL) == -FI_EINVAL, "misaligned atomic");
	CHECK(fi_atomic(ep, adds, 2, NULL, peer, 0, k.words, FI_UINT64, FI_SUM, NULL) == -FI_EINVAL, "atomic of two words");
	CHECK(fi_write(ep, src, 64, NULL, peer + 100, 0, k.region, NULL) == -FI_EINVAL, "fi_write to an unknown fi_addr");
	CHECK(fi_read(ep, dst, 64, NULL, peer, 0, k.region | (1ull << 40), NULL) == -FI_EINVAL, "a key of more than 32 bits");
	static unsigned char huge[(8 << 20) + 1];
	CHECK(fi_write(ep, huge, sizeof huge, NULL, peer, 0, k.region, NULL) == -FI_EMSGSIZE, "fi_write over 8 MiB");
	CHECK(fi_inject_write(ep, src, 65537, peer, 0, k.region) == -FI_EMSGSIZE, "fi_inject_write over the inject size");
	// And after them, what works still works.
	fill(src, 4096, 5);
	CHECK(fi_write(ep, src, 4096, NULL, peer, 8192, k.region, (void *)50) == 0, "fi_write after the errors");
	done((void *)50, FI_RMA | FI_WRITE);
	memset(dst, 0, 4096);
	CHECK(fi_read(ep, dst, 4096, NULL, peer, 8192, k.region, (void *)51) == 0, "fi_read after the errors");
	done((void *)51, FI_RMA | FI_READ);
	CHECK(!memcmp(src, dst, 4096), "read back after the errors differs");

	CHECK(fi_send(ep, "bye", 4, NULL, peer, (void *)60) == 0, "fi_send bye");
	done((void *)60, FI_MSG | FI_SEND);
	close_all();
	free(src);
	free(dst);
	return 0;
}

int main(void) {
	int sv[2];
	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair");
	fflush(stdout);
	pid_t pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL); // a failed check in a ends b too
		close(sv[0]);
		return target(sv[1]);
	}
	close(sv[1]);
	initiator(sv[0]);
	int status;
	CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0, "the target failed (status %#x)", status);
	printf("ok: rma\n");
	return 0;
}
