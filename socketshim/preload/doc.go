// Package preload is udiwarp's LD_PRELOAD library: it runs the UDP
// sockets of unmodified programs (sockperf, dnsmasq, dig, iperf) over
// udiwarp's UD queue pairs. It has no Go API; this package holds its
// sources and tests:
//
//   - c/preload.c builds libudiwarp_preload.so, the only library preloaded.
//     It is plain C: it owns every interposed symbol, the table of owned
//     descriptors, all blocking waits, errno, and the fork policy.
//   - engine/ builds libudiwarp_engine.so with -buildmode=c-shared: the
//     Go data path (qp devices and UD QPs). The C library dlopen()s it
//     (RTLD_LOCAL) on the first AF_INET/AF_INET6 SOCK_DGRAM socket, from
//     UDIWARP_ENGINE or else beside itself.
//
// Build and use (or `make` in this directory):
//
//	gcc -O2 -shared -fPIC -o libudiwarp_preload.so c/preload.c -ldl -lpthread
//	go build -buildmode=c-shared -o libudiwarp_engine.so ./engine
//	LD_PRELOAD=$PWD/libudiwarp_preload.so sockperf server -i 127.0.0.1
//
// Both ends of a flow must be preloaded (or be Go programs using
// socketshim.ListenPacket): the wire is udiwarp's UD frames, not plain
// UDP, and a plain UDP peer's datagrams are dropped as malformed.
//
// # Mapping
//
// Each owned socket becomes one udiwarp device over the program's own
// kernel UDP socket — the address the program bound (or the ephemeral
// port the kernel chose on connect or first send) is the device's — with
// one UD QP, number 1 (socketshim.ShimQPN), so a peer is addressed by
// its UDP address alone, exactly as socketshim.ListenPacket does. A
// datagram the program sends is one UD Send; each completed receive is
// one datagram for recvfrom, with the sender's address. Adoption happens
// at bind, connect, or the first send; a connected socket stays
// connected in the kernel, so it only hears from its peer.
//
// # Descriptors
//
// At socket() the library creates the kernel socket, keeps it under a
// high close-on-exec descriptor (hidden), and puts an eventfd at the
// descriptor number the program gets. The engine makes that eventfd
// readable while datagrams wait and drains it when the program has read
// them all, so poll, ppoll, select and epoll (edge-triggered too) work on
// owned sockets without being interposed; it is always writable.
// Everything the library does not emulate is forwarded to the kernel
// socket: setsockopt/getsockopt (SO_RCVTIMEO and SO_SNDTIMEO are also
// honoured by its waits), getsockname, getpeername, shutdown, and ioctls
// but FIONBIO and FIONREAD. O_NONBLOCK (fcntl, FIONBIO, SOCK_NONBLOCK)
// is tracked per socket; the eventfd itself stays non-blocking. dup,
// dup2, dup3 and F_DUPFD of an owned descriptor make aliases of the same
// socket, which is released when the last one closes.
//
// Interposed: socket, bind, connect, close, close_range, closefrom, dup,
// dup2, dup3, fcntl, fcntl64, ioctl, setsockopt, getsockopt, getsockname,
// getpeername, shutdown, sendto, send, sendmsg, sendmmsg, write, writev,
// recvfrom, recv, recvmsg, recvmmsg, read, readv, __recvfrom_chk,
// __recv_chk, __read_chk, and syscall() for the socket calls (libuv, and
// so dig, sends and receives with syscall(__NR_sendmmsg/__NR_recvmmsg)).
// Any other descriptor goes straight to libc (dlsym(RTLD_NEXT)). Also
// sigaction, signal, bsd_signal, ssignal, sysv_signal and sigset, which add
// SA_ONSTACK (below).
//
// # Waiting, signals and GOMAXPROCS
//
// Every engine call returns at once but for a bounded spin (50 µs by
// default, UDIWARP_PRELOAD_SPIN_NS) on a blocking receive, which catches
// a ping-pong reply without a wake-up. Longer waits are ppoll() on the
// eventfd in C, so program threads never park inside Go. The wait holds
// off SIGURG (the Go runtime's preemption signal is not the program's);
// any other signal ends it with EINTR unless every installed handler has
// SA_RESTART, as the kernel restarts a socket call. Every handler the
// program installs (sigaction, signal and its variants) gets SA_ONSTACK,
// as the Go runtime requires of non-Go handlers: without it a signal
// that arrives while a thread spins in the engine runs the handler on a
// goroutine stack of a few KiB and overruns it. The engine sets
// GOMAXPROCS itself (32 or the CPU count, UDIWARP_PRELOAD_GOMAXPROCS),
// because a c-shared runtime ignores environment changes made after the
// program started, and threads returning from a call would otherwise wait
// for a P when they outnumber the CPUs.
//
// # fork and daemons
//
// A pthread_atfork child handler marks the child: it never calls into Go
// (the runtime's other threads do not exist there). Each owned descriptor
// becomes the kernel socket again (dup3 of hidden onto it), so the child
// goes on over plain UDP with its inherited sockets, blocking as the
// program set it; new sockets in the child are the kernel's. The preload's
// own descriptors and the Go runtime's (its epoll and eventfd, found by
// comparing /proc/self/fd across the engine's start) are protected: a
// daemon closing every descriptor (close over /proc/self/fd, closefrom,
// close_range) closes them as a no-op that reports success, and dup2 onto
// one fails with EBUSY. The engine's own duplicate of each kernel socket
// is protected the same way.
//
// # Counters
//
// With UDIWARP_PRELOAD_STATS=path the engine writes its counters to path
// as JSON — datagrams and bytes the program sent and received through
// udiwarp, and its devices' own frame counters — every 200 ms, when a
// socket closes, and at exit. The tests use them to prove that traffic
// went through the stack.
//
// # Limits
//
// Programs that issue socket system calls without libc (Go programs)
// are not intercepted; setuid programs ignore LD_PRELOAD. Control
// messages are neither sent nor received (recvmsg returns none:
// IP_PKTINFO is not synthesised). recvmmsg waits for its first datagram
// only, as with MSG_WAITFORONE. posix_spawn and vfork children run no
// fork handler; they exec at once, and an owned descriptor without
// close-on-exec reaches the new program as an eventfd. Each owned socket
// posts 128 receives of 64 KiB, so short-lived sockets (a resolver's one
// per query) cost memory while open; a closed socket's bookkeeping (a
// few hundred bytes) is kept so that racing calls never touch freed
// memory.
package preload
