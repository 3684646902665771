// survive: what real programs do to a preloaded process, one mode per
// run (preload_test.go runs each under LD_PRELOAD and reads the engine's
// counters). Every mode prints "ok MODE" and exits 0, or says what
// failed and exits 1.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/time.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#define FAIL(...) do { fprintf(stderr, __VA_ARGS__); fprintf(stderr, " (errno %d %s)\n", errno, strerror(errno)); exit(1); } while (0)

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

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

// pingpong sends n datagrams from a to b's address and echoes them back.
static double pingpong(int a, int b, struct sockaddr_in *aa, struct sockaddr_in *ba, int n) {
	char buf[256];
	double worst = 0;
	for (int i = 0; i < n; i++) {
		double t = now();
		int len = snprintf(buf, sizeof buf, "ping %d", i);
		if (sendto(a, buf, len, 0, (struct sockaddr *)ba, sizeof *ba) != len) FAIL("sendto a");
		struct sockaddr_in from;
		socklen_t fl = sizeof from;
		ssize_t r = recvfrom(b, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl);
		if (r != len || from.sin_port != aa->sin_port) FAIL("recvfrom b: %zd", r);
		if (sendto(b, buf, r, 0, (struct sockaddr *)&from, fl) != r) FAIL("sendto b");
		if (recv(a, buf, sizeof buf, 0) != len) FAIL("recv a");
		if (now() - t > worst) worst = now() - t;
	}
	return worst;
}

struct pair { int a, b; struct sockaddr_in aa, ba; int n; double worst; volatile int *stop; };

static void *pairloop(void *p) {
	struct pair *q = p;
	if (q->stop) {
		while (!*q->stop) pingpong(q->a, q->b, &q->aa, &q->ba, 10);
	} else {
		q->worst = pingpong(q->a, q->b, &q->aa, &q->ba, q->n);
	}
	return NULL;
}

// fork while threads are inside the shim: every child goes on over the
// kernel with the inherited socket, and none hangs.
static void mode_fork(void) {
	struct pair p[4];
	volatile int stop = 0;
	pthread_t th[4];
	for (int i = 0; i < 4; i++) {
		p[i].a = udp(&p[i].aa);
		p[i].b = udp(&p[i].ba);
		p[i].stop = &stop;
		pthread_create(&th[i], NULL, pairloop, &p[i]);
	}
	for (int k = 0; k < 20; k++) {
		usleep(20000);
		pid_t pid = fork();
		if (pid < 0) FAIL("fork");
		if (pid == 0) {
			alarm(5);
			struct sockaddr_in ka;
			int k2 = udp(&ka); // a new socket in the child: the kernel's
			char buf[64] = "from the child";
			if (sendto(p[0].a, buf, 14, 0, (struct sockaddr *)&ka, sizeof ka) != 14) _exit(2);
			if (recv(k2, buf, sizeof buf, 0) != 14) _exit(3);
			close(p[0].a);
			_exit(0);
		}
		int st;
		double t = now();
		while (waitpid(pid, &st, WNOHANG) == 0) {
			if (now() - t > 5) {
				kill(pid, SIGKILL);
				FAIL("child %d hung", k);
			}
			usleep(1000);
		}
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) FAIL("child %d: status %x", k, st);
	}
	stop = 1;
	for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
	pingpong(p[0].a, p[0].b, &p[0].aa, &p[0].ba, 100);
	printf("ok fork\n");
}

// closeall: a daemon closes every descriptor it did not open itself, by
// close() over /proc/self/fd and by closefrom(); the stack goes on.
static void mode_closeall(void) {
	struct sockaddr_in aa, ba;
	int a = udp(&aa), b = udp(&ba);
	pingpong(a, b, &aa, &ba, 100);
	int fds[4096], n = 0;
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	while ((e = readdir(d)) != NULL && n < 4096)
		if (e->d_name[0] >= '0' && e->d_name[0] <= '9') fds[n++] = atoi(e->d_name);
	int dfd = dirfd(d);
	for (int i = 0; i < n; i++)
		if (fds[i] > 2 && fds[i] != dfd) close(fds[i]);
	closedir(d);
	a = udp(&aa);
	b = udp(&ba);
	pingpong(a, b, &aa, &ba, 100);
	closefrom(3);
	a = udp(&aa);
	b = udp(&ba);
	pingpong(a, b, &aa, &ba, 100);
	printf("ok closeall\n");
}

static volatile int alarms;
static void onalarm(int sig) { (void)sig; alarms++; }

static void *sendlater(void *p) {
	struct pair *q = p;
	usleep(300000);
	sendto(q->a, "late", 4, 0, (struct sockaddr *)&q->ba, sizeof q->ba);
	return NULL;
}

// eintr: a signal without SA_RESTART interrupts a blocked receive; one
// with SA_RESTART does not; SO_RCVTIMEO times out with EAGAIN.
static void mode_eintr(void) {
	struct pair q;
	q.a = udp(&q.aa);
	q.b = udp(&q.ba);
	char buf[64];
	struct sigaction sa = {0};
	sa.sa_handler = onalarm;
	sigaction(SIGALRM, &sa, NULL);
	struct itimerval it = {{0, 0}, {0, 100000}};
	setitimer(ITIMER_REAL, &it, NULL);
	if (recv(q.b, buf, sizeof buf, 0) != -1 || errno != EINTR || alarms != 1) FAIL("no EINTR without SA_RESTART");
	sa.sa_flags = SA_RESTART;
	sigaction(SIGALRM, &sa, NULL);
	pthread_t th;
	pthread_create(&th, NULL, sendlater, &q);
	setitimer(ITIMER_REAL, &it, NULL);
	if (recv(q.b, buf, sizeof buf, 0) != 4 || alarms != 2) FAIL("not restarted with SA_RESTART (alarms %d)", alarms);
	pthread_join(th, NULL);
	struct timeval tv = {0, 100000};
	if (setsockopt(q.b, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0) FAIL("SO_RCVTIMEO");
	double t = now();
	if (recv(q.b, buf, sizeof buf, 0) != -1 || errno != EAGAIN) FAIL("no EAGAIN at SO_RCVTIMEO");
	if (now() - t < 0.09 || now() - t > 2) FAIL("SO_RCVTIMEO took %.3f s", now() - t);
	printf("ok eintr\n");
}

// errno: bad input gets the errors a kernel UDP socket gives.
static void mode_errno(void) {
	struct sockaddr_in aa, ba;
	int a = udp(&aa), b = udp(&ba);
	char buf[128];
	if (send(a, "x", 1, 0) != -1 || errno != EDESTADDRREQ) FAIL("send unconnected");
	if (recv(b, buf, sizeof buf, MSG_DONTWAIT) != -1 || errno != EAGAIN) FAIL("MSG_DONTWAIT");
	int fl = fcntl(b, F_GETFL);
	if (fl < 0 || (fl & O_NONBLOCK)) FAIL("F_GETFL shows O_NONBLOCK");
	if (fcntl(b, F_SETFL, fl | O_NONBLOCK) != 0 || !(fcntl(b, F_GETFL) & O_NONBLOCK)) FAIL("F_SETFL");
	if (recv(b, buf, sizeof buf, 0) != -1 || errno != EAGAIN) FAIL("O_NONBLOCK recv");
	int on = 0;
	if (ioctl(b, FIONBIO, &on) != 0 || (fcntl(b, F_GETFL) & O_NONBLOCK)) FAIL("FIONBIO");
	static char big[70000];
	if (sendto(a, big, sizeof big, 0, (struct sockaddr *)&ba, sizeof ba) != -1 || errno != EMSGSIZE) FAIL("EMSGSIZE");
	struct sockaddr_in6 v6 = {.sin6_family = AF_INET6, .sin6_port = htons(9), .sin6_addr = IN6ADDR_LOOPBACK_INIT};
	if (sendto(a, "x", 1, 0, (struct sockaddr *)&v6, sizeof v6) != -1 || errno != EAFNOSUPPORT) FAIL("EAFNOSUPPORT");
	if (bind(a, (struct sockaddr *)&aa, sizeof aa) != -1 || errno != EINVAL) FAIL("bind twice");
	if (sendto(a, "hello", 5, 0, (struct sockaddr *)&ba, sizeof ba) != 5) FAIL("sendto");
	struct pollfd p = {b, POLLIN, 0};
	if (poll(&p, 1, 2000) != 1) FAIL("poll");
	int avail = 0;
	if (ioctl(b, FIONREAD, &avail) != 0 || avail != 5) FAIL("FIONREAD %d", avail);
	if (recv(b, buf, 3, MSG_PEEK) != 3 || recv(b, buf, 2, MSG_TRUNC) != 5) FAIL("MSG_PEEK / MSG_TRUNC");
	struct msghdr m = {0};
	struct iovec iov = {buf, 2};
	m.msg_iov = &iov;
	m.msg_iovlen = 1;
	sendto(a, "hello", 5, 0, (struct sockaddr *)&ba, sizeof ba);
	if (poll(&p, 1, 2000) != 1 || recvmsg(b, &m, 0) != 2 || !(m.msg_flags & MSG_TRUNC)) FAIL("recvmsg MSG_TRUNC");
	int d = dup(b);
	close(b);
	sendto(a, "dup", 3, 0, (struct sockaddr *)&ba, sizeof ba);
	if (poll(&(struct pollfd){d, POLLIN, 0}, 1, 2000) != 1 || recv(d, buf, sizeof buf, 0) != 3) FAIL("dup");
	close(d);
	if (close(d) != -1 || errno != EBADF) FAIL("close twice");
	if (recv(d, buf, sizeof buf, 0) != -1 || errno != EBADF) FAIL("recv on a closed descriptor");
	if (connect(a, (struct sockaddr *)&aa, sizeof aa) != 0) FAIL("connect to self");
	if (write(a, "self", 4) != 4 || read(a, buf, sizeof buf) != 4) FAIL("write/read connected");
	printf("ok errno\n");
}

// readiness: poll, select and epoll (edge-triggered too) see owned
// sockets become readable, and not readable once drained.
static void mode_poll(void) {
	struct sockaddr_in aa, ba;
	int a = udp(&aa), b = udp(&ba);
	char buf[64];
	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.fd = b}, out[4];
	if (epoll_ctl(ep, EPOLL_CTL_ADD, b, &ev) != 0) FAIL("epoll_ctl");
	struct pollfd p = {b, POLLIN, 0};
	if (poll(&p, 1, 50) != 0) FAIL("readable before any datagram");
	for (int round = 0; round < 50; round++) {
		for (int i = 0; i < 3; i++) sendto(a, "r", 1, 0, (struct sockaddr *)&ba, sizeof ba);
		if (epoll_wait(ep, out, 4, 2000) != 1 || out[0].data.fd != b) FAIL("epoll_wait");
		fd_set rs;
		FD_ZERO(&rs);
		FD_SET(b, &rs);
		struct timeval tv = {2, 0};
		if (select(b + 1, &rs, NULL, NULL, &tv) != 1 || !FD_ISSET(b, &rs)) FAIL("select");
		int got = 0;
		while (recv(b, buf, sizeof buf, MSG_DONTWAIT) == 1) got++;
		while (got < 3 && poll(&p, 1, 2000) == 1)
			while (recv(b, buf, sizeof buf, MSG_DONTWAIT) == 1) got++;
		if (got != 3) FAIL("round %d: %d datagrams", round, got);
		if (poll(&p, 1, 0) != 0) FAIL("still readable when drained");
		if (epoll_wait(ep, out, 4, 0) != 0) FAIL("edge-triggered epoll fired with nothing new");
	}
	p.events = POLLOUT;
	if (poll(&p, 1, 0) != 1) FAIL("not writable");
	printf("ok poll\n");
}

// threads: many more program threads than the engine has Ps, all
// blocking in the shim at once.
static void mode_threads(int n) {
	struct pair *p = calloc(n, sizeof *p);
	pthread_t *th = calloc(n, sizeof *th);
	for (int i = 0; i < n; i++) {
		p[i].a = udp(&p[i].aa);
		p[i].b = udp(&p[i].ba);
		p[i].n = 100;
	}
	double t = now();
	for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, pairloop, &p[i]);
	double worst = 0;
	for (int i = 0; i < n; i++) {
		pthread_join(th[i], NULL);
		if (p[i].worst > worst) worst = p[i].worst;
	}
	printf("ok threads %d: %.2f s, worst round trip %.2f ms\n", n, now() - t, worst * 1e3);
}

// sigstack: handlers the program installs after the engine loaded,
// without SA_ONSTACK (sockperf's SIGINT and SIGALRM: sigaction with
// sa_flags 0; and signal()), never run on a goroutine stack. The main
// thread blocks in recv with a long spin, so it is inside the engine, on
// a goroutine stack of a few KiB, when another thread signals it; each
// delivery's handler frame must be on the thread's own stack or on its
// alternate signal stack. A handler on the goroutine stack puts the
// kernel's signal frame (2-3 KiB with AVX-512 state) and its own frames
// past that stack's end, into the next goroutine's: sockperf's client
// crashed so at the end of a run ("traceback did not unwind completely").
static char *stklo, *stkhi; // the main thread's own stack
static pthread_t mainth;
static volatile sig_atomic_t delivered, ingo, foreign;

static int within(uintptr_t p, const char *lo, const char *hi) { return p >= (uintptr_t)lo && p < (uintptr_t)hi; }

// classify records where a delivery's handler runs and where the thread
// was (uc: the interrupted context, or NULL). It uses about 4 KiB of
// stack, as a handler that formats a message does.
static void classify(void *uc) {
	volatile char room[4096];
	room[0] = room[sizeof room - 1] = 1;
	stack_t ss;
	int onalt = sigaltstack(NULL, &ss) == 0 && (ss.ss_flags & SS_ONSTACK);
	uintptr_t here = (uintptr_t)&room[0];
	if (!onalt && !within(here, stklo, stkhi)) foreign++;
#if defined(__x86_64__)
	uintptr_t sp = uc ? (uintptr_t)((ucontext_t *)uc)->uc_mcontext.gregs[REG_RSP] : 0;
#elif defined(__aarch64__)
	uintptr_t sp = uc ? (uintptr_t)((ucontext_t *)uc)->uc_mcontext.sp : 0;
#else
	uintptr_t sp = 0;
#endif
	// Interrupted neither on its own stack nor on the alternate one: the
	// thread was running Go on a goroutine stack.
	if (sp && !within(sp, stklo, stkhi) && !(onalt && within(sp, ss.ss_sp, (char *)ss.ss_sp + ss.ss_size))) ingo++;
	delivered++;
}

static void onusr1(int sig, siginfo_t *si, void *uc) { (void)sig, (void)si; classify(uc); }
static void onusr2(int sig) { (void)sig; classify(NULL); }

struct signaler { int n; int a; struct sockaddr_in to; };

static void *signalall(void *p) {
	struct signaler *g = p;
	for (int i = 0; i < g->n; i++) {
		int want = delivered + 1;
		pthread_kill(mainth, i % 4 == 3 ? SIGUSR2 : SIGUSR1);
		double t = now();
		while (delivered < want) {
			if (now() - t > 5) FAIL("signal %d not delivered", i);
			usleep(100);
		}
		usleep(500);
	}
	sendto(g->a, "stop", 4, 0, (struct sockaddr *)&g->to, sizeof g->to);
	return NULL;
}

static void mode_sigstack(int n) {
	// A receive spins in the engine this long (read when it loads).
	setenv("UDIWARP_PRELOAD_SPIN_NS", "5000000000", 1);
	struct sockaddr_in aa, ba;
	int a = udp(&aa), b = udp(&ba);
	pingpong(a, b, &aa, &ba, 10);
	mainth = pthread_self();
	pthread_attr_t at;
	void *lo;
	size_t size;
	if (pthread_getattr_np(mainth, &at) != 0 || pthread_attr_getstack(&at, &lo, &size) != 0) FAIL("main thread stack");
	pthread_attr_destroy(&at);
	stklo = lo;
	stkhi = (char *)lo + size;
	struct sigaction sa = {0}; // as sockperf: no SA_ONSTACK, no SA_RESTART
	sa.sa_sigaction = onusr1;
	sa.sa_flags = SA_SIGINFO;
	if (sigaction(SIGUSR1, &sa, NULL) != 0) FAIL("sigaction");
	if (signal(SIGUSR2, onusr2) == SIG_ERR) FAIL("signal");
	struct signaler g = {n, a, ba};
	pthread_t th;
	pthread_create(&th, NULL, signalall, &g);
	char buf[64];
	for (;;) {
		ssize_t r = recv(b, buf, sizeof buf, 0);
		if (r == 4 && !memcmp(buf, "stop", 4)) break;
		if (r < 0 && errno == EINTR) continue;
		FAIL("recv: %zd", r);
	}
	pthread_join(th, NULL);
	if (foreign || !ingo) {
		fprintf(stderr, "%d of %d handlers ran on a goroutine stack (no SA_ONSTACK); %d signals came while the thread was in the engine\n",
		        (int)foreign, (int)delivered, (int)ingo);
		exit(1);
	}
	printf("ok sigstack: %d signals, %d while in the engine\n", (int)delivered, (int)ingo);
}

// shutwr: shutdown(SHUT_WR) of a datagram socket stops the program's
// sends (EPIPE, as the kernel's UDP) but not the socket's: a, connected
// to b, sends three datagrams and shuts its sending down; b (a thread)
// receives them, answers three, and shuts down; a receives the answers.
// Under RD each shutdown waits for its socket's Sends to be acknowledged,
// and a's acknowledgements of b's answers leave by a's kernel socket
// after its SHUT_WR (preload_test.go reads the engine's counters: every
// datagram through, nothing failed). An unconnected socket's SHUT_WR
// fails with ENOTCONN, and shuts its sending down all the same.
struct shutpeer { int b; };

static void *shutwr_b(void *arg) {
	struct shutpeer *p = arg;
	char buf[64];
	struct sockaddr_in from;
	for (int i = 0; i < 3; i++) {
		socklen_t fl = sizeof from;
		ssize_t r = recvfrom(p->b, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl);
		if (r != 2 || buf[0] != 'a' || buf[1] != '0' + i) FAIL("b received %zd bytes, want a%d", r, i);
	}
	for (int i = 0; i < 3; i++) {
		char m[2] = {'b', (char)('0' + i)};
		if (sendto(p->b, m, 2, 0, (struct sockaddr *)&from, sizeof from) != 2) FAIL("sendto b");
	}
	if (shutdown(p->b, SHUT_WR) != -1 || errno != ENOTCONN) FAIL("shutdown of unconnected b: want ENOTCONN");
	return NULL;
}

static void mode_shutwr(void) {
	struct sockaddr_in aa, ba;
	int a = udp(&aa), b = udp(&ba);
	struct timeval tv = {20, 0}; // a datagram that never comes fails the mode, not the test's deadline
	if (setsockopt(a, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 || setsockopt(b, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0) FAIL("SO_RCVTIMEO");
	if (connect(a, (struct sockaddr *)&ba, sizeof ba) != 0) FAIL("connect");
	struct shutpeer p = {b};
	pthread_t th;
	if (pthread_create(&th, NULL, shutwr_b, &p) != 0) FAIL("pthread_create");
	for (int i = 0; i < 3; i++) {
		char m[2] = {'a', (char)('0' + i)};
		if (send(a, m, 2, 0) != 2) FAIL("send a");
	}
	if (shutdown(a, SHUT_WR) != 0) FAIL("shutdown(a, SHUT_WR)");
	if (send(a, "x", 1, 0) != -1 || errno != EPIPE) FAIL("send after SHUT_WR: want EPIPE");
	if (sendto(a, "x", 1, 0, (struct sockaddr *)&ba, sizeof ba) != -1 || errno != EPIPE) FAIL("sendto after SHUT_WR: want EPIPE");
	char buf[64];
	for (int i = 0; i < 3; i++) {
		ssize_t r = recv(a, buf, sizeof buf, 0);
		if (r != 2 || buf[0] != 'b' || buf[1] != '0' + i) FAIL("a received %zd bytes, want b%d", r, i);
	}
	pthread_join(th, NULL);
	if (sendto(b, "x", 1, 0, (struct sockaddr *)&aa, sizeof aa) != -1 || errno != EPIPE) FAIL("sendto b after SHUT_WR: want EPIPE");
	if (shutdown(a, SHUT_RDWR) != 0) FAIL("shutdown(a, SHUT_RDWR)");
	close(a);
	close(b);
	printf("ok shutwr\n");
}

// closewait: a datagram sent just before close reaches its peer. Under
// RD the close waits until it is acknowledged: d sends to b, whose
// handshake it has to wait for, and closes at once; a thread receives
// on b meanwhile.
static void *closewait_b(void *arg) {
	struct shutpeer *p = arg;
	char buf[64];
	ssize_t r = recv(p->b, buf, sizeof buf, 0);
	if (r != 2 || memcmp(buf, "d0", 2) != 0) FAIL("b received %zd bytes, want d0", r);
	return NULL;
}

static void mode_closewait(void) {
	struct sockaddr_in ba, da;
	int b = udp(&ba), d = udp(&da);
	struct timeval tv = {20, 0};
	if (setsockopt(b, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0) FAIL("SO_RCVTIMEO");
	struct shutpeer p = {b};
	pthread_t th;
	if (pthread_create(&th, NULL, closewait_b, &p) != 0) FAIL("pthread_create");
	if (sendto(d, "d0", 2, 0, (struct sockaddr *)&ba, sizeof ba) != 2) FAIL("sendto d");
	if (close(d) != 0) FAIL("close d");
	pthread_join(th, NULL);
	close(b);
	printf("ok closewait\n");
}

// sendexit PORT: one datagram to 127.0.0.1:PORT, and exit at once, with
// the socket open: under RD the exit waits until it is acknowledged.
static void mode_sendexit(int port) {
	int fd = socket(AF_INET, SOCK_DGRAM, 0);
	if (fd < 0) FAIL("socket");
	struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	if (sendto(fd, "exit\n", 5, 0, (struct sockaddr *)&to, sizeof to) != 5) FAIL("sendto");
	printf("ok sendexit\n");
	exit(0);
}

int main(int argc, char **argv) {
	setvbuf(stdout, NULL, _IONBF, 0);
	if (argc < 2) FAIL("usage: survive fork|closeall|eintr|errno|poll|sigstack [N]|threads N|shutwr|closewait|sendexit PORT");
	if (!strcmp(argv[1], "fork")) mode_fork();
	else if (!strcmp(argv[1], "closeall")) mode_closeall();
	else if (!strcmp(argv[1], "eintr")) mode_eintr();
	else if (!strcmp(argv[1], "errno")) mode_errno();
	else if (!strcmp(argv[1], "poll")) mode_poll();
	else if (!strcmp(argv[1], "sigstack")) mode_sigstack(argc > 2 ? atoi(argv[2]) : 200);
	else if (!strcmp(argv[1], "threads")) mode_threads(argc > 2 ? atoi(argv[2]) : 48);
	else if (!strcmp(argv[1], "shutwr")) mode_shutwr();
	else if (!strcmp(argv[1], "closewait")) mode_closewait();
	else if (!strcmp(argv[1], "sendexit") && argc > 2) mode_sendexit(atoi(argv[2]));
	else FAIL("unknown mode %s", argv[1]);
	return 0;
}
