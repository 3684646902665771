// libudiwarp_preload.so: runs an unmodified program's UDP sockets over
// udiwarp (RDMAP/DDP over UDP, one UD queue pair per socket), and with
// UDIWARP_PRELOAD_TCP=rc its TCP sockets over RC (RDMAP/DDP over MPA over
// that TCP connection), loaded with LD_PRELOAD. This thin C half owns every interposed symbol, the table of
// owned descriptors, blocking waits, errno and the fork policy; the data
// path is the Go engine (libudiwarp_engine.so, -buildmode=c-shared), which
// it dlopen()s on the first AF_INET/AF_INET6 SOCK_DGRAM socket. The
// design is described in ../doc.go.
//
// Build: gcc -O2 -shared -fPIC -o libudiwarp_preload.so c/preload.c -ldl -lpthread

#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAXFD 65536
#define MAXGROUPS 20 // IP_MAX_MEMBERSHIPS, the kernel's default per socket
#define EXPORT __attribute__((visibility("default")))

// ---- the real functions -------------------------------------------------

static int (*r_socket)(int, int, int);
static int (*r_bind)(int, const struct sockaddr *, socklen_t);
static int (*r_connect)(int, const struct sockaddr *, socklen_t);
static int (*r_accept)(int, struct sockaddr *, socklen_t *);
static int (*r_accept4)(int, struct sockaddr *, socklen_t *, int);
static ssize_t (*r_sendfile)(int, int, off_t *, size_t);
static ssize_t (*r_sendfile64)(int, int, off64_t *, size_t);
static ssize_t (*r_splice)(int, loff_t *, int, loff_t *, size_t, unsigned int);
static ssize_t (*r_tee)(int, int, size_t, unsigned int);
static ssize_t (*r_vmsplice)(int, const struct iovec *, size_t, unsigned int);
static int (*r_close)(int);
static int (*r_close_range)(unsigned, unsigned, int);
static int (*r_dup)(int);
static int (*r_dup2)(int, int);
static int (*r_dup3)(int, int, int);
static int (*r_fcntl)(int, int, ...);
static int (*r_fcntl64)(int, int, ...);
static int (*r_ioctl)(int, unsigned long, ...);
static int (*r_setsockopt)(int, int, int, const void *, socklen_t);
static int (*r_getsockopt)(int, int, int, void *, socklen_t *);
static int (*r_getsockname)(int, struct sockaddr *, socklen_t *);
static int (*r_getpeername)(int, struct sockaddr *, socklen_t *);
static int (*r_shutdown)(int, int);
static ssize_t (*r_sendto)(int, const void *, size_t, int, const struct sockaddr *, socklen_t);
static ssize_t (*r_send)(int, const void *, size_t, int);
static ssize_t (*r_sendmsg)(int, const struct msghdr *, int);
static int (*r_sendmmsg)(int, struct mmsghdr *, unsigned, int);
static ssize_t (*r_write)(int, const void *, size_t);
static ssize_t (*r_writev)(int, const struct iovec *, int);
static ssize_t (*r_recvfrom)(int, void *, size_t, int, struct sockaddr *, socklen_t *);
static ssize_t (*r_recv)(int, void *, size_t, int);
static ssize_t (*r_recvmsg)(int, struct msghdr *, int);
static int (*r_recvmmsg)(int, struct mmsghdr *, unsigned, int, struct timespec *);
static ssize_t (*r_read)(int, void *, size_t);
static ssize_t (*r_readv)(int, const struct iovec *, int);
static int (*r_poll)(struct pollfd *, nfds_t, int);
static int (*r_ppoll)(struct pollfd *, nfds_t, const struct timespec *, const sigset_t *);
static int (*r_select)(int, fd_set *, fd_set *, fd_set *, struct timeval *);
static int (*r_pselect)(int, fd_set *, fd_set *, fd_set *, const struct timespec *, const sigset_t *);
static int (*r_epoll_ctl)(int, int, int, struct epoll_event *);
static int (*r_epoll_wait)(int, struct epoll_event *, int, int);
static int (*r_epoll_pwait)(int, struct epoll_event *, int, int, const sigset_t *);
static long (*r_syscall)(long, ...);
static int (*r_sigaction)(int, const struct sigaction *, struct sigaction *);
static sighandler_t (*r_signal)(int, sighandler_t);
static sighandler_t (*r_bsd_signal)(int, sighandler_t);
static sighandler_t (*r_sysv_signal)(int, sighandler_t);
static sighandler_t (*r_sigset)(int, sighandler_t);
static sighandler_t (*r_ssignal)(int, sighandler_t);

static void resolve(void) {
#define R(name) if (!r_##name) r_##name = dlsym(RTLD_NEXT, #name)
	R(socket); R(bind); R(connect); R(accept); R(accept4); R(sendfile); R(sendfile64); R(splice); R(tee); R(vmsplice); R(close); R(close_range); R(dup); R(dup2); R(dup3);
	R(fcntl); R(fcntl64); R(ioctl); R(setsockopt); R(getsockopt); R(getsockname);
	R(getpeername); R(shutdown); R(sendto); R(send); R(sendmsg); R(sendmmsg); R(write);
	R(writev); R(recvfrom); R(recv); R(recvmsg); R(recvmmsg); R(read); R(readv); R(syscall);
	R(sigaction); R(signal); R(bsd_signal); R(sysv_signal); R(sigset); R(ssignal);
	R(poll); R(ppoll); R(select); R(pselect); R(epoll_ctl); R(epoll_wait); R(epoll_pwait);
#undef R
	if (!r_fcntl64) r_fcntl64 = r_fcntl;
}
#define REAL(name) (r_##name ? r_##name : (resolve(), r_##name))

// ---- the engine ------------------------------------------------------------

enum { E_UNLOADED = 0, E_READY = 1, E_FAILED = -1, E_CHILD = -2 };
static atomic_int estate;
// A blocking receive first polls the socket in the engine this long
// (UDIWARP_PRELOAD_SPIN_NS): a reply that comes within it costs no
// wake-up; then it waits in ppoll.
static long long spin_ns = 50000;
static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;

static int (*e_init)(void);
static long long (*e_adopt)(int, int *);
static int (*e_ready)(long long);
static long long (*e_send)(long long, void *, int, void *, int);
static long long (*e_recv)(long long, void *, int, void *, int *, int, int *, long long);
static long long (*e_next_len)(long long);
static int (*e_close)(long long);
static int (*e_setfd)(long long, int);
static void (*e_exit)(void);
static void (*e_counter)(int *);
// holding counts the owned sockets whose pending flag is set (the engine
// keeps it, as it sets and clears the flags): a wait that finds it 0
// does not look at every descriptor for data the engine holds.
static int holding;
static long long (*e_group)(long long, int, int, const void *, int);
static long long (*e_stream_open)(int, int, int *, int *);
static long long (*e_stream_send)(long long, void *, int, long long);
static int (*e_shutdown)(long long, int);
static void (*e_stream_plain)(void);
static void (*e_stream_refused)(void);
// UDIWARP_PRELOAD_TCP=rc: TCP sockets too, over RC.
static int tcp_rc;
// first_wait_ns: how long, from its accept, a write to an accepted stream
// whose peer has not spoken waits for its first bytes (a preloaded
// peer's MPA Request follows its connect at once; a plain one may wait
// for us to speak): UDIWARP_PRELOAD_TCP_WAIT, at most 1 s.
static long long first_wait_ns = 1000000000LL;
// hs_wait_ns: how long, from its accept, a peer that began an MPA
// Request has to finish it: UDIWARP_PRELOAD_TCP_WAIT (default 5 s).
static long long hs_wait_ns = 5000000000LL;
// undecided_n counts the accepted streams still undecided (a wait looks
// for them only while there are some); watch_n those an epoll wait must
// look after itself (see "streams").
static atomic_int undecided_n, watch_n;


// ---- descriptors -----------------------------------------------------------

// usock is one owned socket. The program's descriptor is the kernel UDP
// socket itself, and stays so: the engine runs a UD QP over it (a manual
// socket of its one device) and reads it only when the program receives,
// so the kernel's queue (bounded by the program's SO_RCVBUF) is the only
// receive buffering, poll, select and epoll see the kernel's readiness
// unaided, and a socket costs the program's one descriptor. engfd is the
// descriptor the engine uses: one of the program's (they may dup it). A
// usock is never freed, so a thread holding one while another closes it
// reads valid memory.
struct usock {
	atomic_int fds;      // program descriptors referring to it
	atomic_int engfd;    // the one the engine uses, -1 before adoption
	atomic_llong h;      // engine handle, 0 until adopted and after the last close
	int family;
	atomic_int nonblock; // the program's O_NONBLOCK
	atomic_int kmode;    // kernel path: a forked child, or the engine refused it
	atomic_int closing;  // the last program descriptor closed
	atomic_int wrshut;   // a datagram socket: the program shut its sending down (dshutdown)
	long long rcvtimeo, sndtimeo; // ns, 0 none
	atomic_int connected;
	// stream: a TCP socket (UDIWARP_PRELOAD_TCP=rc). Adopted (h > 0) once
	// connected or accepted and MPA's exchange done; before, and for a
	// listener, it is the kernel's. dead: its exchange failed, and the
	// stream cannot be the kernel's either (the peer spoke, or was
	// spoken to, in MPA); forked: a child's copy of an adopted one,
	// which only the parent's engine can carry.
	int stream;
	atomic_int dead, forked;
	// undecided: an accepted stream whose peer has not spoken yet, or
	// has sent part of an MPA Request. Its first bytes say what it is (a
	// whole MPA Request: RC; anything else: the kernel's), and they are
	// looked at when the program reads, writes, polls or shuts it down,
	// never waiting unless the program's call would (see "streams").
	// hs_dl: the end of the wait for a Request the peer has begun, and
	// first_dl of a write's wait for the peer's first bytes (both from
	// the accept, fixed). lowat: the SO_RCVLOWAT set while part of a
	// Request is there (0: none set), lowat0 the socket's own, restored
	// when it is decided. watch: counted in watch_n. ep_mod: the epoll
	// set (+ 1) whose registration of ep_fd a wait changed (EPOLLOUT held
	// back, EPOLLIN asked), restored when it is decided.
	atomic_int undecided;
	long long hs_dl, first_dl;
	atomic_int lowat, watch, ep_mod;
	int lowat0, ep_fd;
	// pending is set by the engine (atomically, in this memory): 1 while
	// datagrams for the program wait in it, which the kernel's readiness
	// of the descriptor does not show (see "readiness").
	int pending;
	struct sockaddr_storage peer;
	socklen_t peerlen;
	// Groups joined before the engine adopted the socket (socat joins
	// before it binds): the kernel's membership is made at once, and the
	// engine's QP joins them when it adopts the socket. Under mu.
	struct { unsigned char opt[sizeof(struct ip_mreqn) > sizeof(struct ipv6_mreq) ? sizeof(struct ip_mreqn) : sizeof(struct ipv6_mreq)]; int len, v6; } groups[MAXGROUPS];
	int ngroups;
	pthread_mutex_t mu;
};

static _Atomic(struct usock *) owned[MAXFD];
// protect marks descriptors that are not the program's: the Go engine's
// runtime's (2).
// The program closing one is a no-op that reports success.
static _Atomic unsigned char protect[MAXFD];
static atomic_int maxfd; // highest descriptor ever owned or protected
// epoll registrations of owned descriptors (see "readiness").
static atomic_int reg_ep[MAXFD];      // epoll descriptor + 1, or 0
static uint64_t reg_data[MAXFD];
static uint32_t reg_ev[MAXFD];
static _Atomic unsigned char ep_owned[MAXFD]; // the epoll set has owned descriptors
// An adopted stream's descriptors carry FD_CLOEXEC in the kernel, so that
// an exec'd program never gets a stream in the middle of MPA framing;
// cloexec_view is FD_CLOEXEC as the program set it (F_GETFD shows it).
static _Atomic unsigned char cloexec_view[MAXFD];

static void seen(int fd) {
	int m = atomic_load(&maxfd);
	while (fd > m && !atomic_compare_exchange_weak(&maxfd, &m, fd)) {}
}
static void mark(int fd, unsigned char v) {
	if (fd >= 0 && fd < MAXFD) {
		atomic_store(&protect[fd], v);
		if (v) seen(fd);
	}
}

static inline struct usock *lookup(int fd) {
	if ((unsigned)fd >= MAXFD) return NULL;
	return atomic_load_explicit(&owned[fd], memory_order_acquire);
}

static long long now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void warn(const char *what) {
	char b[256];
	int n = snprintf(b, sizeof b, "udiwarp preload[%d]: %s\n", (int)getpid(), what);
	if (n > 0) REAL(write)(2, b, (size_t)n < sizeof b ? (size_t)n : sizeof b - 1);
}

// ---- loading the engine ------------------------------------------------

static void fdset(unsigned char *set) {
	DIR *d = opendir("/proc/self/fd");
	if (!d) return;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		int fd = atoi(e->d_name);
		if (e->d_name[0] >= '0' && e->d_name[0] <= '9' && fd < MAXFD) set[fd] = 1;
	}
	closedir(d);
}

static void load(void) {
	const char *path = getenv("UDIWARP_ENGINE");
	char buf[PATH_MAX];
	if (!path || !*path) {
		Dl_info di;
		if (!dladdr((void *)load, &di) || !di.dli_fname) {
			warn("cannot find the engine: set UDIWARP_ENGINE; using the kernel");
			atomic_store(&estate, E_FAILED);
			return;
		}
		snprintf(buf, sizeof buf, "%s", di.dli_fname);
		char *slash = strrchr(buf, '/');
		size_t off = slash ? (size_t)(slash - buf + 1) : 0;
		snprintf(buf + off, sizeof buf - off, "libudiwarp_engine.so");
		path = buf;
	}
	const char *s = getenv("UDIWARP_PRELOAD_SPIN_NS");
	if (s && *s) spin_ns = atoll(s);
	unsigned char *before = calloc(MAXFD, 1), *after = calloc(MAXFD, 1);
	if (!before || !after) {
		free(before);
		free(after);
		atomic_store(&estate, E_FAILED);
		return;
	}
	fdset(before);
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		char m[512];
		snprintf(m, sizeof m, "cannot load the engine (%s); using the kernel", dlerror());
		warn(m);
		free(before);
		free(after);
		atomic_store(&estate, E_FAILED);
		return;
	}
	e_init = dlsym(h, "udw_init");
	e_adopt = dlsym(h, "udw_adopt");
	e_send = dlsym(h, "udw_send");
	e_recv = dlsym(h, "udw_recv");
	e_next_len = dlsym(h, "udw_next_len");
	e_close = dlsym(h, "udw_close");
	e_exit = dlsym(h, "udw_exit");
	e_group = dlsym(h, "udw_group");
	e_setfd = dlsym(h, "udw_setfd");
	e_ready = dlsym(h, "udw_ready");
	e_stream_open = dlsym(h, "udw_stream_open");
	e_stream_send = dlsym(h, "udw_stream_send");
	e_shutdown = dlsym(h, "udw_shutdown");
	e_stream_plain = dlsym(h, "udw_stream_plain");
	e_stream_refused = dlsym(h, "udw_stream_refused");
	e_counter = dlsym(h, "udw_pending_counter");
	if (e_counter) e_counter(&holding);
	if (!e_stream_open || !e_stream_send || !e_shutdown) tcp_rc = 0;
	if (!e_init || !e_adopt || !e_send || !e_recv || !e_next_len || !e_close || !e_exit || !e_group || !e_setfd || !e_ready || e_init() != 0) {
		warn("the engine is incomplete; using the kernel");
		free(before);
		free(after);
		atomic_store(&estate, E_FAILED);
		return;
	}
	// Protect what the Go runtime opened (netpoller epoll and eventfd,
	// cgroup files): a daemon closing every descriptor must not take them.
	fdset(after);
	for (int fd = 0; fd < MAXFD; fd++) {
		if (!after[fd] || before[fd]) continue;
		char p[64], l[128];
		snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
		ssize_t n = readlink(p, l, sizeof l - 1);
		if (n <= 0) continue;
		l[n] = 0;
		if (!strncmp(l, "anon_inode:", 11) || !strncmp(l, "/sys/", 5) || !strncmp(l, "pipe:", 5)) mark(fd, 2);
	}
	free(before);
	free(after);
	atomic_store(&estate, E_READY);
}

static int engine_ready(void) {
	int s = atomic_load(&estate);
	if (s == E_READY) return 1;
	if (s != E_UNLOADED) return 0;
	pthread_mutex_lock(&load_mu);
	if (atomic_load(&estate) == E_UNLOADED) load();
	pthread_mutex_unlock(&load_mu);
	return atomic_load(&estate) == E_READY;
}

// ---- fork --------------------------------------------------------------

// A forked child never calls into Go (the runtime's other threads do not
// exist there). Every owned descriptor is the kernel socket already: the
// child goes on with plain UDP on it.
// A stream the parent's engine carries cannot be the kernel's in the
// child (its bytes are MPA's framing): the child's reads and writes of
// it fail with EOPNOTSUPP; closing it is the child's to do.
static void atfork_child(void) {
	atomic_store(&estate, E_CHILD);
	int m = atomic_load(&maxfd);
	for (int fd = 0; fd <= m && fd < MAXFD; fd++) {
		struct usock *u = atomic_load(&owned[fd]);
		if (u && u->stream && atomic_load(&u->h) > 0) atomic_store(&u->forked, 1);
		if (u) atomic_store(&u->kmode, 1);
		if (atomic_load(&protect[fd]) == 2) atomic_store(&protect[fd], 0);
	}
}

__attribute__((constructor)) static void init(void) {
	resolve();
	const char *t = getenv("UDIWARP_PRELOAD_TCP");
	tcp_rc = t && !strcmp(t, "rc");
	const char *w = getenv("UDIWARP_PRELOAD_TCP_WAIT");
	if (w && atoll(w) > 0 && atoll(w) < 1000) first_wait_ns = atoll(w) * 1000000LL;
	if (w && atoll(w) > 0) hs_wait_ns = atoll(w) * 1000000LL;
	pthread_atfork(NULL, NULL, atfork_child);
}

__attribute__((destructor)) static void fini(void) {
	if (atomic_load(&estate) == E_READY && e_exit) e_exit();
}

// ---- signal handlers -----------------------------------------------------

// Every handler the program installs gets SA_ONSTACK. Without it a
// handler runs on whatever stack the thread is on when the signal
// arrives, and a thread inside the engine (a blocking receive spins in
// Go) is on a goroutine stack of a few KiB: the kernel's signal frame
// (2-3 KiB with AVX-512 state) and the handler's frames run past its end
// into the next goroutine's stack, and that goroutine crashes later
// (sockperf's SIGALRM at the end of a run: "traceback did not unwind
// completely"). The Go runtime requires SA_ONSTACK of non-Go handlers
// (os/signal, "Go programs that use cgo"): it adds the flag to those it
// finds when the engine loads and gives every thread that runs Go an
// alternate signal stack; a handler installed later gets it here. On a
// thread without an alternate stack the flag changes nothing.
static int handles(sighandler_t h) { return h != SIG_DFL && h != SIG_IGN && h != SIG_ERR; }

EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
	if (act && handles(act->sa_handler) && !(act->sa_flags & SA_ONSTACK)) {
		struct sigaction a = *act;
		a.sa_flags |= SA_ONSTACK;
		return REAL(sigaction)(sig, &a, old);
	}
	return REAL(sigaction)(sig, act, old);
}

// onstack adds SA_ONSTACK to sig's handler, after libc's signal() and
// its variants installed it (their flags are libc's to choose; a signal
// in the moment between runs its handler without the flag).
static sighandler_t onstack(int sig, sighandler_t prev) {
	struct sigaction sa;
	if (prev != SIG_ERR && REAL(sigaction)(sig, NULL, &sa) == 0 && handles(sa.sa_handler) && !(sa.sa_flags & SA_ONSTACK)) {
		sa.sa_flags |= SA_ONSTACK;
		REAL(sigaction)(sig, &sa, NULL);
	}
	return prev;
}

// variant calls libc's signal(), bsd_signal(), ssignal(), sysv_signal() or
// sigset().
static sighandler_t variant(sighandler_t (*f)(int, sighandler_t), int sig, sighandler_t h) {
	if (!f) {
		errno = ENOSYS;
		return SIG_ERR;
	}
	return onstack(sig, f(sig, h));
}

EXPORT sighandler_t signal(int sig, sighandler_t h) { return variant(REAL(signal), sig, h); }
EXPORT sighandler_t bsd_signal(int sig, sighandler_t h) { return variant(REAL(bsd_signal), sig, h); }
EXPORT sighandler_t ssignal(int sig, sighandler_t h) { return variant(REAL(ssignal), sig, h); }
EXPORT sighandler_t sysv_signal(int sig, sighandler_t h) { return variant(REAL(sysv_signal), sig, h); }
EXPORT sighandler_t sigset(int sig, sighandler_t h) { return variant(REAL(sigset), sig, h); }

// ---- socket lifetime ---------------------------------------------------

static int sconnect(struct usock *u, int fd, const struct sockaddr *addr, socklen_t len);
static void rewatch(struct usock *u, int fd);
static int settle(struct usock *u, int fd, int how, long long *wake);
static ssize_t srecv(struct usock *u, int fd, struct msghdr *m, int flags);
static ssize_t ssend(struct usock *u, int fd, const struct msghdr *m, int flags);

// detach ends the engine's use of the socket: after it returns no
// engine call uses the descriptor, and calls with the old handle fail.
static void detach(struct usock *u) {
	long long h = atomic_exchange(&u->h, 0);
	if (h > 0 && atomic_load(&estate) == E_READY) e_close(h);
}

// another finds a descriptor other than fd that refers to u, or -1.
static int another(struct usock *u, int fd) {
	int m = atomic_load(&maxfd);
	for (int i = 0; i <= m && i < MAXFD; i++)
		if (i != fd && atomic_load(&owned[i]) == u) return i;
	return -1;
}

// forget takes fd from u, before the descriptor closes (or dup2 reuses
// it): the engine moves to another of the program's descriptors for the
// socket if it used this one, or detaches when this was the last.
static void forget(struct usock *u, int fd) {
	if (atomic_fetch_sub(&u->fds, 1) == 1) {
		atomic_store(&u->closing, 1);
		if (u->stream) { // closed undecided: no wait looks for it now
			pthread_mutex_lock(&u->mu);
			atomic_store(&u->lowat, 0);
			atomic_store(&u->ep_mod, 0);
			if (atomic_exchange(&u->undecided, 0)) atomic_fetch_sub(&undecided_n, 1);
			rewatch(u, -1);
			pthread_mutex_unlock(&u->mu);
		}
		detach(u);
		return;
	}
	pthread_mutex_lock(&u->mu);
	if (atomic_load(&u->engfd) == fd) {
		int o = another(u, fd);
		long long h = atomic_load(&u->h);
		if (o >= 0 && h > 0 && atomic_load(&estate) == E_READY && e_setfd(h, o) == 0) {
			atomic_store(&u->engfd, o);
		} else if (o >= 0) {
			detach(u); // cannot follow it: the socket goes on over the kernel
			atomic_store(&u->kmode, 1);
		}
	}
	pthread_mutex_unlock(&u->mu);
}

static struct usock *enter(int fd) {
	struct usock *u = lookup(fd);
	if (!u) return NULL;
	return u;
}

static void leave(struct usock *u) { (void)u; }

static int wants(int domain, int type, int proto) {
	if (domain != AF_INET && domain != AF_INET6) return 0;
	if ((type & 0xf) == SOCK_STREAM) return tcp_rc && (proto == 0 || proto == IPPROTO_TCP);
	return (type & 0xf) == SOCK_DGRAM && (proto == 0 || proto == IPPROTO_UDP);
}

EXPORT int socket(int domain, int type, int proto) {
	int fd = REAL(socket)(domain, type, proto);
	if (fd < 0 || fd >= MAXFD || !wants(domain, type, proto) || !engine_ready()) return fd;
	struct usock *u = calloc(1, sizeof *u);
	if (!u) return fd;
	u->family = domain;
	u->stream = (type & 0xf) == SOCK_STREAM;
	atomic_store(&cloexec_view[fd], (type & SOCK_CLOEXEC) != 0);
	atomic_store(&u->engfd, -1);
	atomic_store(&u->nonblock, (type & SOCK_NONBLOCK) != 0);
	atomic_store(&u->fds, 1);
	pthread_mutex_init(&u->mu, NULL);
	seen(fd);
	atomic_store(&owned[fd], u);
	return fd;
}

// fallback leaves the socket to the kernel: the engine would not take
// it, and the program goes on over plain UDP on its own descriptor.
static void fallback(struct usock *u) { atomic_store(&u->kmode, 1); }

// local_port is the socket's port (0: not bound), or -1 where
// getsockname fails.
static int local_port(int fd) {
	struct sockaddr_storage ss;
	socklen_t sl = sizeof ss;
	if (REAL(getsockname)(fd, (struct sockaddr *)&ss, &sl) != 0) return -1;
	if (ss.ss_family == AF_INET) return ntohs(((struct sockaddr_in *)&ss)->sin_port);
	if (ss.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
	return -1;
}

// adopt hands the (bound) socket to the engine, binding it to an
// ephemeral port first if the program did not.
static int adopt(struct usock *u, int fd) {
	if (atomic_load(&u->h) > 0) return 0;
	if (atomic_load(&u->kmode) || atomic_load(&u->closing)) return 0;
	pthread_mutex_lock(&u->mu);
	int ret = 0;
	if (atomic_load(&u->h) == 0 && !atomic_load(&u->kmode) && !atomic_load(&u->closing)) {
		if (local_port(fd) == 0) {
			struct sockaddr_storage ss;
			memset(&ss, 0, sizeof ss);
			ss.ss_family = (sa_family_t)u->family;
			if (REAL(bind)(fd, (struct sockaddr *)&ss,
			               u->family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6)) != 0)
				ret = -1;
		}
		if (ret == 0) {
			long long h = atomic_load(&estate) == E_READY ? e_adopt(fd, &u->pending) : -EIO;
			if (h > 0) {
				atomic_store(&u->engfd, fd);
				atomic_store(&u->h, h);
				for (int i = 0; i < u->ngroups; i++) // the kernel has them; now the QP
					e_group(h, 1, u->groups[i].v6, u->groups[i].opt, u->groups[i].len);
				u->ngroups = 0;
			} else {
				char m[128];
				snprintf(m, sizeof m, "the engine refused socket %d (errno %lld); it stays on the kernel", fd, -h);
				warn(m);
				fallback(u);
			}
		}
	}
	pthread_mutex_unlock(&u->mu);
	return ret;
}

EXPORT int close(int fd) {
	if ((unsigned)fd < MAXFD) {
		if (atomic_load_explicit(&protect[fd], memory_order_relaxed)) return 0;
		struct usock *u = atomic_load(&owned[fd]);
		if (u) {
			atomic_store(&reg_ep[fd], 0);
			forget(u, fd); // the engine leaves the descriptor first
			atomic_store(&owned[fd], NULL);
			return REAL(close)(fd);
		}
	}
	return REAL(close)(fd);
}

// closerange closes [first, last] but the protected descriptors.
static int closerange(unsigned first, unsigned last, int flags) {
	if (flags & CLOSE_RANGE_CLOEXEC) return REAL(close_range) ? REAL(close_range)(first, last, flags) : (errno = ENOSYS, -1);
	if (first > last) {
		errno = EINVAL;
		return -1;
	}
	unsigned m = (unsigned)atomic_load(&maxfd);
	unsigned start = first;
	for (unsigned fd = first; fd <= last && fd <= m && fd < MAXFD; fd++) {
		if (atomic_load(&protect[fd])) {
			if (fd > start) {
				if (!REAL(close_range) || REAL(close_range)(start, fd - 1, flags) != 0)
					for (unsigned i = start; i < fd; i++) REAL(close)((int)i);
			}
			start = fd + 1;
		} else if (lookup((int)fd)) {
			close((int)fd);
		}
	}
	if (start <= last) {
		if (!REAL(close_range) || REAL(close_range)(start, last, flags) != 0) {
			if (last - start > MAXFD) {
				errno = ENOSYS;
				return -1;
			}
			for (unsigned i = start; i <= last; i++) REAL(close)((int)i);
		}
	}
	return 0;
}

EXPORT int close_range(unsigned first, unsigned last, int flags) { return closerange(first, last, flags); }

EXPORT void closefrom(int lowfd) {
	if (lowfd < 0) lowfd = 0;
	closerange((unsigned)lowfd, ~0U, 0);
}

// alias registers newfd, a duplicate of an owned descriptor.
static void alias(struct usock *u, int newfd) {
	if (newfd < 0 || newfd >= MAXFD) return;
	int fl = REAL(fcntl)(newfd, F_GETFD);
	atomic_store(&cloexec_view[newfd], fl >= 0 && (fl & FD_CLOEXEC));
	if (u->stream && atomic_load(&u->h) > 0 && fl >= 0) REAL(fcntl)(newfd, F_SETFD, fl | FD_CLOEXEC);
	atomic_fetch_add(&u->fds, 1);
	seen(newfd);
	atomic_store(&owned[newfd], u);
}

EXPORT int dup(int fd) {
	int r = REAL(dup)(fd);
	struct usock *u = lookup(fd);
	if (r >= 0 && u) alias(u, r);
	return r;
}

static int dupto(int oldfd, int newfd, int flags, int three) {
	if ((unsigned)newfd < MAXFD && atomic_load(&protect[newfd]) && atomic_load(&estate) != E_CHILD) {
		errno = EBUSY; // the preload's or the engine's descriptor
		return -1;
	}
	if (oldfd == newfd) return three ? REAL(dup3)(oldfd, newfd, flags) : REAL(dup2)(oldfd, newfd);
	// newfd's socket, if owned, loses that descriptor: the engine must
	// leave it before the kernel reuses the number.
	struct usock *old = lookup(newfd);
	if (old && REAL(fcntl)(oldfd, F_GETFD) >= 0) {
		forget(old, newfd);
		atomic_store(&owned[newfd], NULL);
	}
	int r = three ? REAL(dup3)(oldfd, newfd, flags) : REAL(dup2)(oldfd, newfd);
	if (r < 0) return r;
	struct usock *u = lookup(oldfd);
	if (u) alias(u, r);
	return r;
}

EXPORT int dup2(int oldfd, int newfd) { return dupto(oldfd, newfd, 0, 0); }
EXPORT int dup3(int oldfd, int newfd, int flags) { return dupto(oldfd, newfd, flags, 1); }

static int dofcntl(int (*real)(int, int, ...), int fd, int cmd, void *arg) {
	struct usock *u = lookup(fd);
	if (!u) return real(fd, cmd, arg);
	switch (cmd) {
	case F_GETFD: {
		int r = real(fd, F_GETFD);
		if (r >= 0 && u->stream && atomic_load(&u->h) > 0)
			r = (r & ~FD_CLOEXEC) | (atomic_load(&cloexec_view[fd]) ? FD_CLOEXEC : 0);
		return r;
	}
	case F_SETFD: {
		int fl = (int)(intptr_t)arg;
		int r = real(fd, F_SETFD, (u->stream && atomic_load(&u->h) > 0) ? fl | FD_CLOEXEC : fl);
		if (r == 0) atomic_store(&cloexec_view[fd], (fl & FD_CLOEXEC) != 0);
		return r;
	}
	case F_SETFL: { // the kernel's flag is the program's; the engine's calls never block
		int fl = (int)(intptr_t)arg;
		int r = real(fd, F_SETFL, fl);
		if (r == 0) atomic_store(&u->nonblock, (fl & O_NONBLOCK) != 0);
		return r;
	}
	case F_DUPFD:
	case F_DUPFD_CLOEXEC: {
		int r = real(fd, cmd, arg);
		if (r >= 0) alias(u, r);
		return r;
	}
	}
	return real(fd, cmd, arg);
}

EXPORT int fcntl(int fd, int cmd, ...) {
	va_list ap;
	va_start(ap, cmd);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	return dofcntl(REAL(fcntl), fd, cmd, arg);
}

EXPORT int fcntl64(int fd, int cmd, ...) {
	va_list ap;
	va_start(ap, cmd);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	return dofcntl(REAL(fcntl64), fd, cmd, arg);
}

EXPORT int ioctl(int fd, unsigned long req, ...) {
	va_list ap;
	va_start(ap, req);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	struct usock *u = enter(fd);
	if (!u) return REAL(ioctl)(fd, req, arg);
	int r;
	if (req == FIONREAD && u->stream && atomic_load(&u->undecided) && settle(u, fd, 0, NULL) < 0) {
		*(int *)arg = 0; // part of an MPA Request is nothing to read
		r = 0;
	} else if (req == FIONREAD && !atomic_load(&u->kmode) && atomic_load(&u->h) > 0) {
		long long h = atomic_load(&u->h);
		long long n = h > 0 ? e_next_len(h) : 0;
		if (n < 0) {
			errno = (int)-n;
			r = -1;
		} else {
			*(int *)arg = (int)n;
			r = 0;
		}
	} else {
		r = REAL(ioctl)(fd, req, arg);
		if (r == 0 && req == FIONBIO) atomic_store(&u->nonblock, arg && *(int *)arg != 0);
	}
	leave(u);
	return r;
}

EXPORT int bind(int fd, const struct sockaddr *addr, socklen_t len) {
	struct usock *u = enter(fd);
	if (!u) return REAL(bind)(fd, addr, len);
	int r;
	if (atomic_load(&u->h) > 0) {
		errno = EINVAL; // bound already
		r = -1;
	} else {
		r = REAL(bind)(fd, addr, len);
		if (r == 0 && !u->stream && !atomic_load(&u->kmode)) adopt(u, fd);
	}
	leave(u);
	return r;
}

EXPORT int connect(int fd, const struct sockaddr *addr, socklen_t len) {
	struct usock *u = enter(fd);
	if (!u) return REAL(connect)(fd, addr, len);
	if (u->stream) return sconnect(u, fd, addr, len);
	int r = REAL(connect)(fd, addr, len);
	if (r == 0) {
		pthread_mutex_lock(&u->mu);
		if (addr->sa_family == AF_UNSPEC) {
			atomic_store(&u->connected, 0);
		} else {
			memset(&u->peer, 0, sizeof u->peer);
			memcpy(&u->peer, addr, len < sizeof u->peer ? len : sizeof u->peer);
			u->peerlen = len;
			atomic_store(&u->connected, 1);
		}
		pthread_mutex_unlock(&u->mu);
		if (addr->sa_family != AF_UNSPEC && !atomic_load(&u->kmode)) adopt(u, fd);
	}
	leave(u);
	return r;
}

static long long tv_ns(const void *v, socklen_t l) {
	if (!v || l < sizeof(struct timeval)) return 0;
	const struct timeval *tv = v;
	return (long long)tv->tv_sec * 1000000000LL + (long long)tv->tv_usec * 1000LL;
}

// group_opt reports whether (lvl, name) joins (*join = 1) or leaves a
// multicast group.
static int group_opt(int lvl, int name, int *join) {
	if (lvl == IPPROTO_IP && (name == IP_ADD_MEMBERSHIP || name == IP_DROP_MEMBERSHIP)) {
		*join = name == IP_ADD_MEMBERSHIP;
		return 1;
	}
	if (lvl == IPPROTO_IPV6 && (name == IPV6_JOIN_GROUP || name == IPV6_LEAVE_GROUP)) {
		*join = name == IPV6_JOIN_GROUP;
		return 1;
	}
	return 0;
}

EXPORT int setsockopt(int fd, int lvl, int name, const void *v, socklen_t l) {
	struct usock *u = enter(fd);
	if (!u) return REAL(setsockopt)(fd, lvl, name, v, l);
	int join;
	if (v && !u->stream && group_opt(lvl, name, &join)) {
		// A group membership is the engine's to make: its QP must be a
		// member for the group's datagrams to reach it, and it makes the
		// kernel's membership on the same socket itself. Before the engine
		// has the socket, the kernel's membership is made now and the
		// QP's when the engine adopts it.
		// Under mu, as adopt replays the recorded groups under it: a
		// socket adopted meanwhile takes the engine's path, never a record
		// that no one replays.
		if (join && atomic_load(&u->h) == 0 && local_port(fd) > 0) adopt(u, fd);
		pthread_mutex_lock(&u->mu);
		long long h = atomic_load(&u->h);
		if (h > 0 && !atomic_load(&u->kmode)) {
			pthread_mutex_unlock(&u->mu);
			long long r = e_group(h, join, lvl == IPPROTO_IPV6, v, (int)l);
			leave(u);
			if (r < 0) {
				errno = (int)-r;
				return -1;
			}
			return 0;
		}
		int r = REAL(setsockopt)(fd, lvl, name, v, l);
		int e = errno;
		if (r == 0 && !atomic_load(&u->kmode)) {
			int v6 = lvl == IPPROTO_IPV6;
			size_t gl = v6 ? sizeof(struct in6_addr) : sizeof(struct in_addr); // the group, first in every form
			int at = -1;
			for (int i = 0; i < u->ngroups; i++)
				if (u->groups[i].v6 == v6 && (size_t)l >= gl && memcmp(u->groups[i].opt, v, gl) == 0) at = i;
			if (join && at < 0 && u->ngroups < MAXGROUPS && (size_t)l <= sizeof u->groups[0].opt) {
				memcpy(u->groups[u->ngroups].opt, v, l);
				u->groups[u->ngroups].len = (int)l;
				u->groups[u->ngroups].v6 = v6;
				u->ngroups++;
			} else if (!join && at >= 0) {
				u->groups[at] = u->groups[--u->ngroups];
			}
		}
		pthread_mutex_unlock(&u->mu);
		leave(u);
		errno = e;
		return r;
	}
	if (u->stream && lvl == SOL_SOCKET && name == SO_RCVLOWAT && v && l >= sizeof(int)) {
		// While part of an MPA Request is there the socket's SO_RCVLOWAT
		// is the exchange's: the program's is kept for when it is decided.
		pthread_mutex_lock(&u->mu);
		int held = atomic_load(&u->lowat) != 0;
		if (held) u->lowat0 = *(const int *)v;
		pthread_mutex_unlock(&u->mu);
		if (held) {
			leave(u);
			return 0;
		}
	}
	int r = REAL(setsockopt)(fd, lvl, name, v, l);
	if (r == 0 && lvl == SOL_SOCKET && name == SO_RCVTIMEO) u->rcvtimeo = tv_ns(v, l);
	if (r == 0 && lvl == SOL_SOCKET && name == SO_SNDTIMEO) u->sndtimeo = tv_ns(v, l);
	leave(u);
	return r;
}

// ---- waiting -----------------------------------------------------------

// restartable reports whether a blocking call an interrupting signal
// broke off should go on, as the kernel restarts a socket call when the
// handler has SA_RESTART: here, when every installed handler has it.
static int restartable(void) {
	for (int sig = 1; sig < NSIG; sig++) {
		if (sig == SIGKILL || sig == SIGSTOP || sig == SIGURG) continue;
		struct sigaction sa;
		if (sigaction(sig, NULL, &sa) != 0) continue;
		if (sa.sa_handler == SIG_DFL || sa.sa_handler == SIG_IGN) continue;
		if (!(sa.sa_flags & SA_RESTART)) return 0;
	}
	return 1;
}

// pollwait waits for events on fd until deadline (ns, -1 none), with the
// Go runtime's preemption signal held off (it is not the program's and
// must not interrupt it). 1 ready, 0 timed out, -1 interrupted.
static int pollwait(int fd, short events, long long deadline) {
	sigset_t mask;
	pthread_sigmask(SIG_BLOCK, NULL, &mask);
	sigaddset(&mask, SIGURG);
	for (;;) {
		struct timespec ts, *tp = NULL;
		if (deadline >= 0) {
			long long left = deadline - now_ns();
			if (left <= 0) return 0;
			ts.tv_sec = left / 1000000000LL;
			ts.tv_nsec = left % 1000000000LL;
			tp = &ts;
		}
		struct pollfd p = {.fd = fd, .events = events};
		int n = REAL(ppoll)(&p, 1, tp, &mask);
		if (n > 0) return 1;
		if (n == 0) return 0;
		if (errno != EINTR) return 1; // let the call itself report it
		if (!restartable()) return -1;
	}
}

static long long deadline_of(long long timeo) { return timeo > 0 ? now_ns() + timeo : -1; }

// ---- the data path -----------------------------------------------------

// The kernel path (a forked child, a socket the engine refused) is the
// program's own descriptor, in its own blocking mode.
static ssize_t krecv(int fd, struct msghdr *m, int flags) { return REAL(recvmsg)(fd, m, flags); }

static ssize_t ksend(int fd, const struct msghdr *m, int flags) { return REAL(sendmsg)(fd, m, flags); }

// urecv reads one datagram through the engine, waiting for the kernel
// socket to be readable while the program's mode and timeout let it.
static ssize_t urecv(struct usock *u, int fd, struct msghdr *m, int flags) {
	if (u->stream) return srecv(u, fd, m, flags);
	// A receive before the socket has an address binds it, as a send
	// would, so that the engine reads it: nothing can reach it before.
	if (atomic_load(&u->h) == 0 && adopt(u, fd) != 0) return -1;
	if (atomic_load(&u->kmode)) return krecv(fd, m, flags);
	if (flags & ~(MSG_PEEK | MSG_TRUNC | MSG_DONTWAIT | MSG_WAITALL | MSG_CMSG_CLOEXEC | MSG_NOSIGNAL)) {
		errno = EOPNOTSUPP; // MSG_OOB, MSG_ERRQUEUE: nothing of the kind here
		return -1;
	}
	int nb = atomic_load(&u->nonblock) || (flags & MSG_DONTWAIT);
	long long dl = deadline_of(u->rcvtimeo);
	long long spin = nb ? 0 : spin_ns;
	for (int i = 0;; i++) {
		if (atomic_load(&u->kmode)) return krecv(fd, m, flags);
		long long h = atomic_load(&u->h);
		if (h <= 0) {
			errno = EBADF;
			return -1;
		}
		int fl = m->msg_name ? (int)m->msg_namelen : 0;
		int mf = 0;
		long long r = e_recv(h, m->msg_iov, (int)m->msg_iovlen, m->msg_name, &fl, flags & (MSG_PEEK | MSG_TRUNC), &mf, spin);
		if (r >= 0) {
			if (m->msg_name) m->msg_namelen = (socklen_t)fl;
			m->msg_controllen = 0;
			m->msg_flags = mf;
			return r;
		}
		if (r != -EAGAIN) {
			errno = (int)-r;
			return -1;
		}
		if (nb) {
			errno = EAGAIN;
			return -1;
		}
		int w = pollwait(fd, POLLIN, dl);
		if (w == 0) {
			errno = EAGAIN;
			return -1;
		}
		if (w < 0) {
			errno = EINTR;
			return -1;
		}
		spin = i < 2 ? spin_ns / 4 : 0;
	}
}

static ssize_t usend(struct usock *u, int fd, const struct msghdr *m, int flags) {
	if (u->stream) return ssend(u, fd, m, flags);
	if (atomic_load(&u->wrshut)) { // as the kernel's UDP: EPIPE, no SIGPIPE
		errno = EPIPE;
		return -1;
	}
	if (atomic_load(&u->kmode)) return ksend(fd, m, flags);
	struct sockaddr_storage to;
	socklen_t tolen = m->msg_namelen;
	if (m->msg_name && tolen > 0) {
		if (tolen > sizeof to) tolen = sizeof to;
		memcpy(&to, m->msg_name, tolen);
	} else {
		if (!atomic_load(&u->connected)) {
			errno = EDESTADDRREQ;
			return -1;
		}
		pthread_mutex_lock(&u->mu);
		to = u->peer;
		tolen = u->peerlen;
		pthread_mutex_unlock(&u->mu);
	}
	if (adopt(u, fd) != 0) return -1;
	if (atomic_load(&u->kmode)) return ksend(fd, m, flags);
	int nb = atomic_load(&u->nonblock) || (flags & MSG_DONTWAIT);
	long long dl = deadline_of(u->sndtimeo);
	for (;;) {
		long long h = atomic_load(&u->h);
		if (h <= 0 || atomic_load(&u->closing)) {
			errno = EBADF;
			return -1;
		}
		long long r = e_send(h, m->msg_iov, (int)m->msg_iovlen, &to, (int)tolen);
		if (r >= 0) return r;
		// -ENOBUFS: an RD QP full of Sends its peers have not acknowledged
		// yet; their acknowledgements make the socket readable.
		int acks = r == -ENOBUFS;
		if (acks) r = -EAGAIN;
		if (r != -EAGAIN || nb) {
			errno = (int)-r;
			return -1;
		}
		int w = pollwait(fd, acks ? POLLIN : POLLOUT, dl); // wait for the kernel's buffer, or for acks
		if (w == 0) {
			errno = EAGAIN;
			return -1;
		}
		if (w < 0) {
			errno = EINTR;
			return -1;
		}
	}
}


// ---- streams (UDIWARP_PRELOAD_TCP=rc) -----------------------------------

// A TCP socket is the kernel's until it is connected: connect (and
// accept, for the accepted one) then runs MPA's exchange on it, in the
// engine, and from then on its bytes are RC's. The exchange is part of
// the call, bounded by UDIWARP_PRELOAD_TCP_WAIT: a non-blocking connect
// returns 0 once it is done rather than EINPROGRESS. A connection the
// engine cannot take is never left half the kernel's: connect fails
// (ECONNREFUSED: the listener is no preloaded program), accept closes
// it and reports ECONNABORTED; only an accepted peer whose first bytes
// are no MPA Request (a plain TCP client) stays the kernel's, unread.

static void adopt_stream(struct usock *u, int fd, long long h) {
	atomic_store(&u->engfd, fd);
	atomic_store(&u->h, h);
	int fl = REAL(fcntl)(fd, F_GETFD);
	if (fl >= 0) REAL(fcntl)(fd, F_SETFD, fl | FD_CLOEXEC);
}

static int sconnect(struct usock *u, int fd, const struct sockaddr *addr, socklen_t len) {
	if (atomic_load(&u->kmode) || atomic_load(&u->h) > 0 || !e_stream_open || atomic_load(&estate) != E_READY)
		return REAL(connect)(fd, addr, len);
	int r = REAL(connect)(fd, addr, len);
	if (r != 0 && errno != EINPROGRESS) return r;
	if (r != 0) {
		// Non-blocking: the handshake completes here (TCP's, then MPA's).
		long long dl = now_ns() + 5000000000LL;
		int w;
		while ((w = pollwait(fd, POLLOUT, dl)) < 0) {}
		int err = 0;
		socklen_t el = sizeof err;
		if (w == 0) err = ETIMEDOUT;
		else if (REAL(getsockopt)(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0) err = errno;
		if (err) {
			errno = err;
			return -1;
		}
	}
	int need = 0;
	long long h = e_stream_open(fd, 1, &u->pending, &need);
	if (h > 0) {
		adopt_stream(u, fd, h);
		return 0;
	}
	atomic_store(&u->dead, 1); // MPA's Request went out: no plain TCP on it now
	REAL(shutdown)(fd, SHUT_RDWR);
	errno = h == -ETIMEDOUT ? ETIMEDOUT : ECONNREFUSED;
	return -1;
}

// first_bytes says what waits first on an accepted stream: 1 an MPA
// Request's key, 0 anything else (or the end, or an error: the kernel's
// to report), -1 nothing yet, -2 part of the key.
static const char mpa_key[] = "MPA ID Req Frame";
#define MPA_KEY_LEN 16

static int first_bytes(int fd) {
	char b[MPA_KEY_LEN];
	ssize_t n = REAL(recvfrom)(fd, b, sizeof b, MSG_PEEK | MSG_DONTWAIT, NULL, NULL);
	if (n < 0) return errno == EAGAIN || errno == EINTR ? -1 : 0;
	if (n == 0 || memcmp(b, mpa_key, (size_t)n) != 0) return 0;
	return n == MPA_KEY_LEN ? 1 : -2;
}

// peer_ended reports whether the peer has ended its side (or the
// connection failed): what it sent is all it will send.
static int peer_ended(int fd) {
	struct pollfd p = {.fd = fd, .events = POLLRDHUP};
	return REAL(poll)(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

// An undecided stream's waits. A read finds nothing before the stream
// is decided, so while part of an MPA Request is there the socket's
// SO_RCVLOWAT is what the Request needs in all: the kernel then calls it
// readable (poll, select, epoll, a blocking read's wait) when the rest is
// there, or the peer ended, and not at every byte. A write waits for
// the peer's first bytes; the waits of poll, select and epoll hold its
// POLLOUT back meanwhile, and ask the kernel for POLLIN instead. Each
// wait ends, whatever the program's timeout, at the time the stream
// would be decided without more from its peer (due).

// rewatch counts u in watch_n while an epoll wait must look after it:
// part of a Request is there (its time to give up comes), or the program
// registered fd for EPOLLOUT.
static void rewatch(struct usock *u, int fd) {
	int v = atomic_load(&u->undecided) &&
	        (atomic_load(&u->lowat) || (fd >= 0 && fd < MAXFD && atomic_load(&reg_ep[fd]) && (reg_ev[fd] & EPOLLOUT)));
	if (atomic_exchange(&u->watch, v) != v) atomic_fetch_add(&watch_n, v ? 1 : -1);
}

static void set_lowat(struct usock *u, int fd, int need) {
	if (atomic_load(&u->lowat) == need) return;
	if (!atomic_load(&u->lowat)) {
		socklen_t l = sizeof u->lowat0;
		if (REAL(getsockopt)(fd, SOL_SOCKET, SO_RCVLOWAT, &u->lowat0, &l) != 0) u->lowat0 = 1;
	}
	if (REAL(setsockopt)(fd, SOL_SOCKET, SO_RCVLOWAT, &need, sizeof need) == 0) atomic_store(&u->lowat, need);
}

// decided ends u's undecided state, under u->mu: the socket's own
// SO_RCVLOWAT and epoll registration come back (lowering SO_RCVLOWAT,
// and the registration, wake the program's waits for what is there).
static void decided(struct usock *u, int fd) {
	if (atomic_exchange(&u->lowat, 0) && fd >= 0) REAL(setsockopt)(fd, SOL_SOCKET, SO_RCVLOWAT, &u->lowat0, sizeof u->lowat0);
	int ep = atomic_exchange(&u->ep_mod, 0);
	if (ep && atomic_load(&reg_ep[u->ep_fd]) == ep) {
		struct epoll_event ev = {.events = reg_ev[u->ep_fd], .data.u64 = reg_data[u->ep_fd]};
		REAL(epoll_ctl)(ep - 1, EPOLL_CTL_MOD, u->ep_fd, &ev);
	}
	if (atomic_exchange(&u->undecided, 0)) atomic_fetch_sub(&undecided_n, 1);
	rewatch(u, fd);
}

// due is when u would be decided without more from its peer (ns, -1
// never): hs_dl while part of a Request is there, else first_dl for a
// write, else never (a silent peer of a reading program is left alone).
static long long due(struct usock *u, int writing) {
	if (atomic_load(&u->lowat)) return u->hs_dl;
	return writing ? u->first_dl : -1;
}

enum { S_READ, S_WRITE, S_NOW };

// settle decides an undecided accepted stream if its peer's bytes, or
// the time, allow, never waiting: RC when they are a whole MPA Request
// (the engine answers it at once), the kernel's when they are anything
// else, or when the peer is silent past first_dl and the program writes
// (a plain client waiting for us to speak), or has sent part of the key
// and stopped past hs_dl, or ended; shut down (dead) when a Request
// begun is not finished by hs_dl, or is bogus. how: S_READ, S_WRITE, or
// S_NOW (shutdown: decide now, as if every wait were over). It returns
// 0 once decided; -1 while undecided, with *wake (if not NULL) the time
// due says.
// In a forked child, with no engine, an MPA Request makes the stream one
// the child cannot carry.
static int settle(struct usock *u, int fd, int how, long long *wake) {
	if (wake) *wake = -1;
	if (!atomic_load(&u->undecided)) return 0;
	pthread_mutex_lock(&u->mu);
	int r = 0;
	if (atomic_load(&u->undecided)) {
		long long now = how == S_NOW ? LLONG_MAX : now_ns();
		int st = atomic_load(&estate), need = 0, ended = 0;
		int k = first_bytes(fd);
		if (k == 1 || k == -2) { // what is there is all there will be, if the peer ended
			ended = peer_ended(fd);
			if (ended) k = first_bytes(fd);
		}
		long long h = 0;
		enum { WAIT, PLAIN, RC, DEAD, FORKED } to = WAIT;
		if (k == 0) {
			to = PLAIN;
		} else if (k == -1) {
			if (how != S_READ && now >= u->first_dl) to = PLAIN;
		} else if (k == -2) {
			if (ended || now >= u->hs_dl) to = PLAIN; // some bytes, no MPA Request: the kernel's
			else need = MPA_KEY_LEN;
		} else if (st == E_CHILD) {
			to = FORKED;
		} else if (st != E_READY) {
			to = DEAD;
		} else {
			int nd = 0;
			h = e_stream_open(fd, 0, &u->pending, &nd);
			if (h > 0) {
				to = RC;
			} else if (h == -ENOTCONN) {
				to = PLAIN; // counted by the engine
			} else if (h == -EAGAIN && !ended && now < u->hs_dl) {
				need = nd;
			} else {
				if (h == -EAGAIN && e_stream_refused) e_stream_refused();
				to = DEAD;
			}
		}
		switch (to) {
		case WAIT:
			if (need > 0) set_lowat(u, fd, need);
			rewatch(u, fd);
			if (wake) *wake = due(u, how != S_READ);
			r = -1;
			break;
		case PLAIN:
			atomic_store(&u->kmode, 1);
			if (st == E_READY && e_stream_plain && !(k == 1 && h == -ENOTCONN)) e_stream_plain();
			break;
		case RC:
			adopt_stream(u, fd, h);
			break;
		case DEAD:
			atomic_store(&u->dead, 1); // it spoke MPA: never plain bytes now
			REAL(shutdown)(fd, SHUT_RDWR);
			break;
		case FORKED:
			atomic_store(&u->forked, 1);
			break;
		}
		if (r == 0) decided(u, fd);
	}
	pthread_mutex_unlock(&u->mu);
	return r;
}

// settle_wait settles u as a blocking call of the program's would: it
// waits for the peer's bytes until dl (ns, -1 none), and until the time
// the stream is decided without them. 0 decided, -1 dl came first, -2 a
// signal broke the wait off.
static int settle_wait(struct usock *u, int fd, int how, long long dl) {
	for (;;) {
		long long wake;
		if (settle(u, fd, how, &wake) == 0) return 0;
		long long until = wake < 0 ? dl : dl < 0 || wake < dl ? wake : dl;
		int w = pollwait(fd, POLLIN, until);
		if (w < 0) return -2;
		if (w == 0 && dl >= 0 && now_ns() >= dl) return -1;
	}
}

static int uaccept(int fd, struct sockaddr *a, socklen_t *l, int flags, int four) {
	struct usock *u = lookup(fd);
	int c = four ? REAL(accept4)(fd, a, l, flags) : REAL(accept)(fd, a, l);
	if (c < 0 || c >= MAXFD || !u || !u->stream || atomic_load(&u->kmode)) return c;
	int st = atomic_load(&estate);
	// A forked child has no engine, but an MPA Request it accepts must
	// not be answered by the kernel either: its streams are decided too.
	if ((st != E_READY || !e_stream_open) && st != E_CHILD) return c;
	struct usock *n = calloc(1, sizeof *n);
	if (!n) return c;
	n->family = u->family;
	n->stream = 1;
	atomic_store(&n->engfd, -1);
	atomic_store(&n->nonblock, (flags & SOCK_NONBLOCK) != 0);
	atomic_store(&n->fds, 1);
	atomic_store(&n->kmode, st == E_CHILD);
	pthread_mutex_init(&n->mu, NULL);
	long long now = now_ns();
	n->first_dl = now + first_wait_ns;
	n->hs_dl = now + hs_wait_ns;
	atomic_store(&cloexec_view[c], (flags & SOCK_CLOEXEC) != 0);
	atomic_store(&n->undecided, 1);
	atomic_fetch_add(&undecided_n, 1);
	seen(c);
	atomic_store(&owned[c], n);
	// A preloaded peer's MPA Request follows its connect at once, and its
	// connect waits for our answer: a blocking accept (a program willing
	// to wait there, which may only then hand the stream on, or fork)
	// gives it 10 ms at most; a non-blocking one (an event loop, which
	// polls the stream) none. A peer silent past it is decided later all
	// the same.
	if (st == E_READY) {
		if (atomic_load(&u->nonblock) || (flags & SOCK_NONBLOCK)) settle(n, c, S_READ, NULL);
		else settle_wait(n, c, S_READ, now_ns() + 10000000LL);
	}
	return c;
}

EXPORT int accept(int fd, struct sockaddr *a, socklen_t *l) { return uaccept(fd, a, l, 0, 0); }
EXPORT int accept4(int fd, struct sockaddr *a, socklen_t *l, int flags) { return uaccept(fd, a, l, flags, 1); }

// gone reports why an owned stream cannot carry data, setting errno: 1
// when it cannot, 0 when it can (or is the kernel's).
static int gone(struct usock *u, int sending, int flags) {
	if (atomic_load(&u->forked)) {
		static atomic_int told;
		if (!atomic_exchange(&told, 1)) warn("a forked child used an RC stream only the parent's engine carries: EOPNOTSUPP");
		errno = EOPNOTSUPP;
		return 1;
	}
	if (atomic_load(&u->dead)) {
		errno = sending ? EPIPE : ENOTCONN;
		if (sending && !(flags & MSG_NOSIGNAL)) raise(SIGPIPE);
		return 1;
	}
	return 0;
}

// iov_from views m's iovecs from byte off on, in v (at most max entries):
// the count.
static int iov_from(const struct msghdr *m, size_t off, struct iovec *v, int max) {
	int k = 0;
	for (size_t i = 0; i < m->msg_iovlen && k < max; i++) {
		size_t len = m->msg_iov[i].iov_len;
		if (off >= len) {
			off -= len;
			continue;
		}
		v[k].iov_base = (char *)m->msg_iov[i].iov_base + off;
		v[k].iov_len = len - off;
		off = 0;
		k++;
	}
	return k;
}

static size_t iov_total(const struct msghdr *m) {
	size_t t = 0;
	for (size_t i = 0; i < m->msg_iovlen; i++) t += m->msg_iov[i].iov_len;
	return t;
}

static ssize_t srecv(struct usock *u, int fd, struct msghdr *m, int flags) {
	if (atomic_load(&u->undecided)) {
		// Nothing from the peer yet, or part of a Request: what a kernel
		// receive finding nothing would do (EAGAIN, or wait), deciding as
		// soon as its bytes, or the stream's time, come.
		int nb = atomic_load(&u->nonblock) || (flags & MSG_DONTWAIT);
		int w = nb ? settle(u, fd, S_READ, NULL) : settle_wait(u, fd, S_READ, deadline_of(u->rcvtimeo));
		if (w < 0) {
			errno = w == -2 ? EINTR : EAGAIN;
			return -1;
		}
	}
	if (gone(u, 0, flags)) return -1;
	long long h = atomic_load(&u->h);
	if (h <= 0 || atomic_load(&u->kmode)) return krecv(fd, m, flags);
	if (flags & ~(MSG_PEEK | MSG_TRUNC | MSG_DONTWAIT | MSG_WAITALL | MSG_CMSG_CLOEXEC | MSG_NOSIGNAL)) {
		errno = EOPNOTSUPP; // MSG_OOB, MSG_ERRQUEUE: RC carries no urgent data
		return -1;
	}
	int nb = atomic_load(&u->nonblock) || (flags & MSG_DONTWAIT);
	int all = (flags & MSG_WAITALL) && !nb && !(flags & MSG_PEEK);
	size_t want = iov_total(m);
	long long dl = deadline_of(u->rcvtimeo);
	long long spin = nb ? 0 : spin_ns;
	struct iovec v[64];
	size_t got = 0;
	if (m->msg_name) m->msg_namelen = 0;
	m->msg_controllen = 0;
	m->msg_flags = 0;
	for (int i = 0;; i++) {
		if ((h = atomic_load(&u->h)) <= 0) {
			errno = EBADF;
			return -1;
		}
		int n = iov_from(m, got, v, 64);
		int mf = 0;
		long long r = e_recv(h, v, n, NULL, NULL, flags & (MSG_PEEK | MSG_TRUNC), &mf, spin);
		if (r > 0) {
			got += (size_t)r;
			if (!all || got >= want) return (ssize_t)got;
			continue;
		}
		if (r == 0) return (ssize_t)got; // the end of the stream
		if (r != -EAGAIN || nb) {
			if (got > 0) return (ssize_t)got;
			errno = (int)-r;
			return -1;
		}
		int w = pollwait(fd, POLLIN, dl);
		if (w <= 0) {
			if (got > 0) return (ssize_t)got;
			errno = w == 0 ? EAGAIN : EINTR;
			return -1;
		}
		spin = i < 2 ? spin_ns / 4 : 0;
	}
}

static ssize_t ssend(struct usock *u, int fd, const struct msghdr *m, int flags) {
	if (atomic_load(&u->undecided)) {
		// A write before the peer spoke, or finished its Request: it waits
		// for the peer's bytes as a full socket's would (EAGAIN, or wait),
		// until the stream's time (first_dl, hs_dl) decides it.
		int nb = atomic_load(&u->nonblock) || (flags & MSG_DONTWAIT);
		int w = nb ? settle(u, fd, S_WRITE, NULL) : settle_wait(u, fd, S_WRITE, deadline_of(u->sndtimeo));
		if (w < 0) {
			errno = w == -2 ? EINTR : EAGAIN;
			return -1;
		}
	}
	if (gone(u, 1, flags)) return -1;
	long long h = atomic_load(&u->h);
	if (h <= 0 || atomic_load(&u->kmode)) return ksend(fd, m, flags);
	if (flags & MSG_OOB) {
		errno = EOPNOTSUPP;
		return -1;
	}
	int nb = atomic_load(&u->nonblock) || (flags & MSG_DONTWAIT);
	size_t total = iov_total(m);
	long long dl = deadline_of(u->sndtimeo);
	size_t sent = 0;
	while (sent < total || total == 0) {
		if ((h = atomic_load(&u->h)) <= 0) {
			errno = EBADF;
			return -1;
		}
		struct iovec v[64];
		int n = iov_from(m, sent, v, 64);
		long long r = e_stream_send(h, v, n, 0);
		if (r >= 0) {
			sent += (size_t)r;
			if (nb || total == 0) break;
			continue;
		}
		if (r == -EAGAIN && !nb) {
			int w = pollwait(fd, POLLOUT, dl);
			if (w > 0) continue;
			if (sent > 0) break;
			errno = w == 0 ? EAGAIN : EINTR;
			return -1;
		}
		if (sent > 0) break;
		if (r == -EPIPE && !(flags & MSG_NOSIGNAL)) raise(SIGPIPE);
		errno = (int)-r;
		return -1;
	}
	return (ssize_t)sent;
}

// dshutdown shuts a datagram socket down. Its kernel socket carries the
// engine's frames as well as the program's datagrams — RD's handshake,
// acknowledgements and retransmissions — and the kernel's SHUT_WR would
// stop them all (an RD Send still unacknowledged, or waiting for its
// peer's handshake, would never reach the peer, and the engine's later
// sends fail with EPIPE). So the program's SHUT_WR is the library's:
// the program's sends fail with EPIPE from now on, as the kernel's
// would, and then the engine waits for what RD holds of the socket's
// Sends to be acknowledged (UDIWARP_PRELOAD_RD_LINGER); the kernel keeps
// its send side open for the engine. SHUT_RD is the kernel's. The
// result is the kernel's (ENOTCONN for an unconnected socket, which the
// kernel shuts all the same).
static int dshutdown(struct usock *u, int fd, int how) {
	if (atomic_load(&u->kmode) || (how != SHUT_WR && how != SHUT_RDWR)) return REAL(shutdown)(fd, how);
	atomic_store(&u->wrshut, 1);
	long long h = atomic_load(&u->h);
	if (h > 0 && e_shutdown && atomic_load(&estate) == E_READY) e_shutdown(h, how);
	if (how == SHUT_RDWR) return REAL(shutdown)(fd, SHUT_RD);
	struct sockaddr_storage ss;
	socklen_t sl = sizeof ss;
	return REAL(getpeername)(fd, (struct sockaddr *)&ss, &sl) == 0 ? 0 : -1;
}

EXPORT int shutdown(int fd, int how) {
	struct usock *u = lookup(fd);
	if (u && !u->stream) return dshutdown(u, fd, how);
	if (u && u->stream) settle(u, fd, S_NOW, NULL); // shut before the peer spoke: the kernel's
	if (u && u->stream && !atomic_load(&u->kmode) && atomic_load(&u->h) > 0 && (how == SHUT_RD || how == SHUT_WR || how == SHUT_RDWR))
		e_shutdown(atomic_load(&u->h), how); // what the engine holds goes before the FIN
	return REAL(shutdown)(fd, how);
}

// stream_out reports whether fd is a stream the engine carries, which
// the kernel must not write into behind it.
static struct usock *stream_out(int fd) {
	struct usock *u = lookup(fd);
	return u && u->stream && (atomic_load(&u->h) > 0 || atomic_load(&u->forked) || atomic_load(&u->dead)) ? u : NULL;
}

// sendfile to a stream the engine carries: read and sent through it.
static ssize_t ssendfile(struct usock *u, int out, int in, off64_t *off, size_t count) {
	char buf[65536];
	size_t done = 0;
	while (done < count) {
		size_t want = count - done < sizeof buf ? count - done : sizeof buf;
		ssize_t k = off ? pread64(in, buf, want, *off) : REAL(read)(in, buf, want);
		if (k <= 0) {
			if (k < 0 && done == 0) return -1;
			break;
		}
		struct iovec iov = {buf, (size_t)k};
		struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
		ssize_t w = ssend(u, out, &m, 0);
		if (w < 0 && done == 0) return -1;
		if (w > 0) {
			done += (size_t)w;
			if (off) *off += w;
		}
		if (w < k) { // the stream took less: give the file back what it did not
			if (!off && w >= 0) lseek(in, w - k, SEEK_CUR);
			break;
		}
	}
	return (ssize_t)done;
}

EXPORT ssize_t sendfile(int out, int in, off_t *off, size_t count) {
	struct usock *u = stream_out(out);
	if (!u) return REAL(sendfile)(out, in, off, count);
	off64_t o = off ? *off : 0;
	ssize_t r = ssendfile(u, out, in, off ? &o : NULL, count);
	if (off) *off = (off_t)o;
	return r;
}

EXPORT ssize_t sendfile64(int out, int in, off64_t *off, size_t count) {
	struct usock *u = stream_out(out);
	if (!u) return REAL(sendfile64)(out, in, off, count);
	return ssendfile(u, out, in, off, count);
}

// splice, tee and vmsplice would move raw bytes in or out of a stream
// behind the engine: refused.
EXPORT ssize_t splice(int in, loff_t *oin, int out, loff_t *oout, size_t len, unsigned int flags) {
	if (stream_out(in) || stream_out(out)) {
		errno = EINVAL;
		return -1;
	}
	return REAL(splice)(in, oin, out, oout, len, flags);
}

EXPORT ssize_t tee(int in, int out, size_t len, unsigned int flags) {
	if (stream_out(in) || stream_out(out)) {
		errno = EINVAL;
		return -1;
	}
	return REAL(tee)(in, out, len, flags);
}

EXPORT ssize_t vmsplice(int fd, const struct iovec *iov, size_t n, unsigned int flags) {
	if (stream_out(fd)) {
		errno = EINVAL;
		return -1;
	}
	return REAL(vmsplice)(fd, iov, n, flags);
}

// ---- readiness -----------------------------------------------------------

// The kernel calls an owned socket readable whenever a datagram is
// queued, and the engine reads the queue only when the program receives.
// Two things differ from what a program expects: a queued datagram may be
// none of the program's (an RD acknowledgement or handshake, an error
// report), and a datagram the engine has read already (for FIONREAD,
// MSG_PEEK, or an RD sender's acknowledgements) waits in the engine,
// where the kernel does not see it. So poll, ppoll, select, pselect,
// epoll_wait and epoll_pwait ask the engine about every owned descriptor
// the kernel calls readable (udw_ready reads its queue up to the first
// datagram for the program, which it keeps) and report as readable every
// one whose pending flag says the engine holds data; a wait that is left
// with nothing ready goes on for the rest of its timeout. A blocking
// receive after a poll then never waits for a datagram that was not
// there.

// no_urg is the signal mask for a wait of the program's (poll, select,
// epoll): its own (mask, or the thread's) with the Go runtime's
// preemption signal held off, as pollwait does: SIGURG, sent to a thread
// that ran the engine and caught back in C, is not the program's, and
// must not end its wait with EINTR.
static const sigset_t *no_urg(const sigset_t *mask, sigset_t *buf) {
	if (atomic_load(&estate) != E_READY) return mask;
	if (mask) *buf = *mask;
	else pthread_sigmask(SIG_BLOCK, NULL, buf);
	sigaddset(buf, SIGURG);
	return buf;
}

static struct usock *engine_sock(int fd, long long *h) {
	struct usock *u = lookup(fd);
	if (!u || atomic_load(&u->kmode) || atomic_load(&estate) != E_READY) return NULL;
	*h = atomic_load(&u->h);
	return *h > 0 ? u : NULL;
}

static int waiting(struct usock *u) { return __atomic_load_n(&u->pending, __ATOMIC_ACQUIRE); }

// none_held: no owned socket's pending flag is set (the engine keeps the
// count), so a wait need not look at each for data the engine holds.
static int none_held(void) { return e_counter && __atomic_load_n(&holding, __ATOMIC_ACQUIRE) == 0; }

static struct timespec *left_ts(long long dl, int now_only, struct timespec *ts) {
	if (now_only) {
		ts->tv_sec = ts->tv_nsec = 0;
		return ts;
	}
	if (dl < 0) return NULL;
	long long left = dl - now_ns();
	if (left < 0) left = 0;
	ts->tv_sec = left / 1000000000LL;
	ts->tv_nsec = left % 1000000000LL;
	return ts;
}

// undecided_sock is fd's usock when it is an accepted stream still
// undecided (see "streams": its waits are the preload's to shape).
static struct usock *undecided_sock(int fd) {
	struct usock *u = lookup(fd);
	return u && u->stream && atomic_load(&u->undecided) ? u : NULL;
}

static long long earlier(long long a, long long b) { return a < 0 ? b : b < 0 || a < b ? a : b; }

#define POLLWR (POLLOUT | POLLWRNORM | POLLWRBAND)

static int upoll(struct pollfd *fds, nfds_t n, long long dl, const sigset_t *mask) {
	sigset_t urg;
	mask = no_urg(mask, &urg);
	int owned_any = 0, und_any = 0, und = atomic_load(&undecided_n) > 0;
	for (nfds_t i = 0; i < n && !(owned_any && (und_any || !und)); i++) {
		long long h;
		if (!owned_any) owned_any = (fds[i].events & (POLLIN | POLLRDNORM)) && engine_sock(fds[i].fd, &h);
		if (und && !und_any) und_any = undecided_sock(fds[i].fd) != NULL;
	}
	struct timespec ts;
	if (!owned_any && !und_any) return REAL(ppoll)(fds, n, left_ts(dl, 0, &ts), mask);
	// held: the undecided streams whose POLLOUT this wait holds back, with
	// the program's events, put back before it returns.
	struct held { nfds_t i; short ev; } few[16], *held = few;
	size_t cap = 16;
	for (;;) {
		long long until = dl;
		size_t nh = 0;
		for (nfds_t i = 0; und_any && i < n; i++) {
			struct usock *u = undecided_sock(fds[i].fd);
			if (!u) continue;
			int wr = (fds[i].events & POLLWR) != 0;
			long long d = due(u, wr);
			if (d >= 0 && now_ns() >= d && settle(u, fds[i].fd, wr ? S_WRITE : S_READ, &d) == 0) continue;
			until = earlier(until, d);
			if (!wr) continue;
			if (nh == cap) {
				struct held *more = malloc(2 * cap * sizeof *more);
				if (!more) continue; // its POLLOUT shows: a write says EAGAIN
				memcpy(more, held, nh * sizeof *more);
				if (held != few) free(held);
				held = more;
				cap *= 2;
			}
			held[nh++] = (struct held){i, fds[i].events};
			fds[i].events = (short)((fds[i].events & ~POLLWR) | POLLIN);
		}
		int any = 0, scan = owned_any && !none_held();
		for (nfds_t i = 0; scan && i < n && !any; i++) {
			long long h;
			struct usock *u = (fds[i].events & (POLLIN | POLLRDNORM)) ? engine_sock(fds[i].fd, &h) : NULL;
			any = u && waiting(u);
		}
		int r = REAL(ppoll)(fds, n, left_ts(until, any, &ts), mask);
		int e = errno, again = 0;
		for (size_t j = 0; j < nh; j++) {
			struct pollfd *p = &fds[held[j].i];
			p->events = held[j].ev;
			struct usock *u = r > 0 && p->revents ? undecided_sock(p->fd) : NULL;
			if (u && settle(u, p->fd, S_WRITE, NULL) == 0) again = 1; // decided: poll it as it is now
			p->revents = 0;
		}
		if (r < 0) {
			if (held != few) free(held);
			errno = e;
			return r;
		}
		if (again) continue;
		for (nfds_t i = 0; und_any && i < n; i++) {
			struct usock *u;
			if ((fds[i].revents & (POLLIN | POLLRDNORM)) && (u = undecided_sock(fds[i].fd)) && settle(u, fds[i].fd, S_READ, NULL) < 0)
				fds[i].revents &= (short)~(POLLIN | POLLRDNORM); // part of a Request: nothing to read yet
		}
		r = 0;
		for (nfds_t i = 0; i < n; i++) {
			short want = fds[i].events & (POLLIN | POLLRDNORM);
			long long h;
			struct usock *u = want ? engine_sock(fds[i].fd, &h) : NULL;
			if (u) {
				short was = fds[i].revents;
				if (waiting(u) || ((was & want) && ((was & (POLLERR | POLLHUP | POLLNVAL)) || e_ready(h))))
					fds[i].revents |= want;
				else
					fds[i].revents &= (short)~(POLLIN | POLLRDNORM);
			}
			if (fds[i].revents) r++;
		}
		if (r > 0 || (dl >= 0 && now_ns() >= dl)) {
			if (held != few) free(held);
			return r;
		}
	}
}

EXPORT int poll(struct pollfd *fds, nfds_t n, int timeout) {
	return upoll(fds, n, timeout < 0 ? -1 : now_ns() + (long long)timeout * 1000000LL, NULL);
}

EXPORT int ppoll(struct pollfd *fds, nfds_t n, const struct timespec *ts, const sigset_t *mask) {
	return upoll(fds, n, ts ? now_ns() + ts->tv_sec * 1000000000LL + ts->tv_nsec : -1, mask);
}

static int uselect(int nfds, fd_set *rs, fd_set *ws, fd_set *es, long long dl, const sigset_t *mask, struct timeval *tv) {
	sigset_t urg;
	mask = no_urg(mask, &urg);
	int top = nfds < FD_SETSIZE ? nfds : FD_SETSIZE;
	int owned_any = 0, und_any = 0, und = atomic_load(&undecided_n) > 0;
	for (int fd = 0; fd < top && !(owned_any && (und_any || !und)); fd++) {
		long long h;
		int rd = rs && FD_ISSET(fd, rs), wr = ws && FD_ISSET(fd, ws);
		if (!owned_any) owned_any = rd && engine_sock(fd, &h);
		if (und && !und_any) und_any = (rd || wr) && undecided_sock(fd);
	}
	struct timespec ts;
	if (!owned_any && !und_any) {
		int r = REAL(pselect)(nfds, rs, ws, es, left_ts(dl, 0, &ts), mask);
		if (tv) *tv = (struct timeval){0, 0};
		if (tv && r > 0 && dl >= 0) {
			left_ts(dl, 0, &ts);
			*tv = (struct timeval){ts.tv_sec, ts.tv_nsec / 1000};
		}
		return r;
	}
	fd_set r0, w0, e0, kr, kw, ke, held;
	FD_ZERO(&r0);
	FD_ZERO(&w0);
	FD_ZERO(&e0);
	if (rs) r0 = *rs;
	if (ws) w0 = *ws;
	if (es) e0 = *es;
	for (;;) {
		long long until = dl;
		int nheld = 0;
		kr = r0;
		kw = w0;
		ke = e0;
		FD_ZERO(&held);
		// An undecided stream's POLLOUT is held back (see upoll).
		for (int fd = 0; und_any && fd < top; fd++) {
			int wr = FD_ISSET(fd, &w0);
			struct usock *u = wr || FD_ISSET(fd, &r0) ? undecided_sock(fd) : NULL;
			if (!u) continue;
			long long d = due(u, wr);
			if (d >= 0 && now_ns() >= d && settle(u, fd, wr ? S_WRITE : S_READ, &d) == 0) continue;
			until = earlier(until, d);
			if (!wr) continue;
			FD_SET(fd, &held);
			FD_CLR(fd, &kw);
			FD_SET(fd, &kr);
			nheld++;
		}
		int any = 0, scan = owned_any && !none_held();
		for (int fd = 0; scan && fd < top && !any; fd++) {
			long long h;
			struct usock *u = FD_ISSET(fd, &r0) ? engine_sock(fd, &h) : NULL;
			any = u && waiting(u);
		}
		int r = REAL(pselect)(nfds, rs || nheld ? &kr : NULL, ws ? &kw : NULL, es ? &ke : NULL, left_ts(until, any, &ts), mask);
		if (r < 0) return r;
		int again = 0;
		for (int fd = 0; und_any && fd < top; fd++) {
			struct usock *u;
			if (FD_ISSET(fd, &held)) {
				if ((FD_ISSET(fd, &kr) || FD_ISSET(fd, &ke)) && (u = undecided_sock(fd)) && settle(u, fd, S_WRITE, NULL) == 0) again = 1;
				FD_CLR(fd, &kr);
				FD_CLR(fd, &ke);
			} else if (FD_ISSET(fd, &kr) && (u = undecided_sock(fd)) && settle(u, fd, S_READ, NULL) < 0) {
				FD_CLR(fd, &kr); // part of a Request: nothing to read yet
			}
		}
		if (again) continue;
		for (int fd = 0; fd < top; fd++) {
			long long h;
			struct usock *u = FD_ISSET(fd, &r0) ? engine_sock(fd, &h) : NULL;
			if (!u) continue;
			if (waiting(u) || (FD_ISSET(fd, &kr) && e_ready(h)))
				FD_SET(fd, &kr);
			else
				FD_CLR(fd, &kr);
		}
		r = 0;
		for (int fd = 0; fd < top; fd++)
			r += (rs && FD_ISSET(fd, &kr)) + (ws && FD_ISSET(fd, &kw)) + (es && FD_ISSET(fd, &ke));
		if (r > 0 || (dl >= 0 && now_ns() >= dl)) {
			if (rs) *rs = kr;
			if (ws) *ws = kw;
			if (es) *es = ke;
			if (tv) {
				left_ts(dl, 0, &ts);
				*tv = dl < 0 ? *tv : (struct timeval){ts.tv_sec, ts.tv_nsec / 1000};
			}
			return r;
		}
	}
}

EXPORT int select(int nfds, fd_set *rs, fd_set *ws, fd_set *es, struct timeval *tv) {
	long long dl = tv ? now_ns() + tv->tv_sec * 1000000000LL + tv->tv_usec * 1000LL : -1;
	return uselect(nfds, rs, ws, es, dl, NULL, tv);
}

EXPORT int pselect(int nfds, fd_set *rs, fd_set *ws, fd_set *es, const struct timespec *ts, const sigset_t *mask) {
	return uselect(nfds, rs, ws, es, ts ? now_ns() + ts->tv_sec * 1000000000LL + ts->tv_nsec : -1, mask, NULL);
}

// epoll: the events carry the program's data, not descriptors, so
// epoll_ctl records, for each owned descriptor, the epoll set it was last
// added to, with its events and data; an event is matched back to its
// descriptor by that (the data's low 32 bits first: most programs store
// the descriptor there). A descriptor in two epoll sets at once is
// matched in the last only; in the other it is reported as the kernel
// reports it.

// hint maps an event's data to the descriptor it was last seen with
// (a direct-mapped cache, checked against the registration): programs
// that store an index or a pointer there (SIPp) would otherwise cost a
// walk of every descriptor per event.
static atomic_int hint[MAXFD];

static unsigned hint_slot(int epfd, uint64_t data) {
	uint64_t x = (data ^ ((uint64_t)epfd << 32)) * 0x9E3779B97F4A7C15ULL;
	return (unsigned)(x >> 48) % MAXFD;
}

EXPORT int epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev) {
	int r = REAL(epoll_ctl)(epfd, op, fd, ev);
	if (r != 0 || (unsigned)fd >= MAXFD || (unsigned)epfd >= MAXFD || !lookup(fd)) return r;
	if (op == EPOLL_CTL_DEL) {
		if (atomic_load(&reg_ep[fd]) == epfd + 1) atomic_store(&reg_ep[fd], 0);
	} else if (ev) {
		reg_data[fd] = ev->data.u64;
		reg_ev[fd] = ev->events;
		atomic_store(&reg_ep[fd], epfd + 1);
		atomic_store(&ep_owned[epfd], 1);
		atomic_store(&hint[hint_slot(epfd, ev->data.u64)], fd + 1);
	}
	struct usock *u = lookup(fd);
	if (u && u->stream && atomic_load(&u->undecided)) {
		// The program's registration replaces one a wait changed.
		pthread_mutex_lock(&u->mu);
		if (atomic_load(&u->ep_mod) == epfd + 1 && u->ep_fd == fd) atomic_store(&u->ep_mod, 0);
		rewatch(u, fd);
		pthread_mutex_unlock(&u->mu);
	}
	return r;
}

static int event_fd(int epfd, uint64_t data) {
	int c = (int)(uint32_t)data;
	if (c >= 0 && c < MAXFD && atomic_load(&reg_ep[c]) == epfd + 1 && reg_data[c] == data) return c;
	unsigned slot = hint_slot(epfd, data);
	c = atomic_load(&hint[slot]) - 1;
	if (c >= 0 && atomic_load(&reg_ep[c]) == epfd + 1 && reg_data[c] == data) return c;
	int m = atomic_load(&maxfd);
	for (int fd = 0; fd <= m && fd < MAXFD; fd++)
		if (atomic_load(&reg_ep[fd]) == epfd + 1 && reg_data[fd] == data) {
			atomic_store(&hint[slot], fd + 1);
			return fd;
		}
	return -1;
}

// ep_hold has the epoll set epfd report fd, an undecided stream the
// program registered for EPOLLOUT, readable instead (its peer's bytes),
// until it is decided (decided() puts the program's registration back,
// which reports what is ready then, also edge-triggered).
static void ep_hold(struct usock *u, int epfd, int fd) {
	pthread_mutex_lock(&u->mu);
	if (atomic_load(&u->undecided) && !atomic_load(&u->ep_mod)) {
		struct epoll_event ev = {.events = (reg_ev[fd] & ~(uint32_t)(EPOLLOUT | EPOLLWRNORM | EPOLLWRBAND)) | EPOLLIN, .data.u64 = reg_data[fd]};
		if (REAL(epoll_ctl)(epfd, EPOLL_CTL_MOD, fd, &ev) == 0) {
			u->ep_fd = fd;
			atomic_store(&u->ep_mod, epfd + 1);
		}
	}
	pthread_mutex_unlock(&u->mu);
}

static int uepoll(int epfd, struct epoll_event *evs, int max, int timeout, const sigset_t *mask) {
	sigset_t urg;
	if ((unsigned)epfd >= MAXFD || !atomic_load(&ep_owned[epfd]) || max <= 0)
		return REAL(epoll_pwait)(epfd, evs, max, timeout, no_urg(mask, &urg));
	// The mask is made when the kernel is asked, not before: a call that
	// returns what the engine holds makes no system call at all.
	const sigset_t *kmask = NULL;
	long long dl = timeout < 0 ? -1 : now_ns() + (long long)timeout * 1000000LL;
	for (;;) {
		// The undecided streams this set must look after: a registration
		// for EPOLLOUT held back, the time each is decided without more
		// from its peer.
		long long until = dl;
		int m = atomic_load(&watch_n) > 0 ? atomic_load(&maxfd) : -1;
		for (int fd = 0; fd <= m && fd < MAXFD; fd++) {
			struct usock *u;
			if (atomic_load(&reg_ep[fd]) != epfd + 1 || !(u = undecided_sock(fd)) || !atomic_load(&u->watch)) continue;
			int wr = (reg_ev[fd] & EPOLLOUT) != 0;
			long long d = due(u, wr);
			if (d >= 0 && now_ns() >= d && settle(u, fd, wr ? S_WRITE : S_READ, &d) == 0) continue;
			until = earlier(until, d);
			if (wr && atomic_load(&u->ep_mod) != epfd + 1) ep_hold(u, epfd, fd);
		}
		// What the engine holds first: the kernel no longer shows it.
		int k = 0;
		m = none_held() ? -1 : atomic_load(&maxfd);
		for (int fd = 0; fd <= m && fd < MAXFD && k < max; fd++) {
			long long h;
			struct usock *u;
			if (atomic_load(&reg_ep[fd]) != epfd + 1 || !(reg_ev[fd] & EPOLLIN) || !(u = engine_sock(fd, &h)) || !waiting(u)) continue;
			evs[k].events = EPOLLIN;
			evs[k].data.u64 = reg_data[fd];
			k++;
		}
		if (k > 0) return k; // what the kernel has ready stays queued for the next call
		int left = -1;
		if (until >= 0) {
			long long ns = until - now_ns();
			left = ns <= 0 ? 0 : (int)((ns + 999999) / 1000000);
		}
		if (!kmask) kmask = no_urg(mask, &urg);
		int r = REAL(epoll_pwait)(epfd, evs, max, left, kmask);
		if (r < 0) return r;
		int kept = 0, und = atomic_load(&undecided_n) > 0;
		for (int i = 0; i < r; i++) {
			int fd = und || (evs[i].events & EPOLLIN) ? event_fd(epfd, evs[i].data.u64) : -1;
			struct usock *u = fd >= 0 && und ? undecided_sock(fd) : NULL;
			if (u) {
				int wr = (reg_ev[fd] & EPOLLOUT) != 0, mod = atomic_load(&u->ep_mod) == epfd + 1;
				if (settle(u, fd, wr ? S_WRITE : S_READ, NULL) == 0) {
					if (mod) continue; // the registration put back reports it as it is now
				} else {
					// Part of a Request, or a write's wait: nothing yet.
					evs[i].events &= ~(uint32_t)(EPOLLIN | EPOLLRDNORM | EPOLLOUT | EPOLLWRNORM | EPOLLWRBAND);
					if (!evs[i].events) continue;
				}
			}
			long long h;
			if (fd >= 0 && (evs[i].events & EPOLLIN) && !(evs[i].events & (EPOLLERR | EPOLLHUP)) && engine_sock(fd, &h) && !e_ready(h)) {
				evs[i].events &= ~(uint32_t)(EPOLLIN | EPOLLRDNORM);
				if (!evs[i].events) continue;
			}
			evs[kept++] = evs[i];
		}
		if (kept > 0) return kept;
		if (dl >= 0 && now_ns() >= dl) return 0;
	}
}

EXPORT int epoll_wait(int epfd, struct epoll_event *evs, int max, int timeout) { return uepoll(epfd, evs, max, timeout, NULL); }

EXPORT int epoll_pwait(int epfd, struct epoll_event *evs, int max, int timeout, const sigset_t *mask) {
	return uepoll(epfd, evs, max, timeout, mask);
}

// ---- the interposed data calls -----------------------------------------

EXPORT ssize_t sendto(int fd, const void *buf, size_t len, int flags, const struct sockaddr *to, socklen_t tolen) {
	struct usock *u = enter(fd);
	if (!u) return REAL(sendto)(fd, buf, len, flags, to, tolen);
	struct iovec iov = {(void *)buf, len};
	struct msghdr m = {.msg_name = (void *)to, .msg_namelen = to ? tolen : 0, .msg_iov = &iov, .msg_iovlen = 1};
	ssize_t r = usend(u, fd, &m, flags);
	leave(u);
	return r;
}

EXPORT ssize_t send(int fd, const void *buf, size_t len, int flags) {
	struct usock *u = enter(fd);
	if (!u) return REAL(send)(fd, buf, len, flags);
	struct iovec iov = {(void *)buf, len};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
	ssize_t r = usend(u, fd, &m, flags);
	leave(u);
	return r;
}

EXPORT ssize_t sendmsg(int fd, const struct msghdr *msg, int flags) {
	struct usock *u = enter(fd);
	if (!u) return REAL(sendmsg)(fd, msg, flags);
	ssize_t r = usend(u, fd, msg, flags); // control messages (IP_PKTINFO, …) are not carried
	leave(u);
	return r;
}

EXPORT int sendmmsg(int fd, struct mmsghdr *vec, unsigned vlen, int flags) {
	struct usock *u = enter(fd);
	if (!u) return REAL(sendmmsg)(fd, vec, vlen, flags);
	int n = 0;
	for (unsigned i = 0; i < vlen && i < 1024; i++) {
		ssize_t r = usend(u, fd, &vec[i].msg_hdr, flags);
		if (r < 0) {
			if (n == 0) n = -1;
			break;
		}
		vec[i].msg_len = (unsigned)r;
		n++;
	}
	leave(u);
	return n;
}

EXPORT ssize_t write(int fd, const void *buf, size_t len) {
	struct usock *u = enter(fd);
	if (!u) return REAL(write)(fd, buf, len);
	struct iovec iov = {(void *)buf, len};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
	ssize_t r = usend(u, fd, &m, 0);
	leave(u);
	return r;
}

EXPORT ssize_t writev(int fd, const struct iovec *iov, int n) {
	struct usock *u = enter(fd);
	if (!u) return REAL(writev)(fd, iov, n);
	struct msghdr m = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n};
	ssize_t r = usend(u, fd, &m, 0);
	leave(u);
	return r;
}

EXPORT ssize_t recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *from, socklen_t *fromlen) {
	struct usock *u = enter(fd);
	if (!u) return REAL(recvfrom)(fd, buf, len, flags, from, fromlen);
	struct iovec iov = {buf, len};
	struct msghdr m = {.msg_name = from && fromlen ? from : NULL, .msg_namelen = from && fromlen ? *fromlen : 0,
	                   .msg_iov = &iov, .msg_iovlen = 1};
	ssize_t r = urecv(u, fd, &m, flags);
	if (r >= 0 && from && fromlen) *fromlen = m.msg_namelen;
	leave(u);
	return r;
}

EXPORT ssize_t recv(int fd, void *buf, size_t len, int flags) {
	struct usock *u = enter(fd);
	if (!u) return REAL(recv)(fd, buf, len, flags);
	struct iovec iov = {buf, len};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
	ssize_t r = urecv(u, fd, &m, flags);
	leave(u);
	return r;
}

EXPORT ssize_t recvmsg(int fd, struct msghdr *msg, int flags) {
	struct usock *u = enter(fd);
	if (!u) return REAL(recvmsg)(fd, msg, flags);
	ssize_t r = urecv(u, fd, msg, flags);
	leave(u);
	return r;
}

EXPORT int recvmmsg(int fd, struct mmsghdr *vec, unsigned vlen, int flags, struct timespec *timeout) {
	struct usock *u = enter(fd);
	if (!u) return REAL(recvmmsg)(fd, vec, vlen, flags, timeout);
	// The first datagram as the socket's mode says, the rest only if they
	// are there already (MSG_WAITFORONE's behaviour).
	int n = 0;
	for (unsigned i = 0; i < vlen && i < 1024; i++) {
		ssize_t r = urecv(u, fd, &vec[i].msg_hdr, (flags & ~MSG_WAITFORONE) | (i > 0 ? MSG_DONTWAIT : 0));
		if (r < 0) {
			if (n == 0) n = -1;
			break;
		}
		vec[i].msg_len = (unsigned)r;
		n++;
	}
	leave(u);
	return n;
}

EXPORT ssize_t read(int fd, void *buf, size_t len) {
	struct usock *u = enter(fd);
	if (!u) return REAL(read)(fd, buf, len);
	struct iovec iov = {buf, len};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
	ssize_t r = urecv(u, fd, &m, 0);
	leave(u);
	return r;
}

EXPORT ssize_t readv(int fd, const struct iovec *iov, int n) {
	struct usock *u = enter(fd);
	if (!u) return REAL(readv)(fd, iov, n);
	struct msghdr m = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n};
	ssize_t r = urecv(u, fd, &m, 0);
	leave(u);
	return r;
}

// syscall(2) for the socket calls: libuv (dig's network manager) sends
// and receives batches with syscall(__NR_sendmmsg / __NR_recvmmsg).
EXPORT long syscall(long nr, ...) {
	va_list ap;
	va_start(ap, nr);
	long a[6];
	for (int i = 0; i < 6; i++) a[i] = va_arg(ap, long);
	va_end(ap);
	switch (nr) {
	case SYS_sendmmsg:
		if (lookup((int)a[0])) return sendmmsg((int)a[0], (struct mmsghdr *)a[1], (unsigned)a[2], (int)a[3]);
		break;
	case SYS_recvmmsg:
		if (lookup((int)a[0])) return recvmmsg((int)a[0], (struct mmsghdr *)a[1], (unsigned)a[2], (int)a[3], (struct timespec *)a[4]);
		break;
	case SYS_sendmsg:
		if (lookup((int)a[0])) return sendmsg((int)a[0], (const struct msghdr *)a[1], (int)a[2]);
		break;
	case SYS_recvmsg:
		if (lookup((int)a[0])) return recvmsg((int)a[0], (struct msghdr *)a[1], (int)a[2]);
		break;
	case SYS_sendto:
		if (lookup((int)a[0])) return sendto((int)a[0], (const void *)a[1], (size_t)a[2], (int)a[3], (const struct sockaddr *)a[4], (socklen_t)a[5]);
		break;
	case SYS_recvfrom:
		if (lookup((int)a[0])) return recvfrom((int)a[0], (void *)a[1], (size_t)a[2], (int)a[3], (struct sockaddr *)a[4], (socklen_t *)a[5]);
		break;
	case SYS_close:
		return close((int)a[0]);
	case SYS_close_range:
		return close_range((unsigned)a[0], (unsigned)a[1], (int)a[2]);
	}
	return REAL(syscall)(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
}

// The fortified variants (_FORTIFY_SOURCE builds call these).
extern void __chk_fail(void) __attribute__((noreturn));

EXPORT ssize_t __recvfrom_chk(int fd, void *buf, size_t len, size_t buflen, int flags, struct sockaddr *from, socklen_t *fromlen) {
	if (len > buflen) __chk_fail();
	return recvfrom(fd, buf, len, flags, from, fromlen);
}

EXPORT ssize_t __recv_chk(int fd, void *buf, size_t len, size_t buflen, int flags) {
	if (len > buflen) __chk_fail();
	return recv(fd, buf, len, flags);
}

EXPORT ssize_t __read_chk(int fd, void *buf, size_t len, size_t buflen) {
	if (len > buflen) __chk_fail();
	return read(fd, buf, len);
}
