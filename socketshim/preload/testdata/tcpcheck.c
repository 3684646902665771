// tcpcheck: what real programs do with TCP sockets, run under the preload
// with UDIWARP_PRELOAD_TCP=rc (tcp_test.go runs each mode and reads the
// engine's counters). Both ends of every connection are in this process,
// so both are the engine's. Every mode prints "ok MODE" and exits 0, or
// says what failed and exits 1.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define FAIL(...) do { fprintf(stderr, __VA_ARGS__); fprintf(stderr, " (errno %d %s)\n", errno, strerror(errno)); exit(1); } while (0)

static const char *self;

static int listener(int *port) {
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0) FAIL("socket");
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK), .sin_port = htons((uint16_t)*port)};
	if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) FAIL("bind");
	if (listen(fd, 16) != 0) FAIL("listen");
	socklen_t l = sizeof a;
	if (getsockname(fd, (struct sockaddr *)&a, &l) != 0) FAIL("getsockname");
	*port = ntohs(a.sin_port);
	return fd;
}

static int dial(int port) {
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0) FAIL("socket");
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK), .sin_port = htons((uint16_t)port)};
	if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) FAIL("connect to %d", port);
	return fd;
}

struct acc { int lfd, fd; };
static void *accepter(void *p) {
	struct acc *a = p;
	a->fd = accept(a->lfd, NULL, NULL);
	struct pollfd pf = {.fd = a->fd, .events = POLLOUT};
	if (a->fd >= 0 && poll(&pf, 1, 30000) != 1) FAIL("the accepted stream never writable");
	return NULL;
}

// pair connects two sockets through a listener: MPA's exchange needs the
// accept while connect waits, so the accept runs in a thread, which then
// waits until the accepted stream can be written to: under the preload,
// until its peer's MPA Request has come and been answered (a blocking
// accept waits 10 ms for it, less than a loaded machine may take).
static void pair(int *c, int *s, int *lfd_out, int *port_out) {
	int port = 0, lfd = listener(&port);
	struct acc a = {lfd, -1};
	pthread_t t;
	pthread_create(&t, NULL, accepter, &a);
	*c = dial(port);
	pthread_join(t, NULL);
	if (a.fd < 0) FAIL("accept");
	*s = a.fd;
	if (lfd_out) *lfd_out = lfd; else close(lfd);
	if (port_out) *port_out = port;
}

static void writeall(int fd, const void *b, size_t n) {
	const char *p = b;
	while (n > 0) {
		ssize_t k = write(fd, p, n);
		if (k <= 0) FAIL("write");
		p += k;
		n -= (size_t)k;
	}
}

static void readall(int fd, void *b, size_t n) {
	ssize_t k = recv(fd, b, n, MSG_WAITALL);
	if (k != (ssize_t)n) FAIL("recv MSG_WAITALL %zu: %zd", n, k);
}

static unsigned char pat(size_t i, int seed) { return (unsigned char)((i * 131 + (i >> 13) + (size_t)seed) & 0xff); }

// ---- stream: 8 MiB each way at once, random write and read sizes, writev
// and readv among them, every byte checked; then EOF.

struct dir { int fd, seed; size_t n; };

static void *writer(void *p) {
	struct dir *d = p;
	unsigned s = (unsigned)d->seed;
	unsigned char *b = malloc(200000);
	size_t off = 0;
	while (off < d->n) {
		size_t k = 1 + rand_r(&s) % 199999;
		if (k > d->n - off) k = d->n - off;
		for (size_t i = 0; i < k; i++) b[i] = pat(off + i, d->seed);
		if (rand_r(&s) % 4 == 0 && k > 1) {
			struct iovec v[2] = {{b, k / 2}, {b + k / 2, k - k / 2}};
			size_t done = 0;
			while (done < k) {
				ssize_t w = writev(d->fd, v, 2);
				if (w <= 0) FAIL("writev");
				done += (size_t)w;
				if (done < k) { // the rest as a plain write
					writeall(d->fd, b + done, k - done);
					done = k;
				}
			}
		} else {
			writeall(d->fd, b, k);
		}
		off += k;
	}
	free(b);
	if (shutdown(d->fd, SHUT_WR) != 0) FAIL("shutdown");
	return NULL;
}

static void *reader(void *p) {
	struct dir *d = p;
	unsigned s = (unsigned)d->seed * 7 + 1;
	unsigned char *b = malloc(300000);
	size_t off = 0;
	for (;;) {
		size_t k = 1 + rand_r(&s) % 299999;
		ssize_t r;
		if (rand_r(&s) % 3 == 0) {
			struct iovec v[3] = {{b, k / 3}, {b + k / 3, 0}, {b + k / 3, k - k / 3}};
			r = readv(d->fd, v, 3);
		} else {
			r = read(d->fd, b, k);
		}
		if (r < 0) FAIL("read");
		if (r == 0) break;
		for (ssize_t i = 0; i < r; i++)
			if (b[i] != pat(off + (size_t)i, d->seed)) FAIL("byte %zu: %d, want %d", off + (size_t)i, b[i], pat(off + (size_t)i, d->seed));
		off += (size_t)r;
	}
	if (off != d->n) FAIL("read %zu bytes, want %zu", off, d->n);
	free(b);
	return NULL;
}

static void mode_stream(void) {
	int c, s;
	pair(&c, &s, NULL, NULL);
	struct dir w1 = {c, 1, 8 << 20}, r1 = {s, 1, 8 << 20}, w2 = {s, 2, 8 << 20}, r2 = {c, 2, 8 << 20};
	pthread_t t[4];
	pthread_create(&t[0], NULL, writer, &w1);
	pthread_create(&t[1], NULL, reader, &r1);
	pthread_create(&t[2], NULL, writer, &w2);
	pthread_create(&t[3], NULL, reader, &r2);
	for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
	close(c);
	close(s);
}

// ---- nonblock: both ends non-blocking in one thread, driven by
// level-triggered epoll: 4 MiB each way, EAGAIN the only pause.

struct end { int fd; size_t sent, got; int seed, peer_seed, wclosed, eof; };

static void mode_nonblock(int edge) {
	int c, s;
	pair(&c, &s, NULL, NULL);
	const size_t N = 4 << 20;
	struct end e[2] = {{c, 0, 0, 3, 4, 0, 0}, {s, 0, 0, 4, 3, 0, 0}};
	int ep = epoll_create1(0);
	for (int i = 0; i < 2; i++) {
		fcntl(e[i].fd, F_SETFL, fcntl(e[i].fd, F_GETFL) | O_NONBLOCK);
		struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | (edge ? EPOLLET : 0), .data.u32 = (uint32_t)i};
		if (epoll_ctl(ep, EPOLL_CTL_ADD, e[i].fd, &ev) != 0) FAIL("epoll_ctl");
	}
	unsigned char *b = malloc(100000);
	time_t start = time(NULL);
	while (!(e[0].eof && e[1].eof)) {
		if (time(NULL) - start > 60) FAIL("stuck: sent %zu/%zu, got %zu/%zu", e[0].sent, e[1].sent, e[0].got, e[1].got);
		struct epoll_event evs[4];
		int n = epoll_wait(ep, evs, 4, 20000);
		if (n < 0) FAIL("epoll_wait");
		if (n == 0) FAIL("epoll_wait timed out: sent %zu/%zu, got %zu/%zu", e[0].sent, e[1].sent, e[0].got, e[1].got);
		for (int k = 0; k < n; k++) {
			struct end *x = &e[evs[k].data.u32];
			if ((evs[k].events & EPOLLOUT) && !x->wclosed) {
				for (;;) { // edge-triggered: until EAGAIN
					size_t want = N - x->sent < 70000 ? N - x->sent : 70000;
					if (want == 0) {
						shutdown(x->fd, SHUT_WR);
						x->wclosed = 1;
						break;
					}
					for (size_t i = 0; i < want; i++) b[i] = pat(x->sent + i, x->seed);
					ssize_t w = send(x->fd, b, want, 0);
					if (w < 0 && errno == EAGAIN) break;
					if (w <= 0) FAIL("send");
					x->sent += (size_t)w;
					if (!edge) break;
				}
			}
			if (evs[k].events & (EPOLLIN | EPOLLHUP | EPOLLRDHUP)) {
				int reads = 0;
				for (;;) {
					ssize_t r = recv(x->fd, b, 100000, 0);
					if (r < 0 && errno == EAGAIN) {
						if (reads == 0 && !edge) FAIL("epoll said readable, recv said EAGAIN");
						break;
					}
					if (r < 0) FAIL("recv");
					reads++;
					if (r == 0) {
						x->eof = 1;
						break;
					}
					for (ssize_t i = 0; i < r; i++)
						if (b[i] != pat(x->got + (size_t)i, x->peer_seed)) FAIL("byte %zu", x->got + (size_t)i);
					x->got += (size_t)r;
					if (!edge) break;
				}
			}
			if (x->wclosed && x->eof) epoll_ctl(ep, EPOLL_CTL_DEL, x->fd, NULL);
		}
	}
	if (e[0].got != N || e[1].got != N) FAIL("got %zu and %zu of %zu", e[0].got, e[1].got, N);
	free(b);
	close(ep);
	close(c);
	close(s);
}

// ---- poll / select: a peer sends 50 messages at intervals; poll (or
// select) must say readable exactly when a receive finds data.

struct pacer { int fd; int n; };
static void *pace(void *p) {
	struct pacer *x = p;
	for (int i = 0; i < x->n; i++) {
		usleep(2000);
		char m[64];
		int k = snprintf(m, sizeof m, "message %d;", i);
		writeall(x->fd, m, (size_t)k);
	}
	return NULL;
}

static void mode_poll(int use_select) {
	int c, s;
	pair(&c, &s, NULL, NULL);
	struct pacer x = {c, 50};
	pthread_t t;
	pthread_create(&t, NULL, pace, &x);
	char all[4096] = {0};
	size_t have = 0;
	char want[4096] = {0};
	size_t wl = 0;
	for (int i = 0; i < 50; i++) wl += (size_t)snprintf(want + wl, sizeof want - wl, "message %d;", i);
	while (have < wl) {
		int ready;
		if (use_select) {
			fd_set rs;
			FD_ZERO(&rs);
			FD_SET(s, &rs);
			struct timeval tv = {20, 0};
			ready = select(s + 1, &rs, NULL, NULL, &tv);
			if (ready > 0 && !FD_ISSET(s, &rs)) FAIL("select counted a descriptor it did not set");
		} else {
			struct pollfd p = {.fd = s, .events = POLLIN};
			ready = poll(&p, 1, 20000);
			if (ready > 0 && !(p.revents & POLLIN)) FAIL("poll revents %x", p.revents);
		}
		if (ready <= 0) FAIL("%s returned %d with %zu of %zu bytes received", use_select ? "select" : "poll", ready, have, wl);
		ssize_t r = recv(s, all + have, sizeof all - have, MSG_DONTWAIT);
		if (r <= 0) FAIL("%s said readable; recv returned %zd", use_select ? "select" : "poll", r);
		have += (size_t)r;
	}
	pthread_join(t, NULL);
	if (memcmp(all, want, wl) != 0) FAIL("bytes differ");
	// Nothing more: a poll with a short timeout says so.
	struct pollfd p = {.fd = s, .events = POLLIN};
	if (poll(&p, 1, 50) != 0) FAIL("poll reported an idle stream readable");
	close(c);
	close(s);
}

// ---- trickle: three one-byte messages that arrive together, read one
// at a time with select before each, as a control channel is (iperf3's):
// the third waited for a receive the first two held, and select must
// still see it once they are read.

static void mode_trickle(void) {
	int c, s;
	pair(&c, &s, NULL, NULL);
	writeall(c, "a", 1);
	writeall(c, "b", 1);
	writeall(c, "c", 1);
	usleep(50000);
	for (int i = 0; i < 3; i++) {
		fd_set rs;
		FD_ZERO(&rs);
		FD_SET(s, &rs);
		struct timeval tv = {20, 0};
		if (select(s + 1, &rs, NULL, NULL, &tv) != 1) FAIL("select before byte %d", i);
		char b;
		if (read(s, &b, 1) != 1 || b != "abc"[i]) FAIL("byte %d", i);
	}
	close(c);
	close(s);
}

// ---- peek: MSG_PEEK, FIONREAD, MSG_WAITALL across two Sends.

struct later { int fd; const char *m; int us; };
static void *send_later(void *p) {
	struct later *x = p;
	usleep((useconds_t)x->us);
	writeall(x->fd, x->m, strlen(x->m));
	return NULL;
}

static void mode_peek(void) {
	int c, s;
	pair(&c, &s, NULL, NULL);
	writeall(c, "hello ", 6);
	char b[64] = {0};
	struct pollfd p = {.fd = s, .events = POLLIN};
	if (poll(&p, 1, 20000) != 1) FAIL("poll");
	if (recv(s, b, 5, MSG_PEEK) != 5 || memcmp(b, "hello", 5)) FAIL("MSG_PEEK: %s", b);
	int avail = 0;
	if (ioctl(s, FIONREAD, &avail) != 0 || avail != 6) FAIL("FIONREAD %d, want 6", avail);
	struct later l = {c, "world", 20000};
	pthread_t t;
	pthread_create(&t, NULL, send_later, &l);
	memset(b, 0, sizeof b);
	if (recv(s, b, 11, MSG_WAITALL) != 11 || memcmp(b, "hello world", 11)) FAIL("MSG_WAITALL: %s", b);
	pthread_join(t, NULL);
	if (recv(s, b, 1, MSG_DONTWAIT) != -1 || errno != EAGAIN) FAIL("an empty stream's MSG_DONTWAIT receive");
	if (recv(s, b, 1, MSG_OOB) != -1 || errno != EOPNOTSUPP) FAIL("MSG_OOB");
	close(c);
	close(s);
}

// ---- shutdown: half-close both ways, as a request/response protocol does.

static void mode_shutdown(void) {
	int c, s;
	pair(&c, &s, NULL, NULL);
	writeall(c, "request", 7);
	if (shutdown(c, SHUT_WR) != 0) FAIL("shutdown");
	char b[64];
	readall(s, b, 7);
	if (memcmp(b, "request", 7)) FAIL("request");
	if (read(s, b, sizeof b) != 0) FAIL("EOF after the peer's SHUT_WR");
	writeall(s, "response", 8);
	close(s);
	readall(c, b, 8);
	if (memcmp(b, "response", 8)) FAIL("response");
	if (read(c, b, sizeof b) != 0) FAIL("EOF after the peer's close");
	// Writing to a stream the peer closed: EPIPE, without the signal.
	ssize_t w = 0;
	for (int i = 0; i < 20000 && w >= 0; i++) { // until the peer's reset has come back: 20 s at most
		w = send(c, "x", 1, MSG_NOSIGNAL);
		usleep(1000);
	}
	if (w >= 0 || (errno != EPIPE && errno != ECONNRESET)) FAIL("send to a closed peer: %zd", w);
	close(c);
}

// ---- eintr: a blocking receive and an interval timer, without and with
// SA_RESTART.

static volatile sig_atomic_t fired;
static void onalarm(int sig) { (void)sig; fired++; }

// send_after_alarm sends "late" once the timer has interrupted the
// receive (and, with SA_RESTART, the receive went on): by order, not time.
static void *send_after_alarm(void *p) {
	while (!fired) usleep(1000);
	usleep(10000);
	writeall(*(int *)p, "late", 4);
	return NULL;
}

static void mode_eintr(void) {
	int c, s;
	pair(&c, &s, NULL, NULL);
	struct sigaction sa = {0};
	sa.sa_handler = onalarm;
	sigaction(SIGALRM, &sa, NULL);
	struct itimerval it = {{0, 0}, {0, 100000}};
	setitimer(ITIMER_REAL, &it, NULL);
	char b[16];
	if (recv(s, b, sizeof b, 0) != -1 || errno != EINTR || !fired) FAIL("no EINTR");
	sa.sa_flags = SA_RESTART;
	sigaction(SIGALRM, &sa, NULL);
	fired = 0;
	setitimer(ITIMER_REAL, &it, NULL);
	pthread_t t;
	pthread_create(&t, NULL, send_after_alarm, &c);
	ssize_t r = recv(s, b, sizeof b, 0);
	pthread_join(t, NULL);
	if (r != 4 || memcmp(b, "late", 4) || !fired) FAIL("SA_RESTART receive: %zd, fired %d", r, (int)fired);
	close(c);
	close(s);
}

// ---- fork: the child cannot carry the parent's streams (EOPNOTSUPP), but
// its own new connection is plain TCP, which the parent's accept leaves
// to the kernel; the parent's streams go on.

static void mode_fork(void) {
	int c, s, lfd, port;
	pair(&c, &s, &lfd, &port);
	pid_t pid = fork();
	if (pid < 0) FAIL("fork");
	if (pid == 0) {
		char b[8];
		if (recv(c, b, 1, MSG_DONTWAIT) != -1 || errno != EOPNOTSUPP) _exit(10);
		if (send(c, "x", 1, MSG_NOSIGNAL) != -1 || errno != EOPNOTSUPP) _exit(11);
		int d = socket(AF_INET, SOCK_STREAM, 0);
		struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK), .sin_port = htons((uint16_t)port)};
		if (connect(d, (struct sockaddr *)&a, sizeof a) != 0) _exit(12);
		if (write(d, "child", 5) != 5) _exit(13);
		if (recv(d, b, 2, MSG_WAITALL) != 2 || memcmp(b, "ok", 2)) _exit(14);
		_exit(0);
	}
	int k = accept(lfd, NULL, NULL);
	if (k < 0) FAIL("accept the child's connection");
	char b[8];
	readall(k, b, 5);
	if (memcmp(b, "child", 5)) FAIL("child's bytes");
	writeall(k, "ok", 2);
	int st;
	waitpid(pid, &st, 0);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) FAIL("child exited %d", WEXITSTATUS(st));
	writeall(c, "after", 5);
	readall(s, b, 5);
	if (memcmp(b, "after", 5)) FAIL("the parent's stream after the fork");
	close(k);
	close(c);
	close(s);
	close(lfd);
}

// ---- exec: an exec'd program never inherits a stream in MPA's framing
// (FD_CLOEXEC in the kernel), while F_GETFD shows what the program set.

static void mode_exec(void) {
	int c, s;
	pair(&c, &s, NULL, NULL);
	int fl = fcntl(c, F_GETFD);
	if (fl != 0) FAIL("F_GETFD %d, want 0 (the program set no FD_CLOEXEC)", fl);
	int d = dup(c);
	pid_t pid = fork();
	if (pid == 0) {
		char a1[16], a2[16];
		snprintf(a1, sizeof a1, "%d", c);
		snprintf(a2, sizeof a2, "%d", d);
		execl(self, self, "execchild", a1, a2, (char *)NULL);
		_exit(20);
	}
	int st;
	waitpid(pid, &st, 0);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) FAIL("exec'd child exited %d", WEXITSTATUS(st));
	if (fcntl(c, F_SETFD, FD_CLOEXEC) != 0 || fcntl(c, F_GETFD) != FD_CLOEXEC) FAIL("F_SETFD");
	close(d);
	writeall(c, "still", 5);
	char b[8];
	readall(s, b, 5);
	close(c);
	close(s);
}

static int execchild(int a, int b) {
	if (fcntl(a, F_GETFD) != -1 || fcntl(b, F_GETFD) != -1) {
		fprintf(stderr, "an exec'd program inherited an RC stream's descriptor\n");
		return 1;
	}
	return 0;
}

// ---- closeall: a daemon closing every descriptor, then new streams.

static void mode_closeall(void) {
	int c, s;
	pair(&c, &s, NULL, NULL);
	for (int fd = 3; fd < 1024; fd++) close(fd);
	pair(&c, &s, NULL, NULL);
	writeall(c, "again", 5);
	char b[8];
	readall(s, b, 5);
	if (memcmp(b, "again", 5)) FAIL("after closing everything");
	close(c);
	close(s);
}

// ---- refused <port>: a listener that is no preloaded program answers
// the MPA Request with something else: connect fails, and the socket
// never carries plain bytes after it.

static void mode_refused(int port) {
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK), .sin_port = htons((uint16_t)port)};
	if (connect(fd, (struct sockaddr *)&a, sizeof a) != -1 || errno != ECONNREFUSED) FAIL("connect to a plain listener");
	if (send(fd, "x", 1, MSG_NOSIGNAL) != -1 || errno != EPIPE) FAIL("send after a refused connect");
	close(fd);
}

// ---- echo <port>: one connection, echoed to its end.

static void mode_echo(int port) {
	int lfd = listener(&port);
	printf("listening\n");
	fflush(stdout);
	int c = accept(lfd, NULL, NULL);
	if (c < 0) FAIL("accept");
	char b[4096];
	for (;;) {
		ssize_t r = read(c, b, sizeof b);
		if (r < 0) FAIL("read");
		if (r == 0) break;
		writeall(c, b, (size_t)r);
	}
	close(c);
	close(lfd);
}

// ---- serve2 <port>: two connections, each echoed to its end in a thread
// of its own; accept must not wait on a client that has not spoken. A
// connection that fails is said on stdout ("conn error ERRNO") and ends.

static void *echo_conn(void *p) {
	int c = (int)(intptr_t)p;
	char b[4096];
	for (;;) {
		ssize_t r = read(c, b, sizeof b);
		if (r < 0) {
			printf("conn error %d\n", errno);
			fflush(stdout);
			break;
		}
		if (r == 0) break;
		writeall(c, b, (size_t)r);
	}
	close(c);
	return NULL;
}

static void mode_serve2(int port) {
	int lfd = listener(&port);
	printf("listening\n");
	fflush(stdout);
	pthread_t t[2];
	for (int i = 0; i < 2; i++) {
		int c = accept(lfd, NULL, NULL);
		if (c < 0) FAIL("accept");
		pthread_create(&t[i], NULL, echo_conn, (void *)(intptr_t)c);
	}
	for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
	close(lfd);
}

// ---- client <port>: one echoed message.

static void mode_client(int port) {
	int c = dial(port);
	writeall(c, "ping", 4);
	char b[4];
	readall(c, b, 4);
	if (memcmp(b, "ping", 4)) FAIL("echo");
	close(c);
}

// ---- evloop <port> <poll|select|epoll|epollet> <greet> <countfile>: a
// single-threaded event-loop echo server, as nginx or redis are: a
// non-blocking listener and connections, one wait (poll, select,
// level- or edge-triggered epoll) for all. With greet 1 it speaks first,
// "hello\n" to every connection it accepts. After each accept, and every
// 64 waits, it writes to countfile the connections accepted so far and
// the waits it made (a wait that returns with nothing to do, over and
// over, is a busy loop). It never exits on its own.

#define EVMAX 1000
struct evconn { int fd; size_t n; char out[8192]; };
static struct evconn *evc[65536];
static int ev_accepted;
static long ev_waits;

static void ev_count(const char *countfile) { // whole, by rename: a reader never sees it half written
	char tmp[4096];
	snprintf(tmp, sizeof tmp, "%s.tmp", countfile);
	FILE *f = fopen(tmp, "w");
	if (f) {
		fprintf(f, "%d %ld\n", ev_accepted, ev_waits);
		fclose(f);
		rename(tmp, countfile);
	}
}

static void ev_close(int ep, struct evconn *c) {
	if (ep >= 0) epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
	evc[c->fd] = NULL;
	close(c->fd);
	free(c);
}

// ev_flush writes what c holds: 0, or -1 when the connection failed.
static int ev_flush(struct evconn *c) {
	while (c->n > 0) {
		ssize_t w = write(c->fd, c->out, c->n);
		if (w < 0) return errno == EAGAIN ? 0 : -1;
		memmove(c->out, c->out + w, c->n - (size_t)w);
		c->n -= (size_t)w;
	}
	return 0;
}

// ev_serve reads what c's peer sent (until EAGAIN) and echoes it: 0, or
// -1 when the connection ended.
static int ev_serve(struct evconn *c) {
	for (;;) {
		if (c->n == sizeof c->out) return ev_flush(c);
		ssize_t r = read(c->fd, c->out + c->n, sizeof c->out - c->n);
		if (r == 0) return -1;
		if (r < 0) return errno == EAGAIN ? ev_flush(c) : -1;
		c->n += (size_t)r;
		if (ev_flush(c) < 0) return -1;
	}
}

static void ev_want(int ep, struct evconn *c, int edge) {
	if (ep < 0 || edge) return;
	struct epoll_event e = {.events = EPOLLIN | (c->n ? EPOLLOUT : 0), .data.fd = c->fd};
	epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &e);
}

static void mode_evloop(int port, const char *how, int greet, const char *countfile) {
	int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	if (lfd < 0) FAIL("socket");
	int one = 1;
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK), .sin_port = htons((uint16_t)port)};
	if (bind(lfd, (struct sockaddr *)&a, sizeof a) != 0) FAIL("bind");
	if (listen(lfd, 1024) != 0) FAIL("listen");
	int usepoll = !strcmp(how, "poll"), usesel = !strcmp(how, "select"), edge = !strcmp(how, "epollet");
	int ep = -1;
	if (!usepoll && !usesel) {
		ep = epoll_create1(0);
		struct epoll_event e = {.events = EPOLLIN, .data.fd = lfd};
		if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &e) != 0) FAIL("epoll");
	}
	static struct pollfd pf[EVMAX + 1];
	static struct epoll_event evs[64];
	for (;;) {
		// The wait: which connections may read (r) and write (w).
		static unsigned char r[65536], w[65536];
		int lready = 0, top = 0, n = 0;
		if (++ev_waits % 64 == 0) ev_count(countfile);
		if (usepoll) {
			pf[n++] = (struct pollfd){.fd = lfd, .events = POLLIN};
			for (int fd = 0; fd < 65536; fd++)
				if (evc[fd]) pf[n++] = (struct pollfd){.fd = fd, .events = POLLIN | (evc[fd]->n ? POLLOUT : 0)};
			if (poll(pf, (nfds_t)n, -1) < 0) {
				if (errno == EINTR) continue;
				FAIL("poll");
			}
			lready = pf[0].revents != 0;
			for (int i = 1; i < n; i++) {
				r[pf[i].fd] = (pf[i].revents & ~POLLOUT) != 0;
				w[pf[i].fd] = (pf[i].revents & POLLOUT) != 0;
			}
		} else if (usesel) {
			fd_set rs, ws;
			FD_ZERO(&rs);
			FD_ZERO(&ws);
			FD_SET(lfd, &rs);
			top = lfd;
			for (int fd = 0; fd < FD_SETSIZE; fd++)
				if (evc[fd]) {
					FD_SET(fd, &rs);
					if (evc[fd]->n) FD_SET(fd, &ws);
					if (fd > top) top = fd;
				}
			if (select(top + 1, &rs, &ws, NULL, NULL) < 0) {
				if (errno == EINTR) continue;
				FAIL("select");
			}
			lready = FD_ISSET(lfd, &rs);
			for (int fd = 0; fd <= top; fd++)
				if (evc[fd]) {
					r[fd] = FD_ISSET(fd, &rs) != 0;
					w[fd] = FD_ISSET(fd, &ws) != 0;
				}
		} else {
			n = epoll_wait(ep, evs, 64, -1);
			if (n < 0 && errno == EINTR) continue;
			if (n < 0) FAIL("epoll_wait");
			for (int i = 0; i < n; i++) {
				int fd = evs[i].data.fd;
				if (fd == lfd) lready = 1;
				else if (evc[fd]) {
					r[fd] = (evs[i].events & ~(uint32_t)EPOLLOUT) != 0;
					w[fd] = (evs[i].events & EPOLLOUT) != 0;
				}
			}
		}
		for (int fd = 0; fd < 65536; fd++) {
			if (!evc[fd] || (!r[fd] && !w[fd])) continue;
			struct evconn *c = evc[fd];
			int rd = r[fd];
			r[fd] = w[fd] = 0;
			if ((rd ? ev_serve(c) : ev_flush(c)) < 0) ev_close(ep, c);
			else ev_want(ep, c, edge);
		}
		while (lready) {
			int c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK);
			if (c < 0) {
				if (errno == EAGAIN) break;
				if (errno == EINTR || errno == ECONNABORTED) continue;
				FAIL("accept");
			}
			if (c >= 65536 || (usesel && c >= FD_SETSIZE)) FAIL("descriptor %d", c);
			struct evconn *e = calloc(1, sizeof *e);
			e->fd = c;
			evc[c] = e;
			if (ep >= 0) {
				struct epoll_event ev = {.events = EPOLLIN | (edge ? EPOLLOUT | EPOLLET : 0), .data.fd = c};
				if (epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev) != 0) FAIL("epoll_ctl");
			}
			if (greet) {
				memcpy(e->out, "hello\n", 6);
				e->n = 6;
				if (ev_flush(e) < 0) {
					ev_close(ep, e);
					continue;
				}
				ev_want(ep, e, edge);
			}
			ev_accepted++;
			ev_count(countfile);
		}
	}
}

// ---- pingpong <port> <n> <greet>: n echoed messages, after the server's
// greeting with greet 1.

static void mode_pingpong(int port, int n, int greet) {
	int c = dial(port);
	char b[6];
	if (greet) {
		readall(c, b, 6);
		if (memcmp(b, "hello\n", 6)) FAIL("greeting");
	}
	for (int i = 0; i < n; i++) {
		writeall(c, "ping", 4);
		readall(c, b, 4);
		if (memcmp(b, "ping", 4)) FAIL("echo %d", i);
	}
	close(c);
}

int main(int argc, char **argv) {
	self = argv[0];
	if (argc < 2) FAIL("usage: tcpcheck MODE");
	const char *m = argv[1];
	if (!strcmp(m, "stream")) mode_stream();
	else if (!strcmp(m, "nonblock")) mode_nonblock(0);
	else if (!strcmp(m, "edge")) mode_nonblock(1);
	else if (!strcmp(m, "poll")) mode_poll(0);
	else if (!strcmp(m, "select")) mode_poll(1);
	else if (!strcmp(m, "peek")) mode_peek();
	else if (!strcmp(m, "trickle")) mode_trickle();
	else if (!strcmp(m, "shutdown")) mode_shutdown();
	else if (!strcmp(m, "eintr")) mode_eintr();
	else if (!strcmp(m, "fork")) mode_fork();
	else if (!strcmp(m, "exec")) mode_exec();
	else if (!strcmp(m, "execchild") && argc == 4) return execchild(atoi(argv[2]), atoi(argv[3]));
	else if (!strcmp(m, "closeall")) mode_closeall();
	else if (!strcmp(m, "refused") && argc == 3) mode_refused(atoi(argv[2]));
	else if (!strcmp(m, "echo") && argc == 3) mode_echo(atoi(argv[2]));
	else if (!strcmp(m, "serve2") && argc == 3) mode_serve2(atoi(argv[2]));
	else if (!strcmp(m, "client") && argc == 3) mode_client(atoi(argv[2]));
	else if (!strcmp(m, "evloop") && argc == 6) mode_evloop(atoi(argv[2]), argv[3], atoi(argv[4]), argv[5]);
	else if (!strcmp(m, "pingpong") && argc == 5) mode_pingpong(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
	else FAIL("unknown mode %s", m);
	printf("ok %s\n", m);
	return 0;
}
