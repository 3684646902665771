// mcast: FI_MULTICAST and FI_SOURCE on udiwarp DGRAM endpoints. Two
// endpoints bound to the wildcard address at port argv[1] join group
// 239.1.2.3 with fi_join (FI_JOIN_COMPLETE on their EQs); a third, on
// 127.0.0.1, sends to the group's fi_addr; both members receive it, and
// fi_cq_readfrom names the sender by its fi_addr in their AVs. Once one
// member leaves (fi_close of its membership), a second message reaches
// only the other. Prints "ok: multicast" and exits 0, or names the check
// that failed and exits 1. Run where 224.0.0.0/4 routes (a namespace with
// "route add 224.0.0.0/4 dev lo").
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
	struct fid_eq *eq;
};

static struct fid_fabric *fabric;
static struct fid_domain *domain;

static struct fi_info *info_for(const char *node, const char *service, uint64_t flags) {
	struct fi_info *hints = fi_allocinfo(), *info;
	hints->ep_attr->type = FI_EP_DGRAM;
	hints->caps = FI_MSG | FI_MULTICAST | FI_SOURCE;
	hints->addr_format = FI_SOCKADDR_IN;
	hints->fabric_attr->prov_name = strdup("udiwarp");
	int r = fi_getinfo(FI_VERSION(1, 17), node, service, flags, hints, &info);
	CHECK(r == 0, "fi_getinfo(%s, %s): %d", node ? node : "NULL", service ? service : "NULL", r);
	fi_freeinfo(hints);
	return info;
}

static void open_end(struct fi_info *info, struct end *e) {
	struct fi_cq_attr ca = {.format = FI_CQ_FORMAT_MSG, .wait_obj = FI_WAIT_FD, .size = 64};
	struct fi_av_attr aa = {.type = FI_AV_MAP};
	struct fi_eq_attr ea = {.wait_obj = FI_WAIT_UNSPEC};
	CHECK(fi_cq_open(domain, &ca, &e->cq, NULL) == 0, "fi_cq_open");
	CHECK(fi_av_open(domain, &aa, &e->av, NULL) == 0, "fi_av_open");
	CHECK(fi_eq_open(fabric, &ea, &e->eq, NULL) == 0, "fi_eq_open");
	CHECK(fi_endpoint(domain, info, &e->ep, NULL) == 0, "fi_endpoint");
	CHECK(fi_ep_bind(e->ep, &e->cq->fid, FI_TRANSMIT | FI_RECV) == 0, "bind cq");
	CHECK(fi_ep_bind(e->ep, &e->av->fid, 0) == 0, "bind av");
	CHECK(fi_ep_bind(e->ep, &e->eq->fid, 0) == 0, "bind eq");
	CHECK(fi_enable(e->ep) == 0, "fi_enable");
}

static struct fid_mc *join(struct end *e, struct sockaddr_in *group) {
	struct fid_mc *mc;
	int r = fi_join(e->ep, group, 0, &mc, (void *)0x77);
	CHECK(r == 0, "fi_join: %d", r);
	struct fi_eq_entry ev;
	uint32_t event;
	CHECK(fi_eq_sread(e->eq, &event, &ev, sizeof ev, 5000, 0) == sizeof ev, "no join event");
	CHECK(event == FI_JOIN_COMPLETE && ev.fid == &mc->fid && ev.context == (void *)0x77, "join event %u", event);
	return mc;
}

int main(int argc, char **argv) {
	CHECK(argc == 2, "usage: mcast PORT");
	int port = atoi(argv[1]);
	struct fi_info *member = info_for(NULL, argv[1], FI_SOURCE), *sender = info_for("127.0.0.1", "0", FI_SOURCE);
	CHECK(fi_fabric(member->fabric_attr, &fabric, NULL) == 0, "fi_fabric");
	CHECK(fi_domain(fabric, member, &domain, NULL) == 0, "fi_domain");
	struct end m1, m2, s;
	open_end(member, &m1);
	open_end(member, &m2);
	open_end(sender, &s);

	struct sockaddr_in group = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	inet_pton(AF_INET, "239.1.2.3", &group.sin_addr);
	struct fid_mc *mc1 = join(&m1, &group), *mc2 = join(&m2, &group);
	(void)mc2;
	// A group address an endpoint cannot join: refused.
	struct sockaddr_in unicast = group;
	inet_pton(AF_INET, "10.1.2.3", &unicast.sin_addr);
	struct fid_mc *bad;
	CHECK(fi_join(m1.ep, &unicast, 0, &bad, NULL) == -FI_EINVAL, "joined a unicast address");

	// The members know the sender: FI_SOURCE names it.
	char name[64];
	size_t len = sizeof name;
	CHECK(fi_getname(&s.ep->fid, name, &len) == 0, "fi_getname");
	fi_addr_t from1, from2, to_group;
	CHECK(fi_av_insert(m1.av, name, 1, &from1, 0, NULL) == 1, "insert sender in m1");
	CHECK(fi_av_insert(m2.av, name, 1, &from2, 0, NULL) == 1, "insert sender in m2");
	CHECK(fi_av_insert(s.av, &group, 1, &to_group, 0, NULL) == 1, "insert group");

	static char b1[100], b2[100];
	CHECK(fi_recv(m1.ep, b1, sizeof b1, NULL, FI_ADDR_UNSPEC, (void *)1) == 0, "recv m1");
	CHECK(fi_recv(m2.ep, b2, sizeof b2, NULL, FI_ADDR_UNSPEC, (void *)2) == 0, "recv m2");
	CHECK(fi_send(s.ep, "to the group", 13, NULL, to_group, (void *)3) == 0, "send to the group");
	struct fi_cq_msg_entry ce;
	fi_addr_t src;
	CHECK(fi_cq_sread(s.cq, &ce, 1, NULL, 5000) == 1 && ce.op_context == (void *)3, "send completion");
	CHECK(fi_cq_sreadfrom(m1.cq, &ce, 1, &src, NULL, 5000) == 1, "m1 received nothing");
	CHECK(ce.len == 13 && !strcmp(b1, "to the group") && src == from1, "m1: len %zu src %lu", ce.len, (unsigned long)src);
	CHECK(fi_cq_sreadfrom(m2.cq, &ce, 1, &src, NULL, 5000) == 1, "m2 received nothing");
	CHECK(ce.len == 13 && !strcmp(b2, "to the group") && src == from2, "m2: len %zu src %lu", ce.len, (unsigned long)src);

	// m1 leaves; the next message reaches m2 only. The kernel hands a
	// multicast datagram to every member socket in the send itself, so
	// once m2 has it, m1's socket would hold its copy: m1's read finds
	// none.
	CHECK(fi_close(&mc1->fid) == 0, "leave");
	CHECK(fi_recv(m1.ep, b1, sizeof b1, NULL, FI_ADDR_UNSPEC, (void *)1) == 0, "recv m1");
	CHECK(fi_recv(m2.ep, b2, sizeof b2, NULL, FI_ADDR_UNSPEC, (void *)2) == 0, "recv m2");
	CHECK(fi_send(s.ep, "second", 7, NULL, to_group, (void *)4) == 0, "second send");
	CHECK(fi_cq_sread(m2.cq, &ce, 1, NULL, 5000) == 1 && ce.len == 7 && !strcmp(b2, "second"), "m2 did not get the second");
	CHECK(fi_cq_read(m1.cq, &ce, 1) == -FI_EAGAIN, "m1 got a message after it left");
	printf("ok: multicast\n");
	return 0;
}
