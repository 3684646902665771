// manysock: opens N bound UDP sockets in one process, as a server with
// a socket per client does (SIPp's -t un), and exercises each: every
// socket sends one datagram to socket 0, which answers each, and every
// socket reads its answer. It prints "bound N" once every socket is
// bound and waits for a line on its standard input before the exchange
// (so that a test can send strays to the bound sockets first); after
// it, it prints "ready N strays S" and waits for its standard input to
// close, so that the test measures its memory with every socket open.
//
// Every socket is on the host's loopback, where any other program may
// send to its port (a port another program used a moment ago, whose peer
// still sends to it): such a stray datagram is not part of the exchange.
// Socket 0 answers only a request from the socket its text names, and a
// socket takes only socket 0's datagram as its answer; anything else is
// a stray, reported on standard error, counted (S) and skipped. Also: "burst K" mode sends K datagrams to one
// socket that reads nothing until all are sent, then counts what it can
// read (the kernel's SO_RCVBUF decides).
//
// Usage: manysock N | manysock burst K RCVBUF | manysock sizes | manysock churn N | manysock epoll N | manysock answer N
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#define FAIL(...) do { fprintf(stderr, "manysock: " __VA_ARGS__); fprintf(stderr, " (errno %d: %s)\n", errno, strerror(errno)); exit(1); } while (0)
// FAILX: a failure no system call reported (errno says nothing).
#define FAILX(...) do { fprintf(stderr, "manysock: " __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } while (0)

// The exchange's wait for a datagram already sent on loopback: generous,
// for a loaded machine (and the engine under the preload).
#define WAIT_MS 30000

static int same(const struct sockaddr_in *x, const struct sockaddr_in *y) {
	return x->sin_family == y->sin_family && x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
}

// stray reports a datagram that is not part of the exchange, and counts it.
static int strays;
static void stray(int i, const char *b, ssize_t m, const struct sockaddr_in *from) {
	char addr[INET_ADDRSTRLEN] = "?";
	inet_ntop(AF_INET, &from->sin_addr, addr, sizeof addr);
	fprintf(stderr, "manysock: socket %d skipped a stray datagram of %zd bytes from %s:%d:", i, m, addr, ntohs(from->sin_port));
	for (ssize_t j = 0; j < m && j < 16; j++) fprintf(stderr, " %02x", (unsigned char)b[j]);
	fprintf(stderr, "\n");
	strays++;
}

static int udp(struct sockaddr_in *a) {
	int fd = socket(AF_INET, SOCK_DGRAM, 0);
	if (fd < 0) FAIL("socket");
	memset(a, 0, sizeof *a);
	a->sin_family = AF_INET;
	a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(fd, (struct sockaddr *)a, sizeof *a) != 0) FAIL("bind");
	socklen_t l = sizeof *a;
	if (getsockname(fd, (struct sockaddr *)a, &l) != 0) FAIL("getsockname");
	return fd;
}

static void timeo(int fd, int ms) {
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

static int burst(int k, int rcvbuf) {
	struct sockaddr_in ra, sa;
	int r = socket(AF_INET, SOCK_DGRAM, 0);
	if (r < 0) FAIL("socket");
	if (setsockopt(r, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf) != 0) FAIL("SO_RCVBUF");
	memset(&ra, 0, sizeof ra);
	ra.sin_family = AF_INET;
	ra.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(r, (struct sockaddr *)&ra, sizeof ra) != 0) FAIL("bind");
	socklen_t l = sizeof ra;
	getsockname(r, (struct sockaddr *)&ra, &l);
	int s = udp(&sa);
	char buf[1000];
	memset(buf, 'b', sizeof buf);
	for (int i = 0; i < k; i++)
		if (sendto(s, buf, sizeof buf, 0, (struct sockaddr *)&ra, sizeof ra) != (ssize_t)sizeof buf) FAIL("sendto %d", i);
	usleep(200000);
	int n = 0;
	fcntl(r, F_SETFL, O_NONBLOCK);
	while (recv(r, buf, sizeof buf, 0) == (ssize_t)sizeof buf) n++;
	printf("received %d of %d\n", n, k);
	return 0;
}

// sizes: datagrams of every size class and across their edges arrive
// whole, each with its length, in order, interleaved small and large.
static int sizes(void) {
	static const int sz[] = {1, 100, 2047, 2048, 2049, 30000, 65000, 7, 64000, 1500};
	static unsigned char out[65536], in[65536];
	struct sockaddr_in aa, ba;
	int a = udp(&aa), b = udp(&ba);
	timeo(b, 5000);
	for (int k = 0; k < 3; k++)
		for (size_t i = 0; i < sizeof sz / sizeof sz[0]; i++) {
			for (int j = 0; j < sz[i]; j++) out[j] = (unsigned char)(j * 7 + i + k);
			if (sendto(a, out, sz[i], 0, (struct sockaddr *)&ba, sizeof ba) != sz[i]) FAIL("sendto %d", sz[i]);
			ssize_t m = recv(b, in, sizeof in, 0);
			if (m != sz[i] || memcmp(in, out, sz[i]) != 0) FAIL("%zd bytes back for %d", m, sz[i]);
		}
	printf("sizes ok\n");
	return 0;
}

// churn: opens N bound UDP sockets and closes them all, as a SIP UAC
// with a socket per call does when its calls end.
static int churn(int n) {
	int *fd = calloc(n, sizeof *fd);
	struct sockaddr_in a;
	for (int i = 0; i < n; i++) fd[i] = udp(&a);
	for (int i = 0; i < n; i++)
		if (close(fd[i]) != 0) FAIL("close %d", i);
	printf("closed %d\n", n);
	return 0;
}

// epoll: N non-blocking sockets get a datagram each from one sender
// before anything reads; then a level-triggered epoll loop with room for
// every event reads them as SIPp's does — every socket an event names
// read until EAGAIN, in the order of the events — until all N are read
// or no event comes for 5 s (what was lost stays lost). It prints what
// it read and the most events one epoll_wait gave.
static int epollmode(int n) {
	struct rlimit rl;
	getrlimit(RLIMIT_NOFILE, &rl);
	if (rl.rlim_cur < (rlim_t)n + 64) {
		rl.rlim_cur = (rlim_t)n + 64;
		if (rl.rlim_max < rl.rlim_cur) rl.rlim_max = rl.rlim_cur;
		if (setrlimit(RLIMIT_NOFILE, &rl) != 0) FAIL("RLIMIT_NOFILE %d", n + 64);
	}
	struct sockaddr_in sa;
	int s = udp(&sa);
	int *fd = calloc(n, sizeof *fd);
	struct sockaddr_in *a = calloc(n, sizeof *a);
	struct epoll_event *evs = calloc(n, sizeof *evs);
	int ep = epoll_create1(0);
	if (ep < 0) FAIL("epoll_create1");
	for (int i = 0; i < n; i++) {
		fd[i] = udp(&a[i]);
		if (fcntl(fd[i], F_SETFL, O_NONBLOCK) != 0) FAIL("O_NONBLOCK");
		struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 1000000 + i}; // an index, not the descriptor, as SIPp's
		if (epoll_ctl(ep, EPOLL_CTL_ADD, fd[i], &ev) != 0) FAIL("epoll_ctl");
	}
	char buf[256];
	for (int i = 0; i < n; i++) {
		int m = snprintf(buf, sizeof buf, "to %d", i);
		if (sendto(s, buf, m, 0, (struct sockaddr *)&a[i], sizeof a[i]) != m) FAIL("sendto %d", i);
	}
	int got = 0, most = 0;
	while (got < n) {
		int k = epoll_wait(ep, evs, n, 5000);
		if (k < 0) FAIL("epoll_wait");
		if (k == 0) break;
		if (k > most) most = k;
		for (int j = 0; j < k; j++) {
			int i = (int)(evs[j].data.u64 - 1000000);
			if (i < 0 || i >= n) FAILX("an event with data %llu", (unsigned long long)evs[j].data.u64);
			for (;;) {
				ssize_t m = recv(fd[i], buf, sizeof buf, 0);
				if (m < 0 && errno == EAGAIN) break;
				if (m < 0) FAIL("recv %d", i);
				got++;
			}
		}
	}
	printf("epoll got %d of %d, most %d at once\n", got, n, most);
	return 0;
}

// answer: a server socket and N client sockets, all non-blocking, in one
// poll loop, as a SIP server and its clients: every client sends the
// server a request at once; the server reads one request per poll and
// answers it at once with two datagrams, as a SIP server answers an
// INVITE with 180 and 200 (so its queue holds the others as it sends),
// each client reads its answers; twice. It prints the answers read.
static int answer(int n) {
	struct sockaddr_in a0;
	int s0 = udp(&a0);
	if (fcntl(s0, F_SETFL, O_NONBLOCK) != 0) FAIL("O_NONBLOCK");
	int *fd = calloc(n, sizeof *fd);
	struct pollfd *p = calloc(n + 1, sizeof *p);
	struct sockaddr_in a;
	p[0] = (struct pollfd){.fd = s0, .events = POLLIN};
	for (int i = 0; i < n; i++) {
		fd[i] = udp(&a);
		if (fcntl(fd[i], F_SETFL, O_NONBLOCK) != 0) FAIL("O_NONBLOCK");
		p[i + 1] = (struct pollfd){.fd = fd[i], .events = POLLIN};
	}
	char buf[256];
	int got = 0;
	for (int round = 1; round <= 2; round++) { // the second with every peer known
		for (int i = 0; i < n; i++) {
			int m = snprintf(buf, sizeof buf, "request %d", i);
			if (sendto(fd[i], buf, m, 0, (struct sockaddr *)&a0, sizeof a0) != m) FAIL("sendto %d", i);
		}
		while (got < round * 2 * n) {
			int k = poll(p, n + 1, 10000);
			if (k < 0) FAIL("poll");
			if (k == 0) FAILX("%d of %d answers: nothing more in 10 s", got, 4 * n);
			if (p[0].revents & POLLIN) {
				struct sockaddr_in from;
				socklen_t fl = sizeof from;
				ssize_t m = recvfrom(s0, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl);
				if (m < 0 && errno != EAGAIN) FAIL("recvfrom");
				for (int j = 0; m >= 0 && j < 2; j++) // two answers, as a SIP server's 180 and 200 to an INVITE
					if (sendto(s0, buf, m, 0, (struct sockaddr *)&from, fl) != m) FAIL("answer");
			}
			for (int i = 0; i < n; i++) {
				if (!(p[i + 1].revents & POLLIN)) continue;
				ssize_t m = recv(fd[i], buf, sizeof buf, 0);
				if (m < 0 && errno != EAGAIN) FAIL("recv %d", i);
				if (m > 0) got++;
			}
		}
	}
	printf("answered %d\n", got);
	return 0;
}

int main(int argc, char **argv) {
	if (argc == 3 && !strcmp(argv[1], "epoll")) return epollmode(atoi(argv[2]));
	if (argc == 3 && !strcmp(argv[1], "answer")) return answer(atoi(argv[2]));
	if (argc == 2 && !strcmp(argv[1], "sizes")) return sizes();
	if (argc == 3 && !strcmp(argv[1], "churn")) return churn(atoi(argv[2]));
	if (argc == 4 && !strcmp(argv[1], "burst")) return burst(atoi(argv[2]), atoi(argv[3]));
	if (argc != 2) FAIL("usage: manysock N | manysock burst K RCVBUF | manysock sizes | manysock churn N | manysock epoll N | manysock answer N");
	int n = atoi(argv[1]);
	struct rlimit rl;
	getrlimit(RLIMIT_NOFILE, &rl);
	if (rl.rlim_cur < (rlim_t)n + 64) {
		rl.rlim_cur = (rlim_t)n + 64;
		if (rl.rlim_max < rl.rlim_cur) rl.rlim_max = rl.rlim_cur;
		if (setrlimit(RLIMIT_NOFILE, &rl) != 0) FAIL("RLIMIT_NOFILE %d", n + 64);
	}
	int *fd = calloc(n, sizeof *fd);
	struct sockaddr_in *a = calloc(n, sizeof *a);
	for (int i = 0; i < n; i++) fd[i] = udp(&a[i]);
	timeo(fd[0], WAIT_MS);
	char buf[256];
	printf("bound %d\n", n);
	fflush(stdout);
	if (read(0, buf, 1) != 1) FAIL("no go on standard input");
	// In rounds of 100, so that socket 0's queue never overflows (nor, before
	// the shared pool, the engine's 128 receives per socket).
	for (int lo = 1; lo < n; lo += 100) {
		int hi = lo + 100 < n ? lo + 100 : n;
		for (int i = lo; i < hi; i++) {
			int m = snprintf(buf, sizeof buf, "hello from %d", i);
			if (sendto(fd[i], buf, m, 0, (struct sockaddr *)&a[0], sizeof a[0]) != m) FAIL("sendto from %d", i);
		}
		for (int i = lo; i < hi;) {
			struct sockaddr_in from;
			socklen_t fl = sizeof from;
			ssize_t m = recvfrom(fd[0], buf, sizeof buf - 1, 0, (struct sockaddr *)&from, &fl);
			if (m < 0) FAIL("socket 0 received %d of round %d's %d requests", i - lo, lo, hi - lo);
			buf[m] = 0;
			int who = -1;
			if (m == 0 || sscanf(buf, "hello from %d", &who) != 1 || who < lo || who >= hi || !same(&from, &a[who])) {
				stray(0, buf, m, &from);
				continue;
			}
			if (sendto(fd[0], buf, m, 0, (struct sockaddr *)&from, fl) != m) FAIL("answer to %d", who);
			i++;
		}
		for (int i = lo; i < hi; i++) {
			timeo(fd[i], WAIT_MS);
			for (;;) {
				struct sockaddr_in from;
				socklen_t fl = sizeof from;
				ssize_t m = recvfrom(fd[i], buf, sizeof buf - 1, 0, (struct sockaddr *)&from, &fl);
				if (m < 0) FAIL("socket %d received no answer", i);
				if (!same(&from, &a[0])) {
					stray(i, buf, m, &from);
					continue;
				}
				buf[m] = 0;
				int who = -1;
				if (sscanf(buf, "hello from %d", &who) != 1 || who != i) FAILX("socket %d got %zd bytes from socket 0: \"%s\"", i, m, buf);
				break;
			}
		}
	}
	printf("ready %d strays %d\n", n, strays);
	fflush(stdout);
	while (read(0, buf, sizeof buf) > 0) {}
	return 0;
}
