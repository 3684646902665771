package rds

import (
	"bytes"
	"errors"
	"fmt"
	"github.com/udiwarp/udiwarp/internal/parked"
	"net"
	"net/netip"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/qp"
	"github.com/udiwarp/udiwarp/reliability"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// wait bounds every blocking call of the tests.
const wait = 5 * time.Second

func open(t *testing.T, network, addr string, o *Options) *Socket {
	t.Helper()
	if o == nil {
		o = &Options{}
	}
	if o.MaxMessage == 0 {
		o.MaxMessage = 2048 // small slots: the tests open many sockets
	}
	s, err := Listen(network, addr, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func pair(t *testing.T, co, so *Options) (client, server *Socket) {
	return open(t, "udp4", "127.0.0.1:0", co), open(t, "udp4", "127.0.0.1:0", so)
}

// recv returns the next message or notification within wait.
func recv(t *testing.T, s *Socket) (string, netip.AddrPort, []Control) {
	t.Helper()
	s.SetReadDeadline(time.Now().Add(wait))
	b := make([]byte, 4096)
	n, from, ctrl, err := s.RecvMsg(b)
	if err != nil {
		t.Fatalf("RecvMsg: %v", err)
	}
	return string(b[:n]), from, ctrl
}

// recvMsg expects a message with no notification.
func recvMsg(t *testing.T, s *Socket, want string) (netip.AddrPort, []Control) {
	t.Helper()
	got, from, ctrl := recv(t, s)
	for _, c := range ctrl {
		if _, ok := c.(StatusControl); ok {
			t.Fatalf("got notification %+v, want message %q", c, want)
		}
	}
	if got != want {
		t.Fatalf("message %q, want %q", got, want)
	}
	return from, ctrl
}

// notes expects notifications only, and returns them.
func notes(t *testing.T, s *Socket) []StatusControl {
	t.Helper()
	got, from, ctrl := recv(t, s)
	if got != "" || from.IsValid() || len(ctrl) == 0 {
		t.Fatalf("got message %q from %v with %v, want notifications", got, from, ctrl)
	}
	var out []StatusControl
	for _, c := range ctrl {
		sc, ok := c.(StatusControl)
		if !ok {
			t.Fatalf("control %T with notifications", c)
		}
		out = append(out, sc)
	}
	return out
}

// note expects exactly one notification.
func note(t *testing.T, s *Socket, token uint32, st Status, peer netip.AddrPort) {
	t.Helper()
	ns := notes(t, s)
	want := StatusControl{Token: token, Status: st, Peer: peer}
	if len(ns) != 1 || ns[0] != want {
		t.Fatalf("notifications %+v, want [%+v]", ns, want)
	}
}

// nothingQueued expects no message or notification waiting for s now
// (RecvMsg under a deadline passed already returns what is queued, or
// the timeout). The caller waited for the state in which what must not
// be there would be: ended, or BadMessages counted.
func nothingQueued(t *testing.T, s *Socket) {
	t.Helper()
	s.SetReadDeadline(time.Now().Add(-time.Second))
	b := make([]byte, 4096)
	n, from, ctrl, err := s.RecvMsg(b)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("got %q from %v with %+v (err %v), want nothing", b[:n], from, ctrl, err)
	}
}

// ended waits until s has ended ops RDMA operations in all (Stats): an
// operation's notification, if it makes one, is queued as it ends.
func ended(t *testing.T, s *Socket, ops uint64) {
	t.Helper()
	for end := time.Now().Add(wait); s.Stats().Operations < ops; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%d operations ended, want %d", s.Stats().Operations, ops)
		}
	}
}

// marker sends a message from from to to and expects it to be the next
// thing to reads: RD delivers one peer's messages in the order they
// were posted, and RecvMsg returns queued notifications first, so no
// message from posted before it (an ACK that must not come: posted, if
// at all, by the time its operation ended, which the caller saw) and no
// notification is waiting ahead of it.
func marker(t *testing.T, from, to *Socket) {
	t.Helper()
	if _, err := from.SendMsg([]byte("marker"), to.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	if src, ctrl := recvMsg(t, to, "marker"); src != from.LocalAddr() || len(ctrl) != 0 {
		t.Fatalf("the marker from %v with %+v, want from %v without controls", src, ctrl, from.LocalAddr())
	}
}

// mapRequest sends an RDMA request for buf (MapControl) and returns the
// cookie, checked on the server's side.
func mapRequest(t *testing.T, client, server *Socket, buf []byte, flags MapFlags) Cookie {
	t.Helper()
	var c Cookie
	if _, err := client.SendMsg([]byte("req"), server.LocalAddr(), MapControl{Buf: buf, Flags: flags, Cookie: &c}); err != nil {
		t.Fatal(err)
	}
	if c == 0 {
		t.Fatal("no cookie stored")
	}
	from, ctrl := recvMsg(t, server, "req")
	if from != client.LocalAddr() || len(ctrl) != 1 || ctrl[0] != (DestControl{Cookie: c}) {
		t.Fatalf("request from %v with %+v, want %v with dest %v", from, ctrl, client.LocalAddr(), c)
	}
	return c
}

// dest sends a request with a cookie the client has (DestControl).
func dest(t *testing.T, client, server *Socket, c Cookie) {
	t.Helper()
	if _, err := client.SendMsg([]byte("dest"), server.LocalAddr(), DestControl{Cookie: c}); err != nil {
		t.Fatal(err)
	}
	if _, ctrl := recvMsg(t, server, "dest"); len(ctrl) != 1 || ctrl[0] != (DestControl{Cookie: c}) {
		t.Fatalf("dest controls %+v", ctrl)
	}
}

// write has the server write data into the client's cookie at off.
func write(t *testing.T, server, client *Socket, msg string, c Cookie, off uint64, flags ArgsFlags, token uint32, data ...[]byte) {
	t.Helper()
	n := 0
	for _, d := range data {
		n += len(d)
	}
	if _, err := server.SendMsg([]byte(msg), client.LocalAddr(), ArgsControl{Cookie: c, Remote: Range{off, uint64(n)},
		Local: data, Flags: ReadWrite | flags, Token: token}); err != nil {
		t.Fatal(err)
	}
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) + seed
	}
	return b
}

// The man page's exchange, as a Write, over IPv4 and IPv6: the client
// maps with UseOnce, the server writes with the ACK, the client sees the
// data with the ACK, the server is notified; the cookie then fails a
// second use, and the client gets nothing for it.
func TestWriteUseOnce(t *testing.T) {
	for _, nw := range []struct{ network, addr string }{{"udp4", "127.0.0.1:0"}, {"udp6", "[::1]:0"}} {
		t.Run(nw.network, func(t *testing.T) {
			client, server := open(t, nw.network, nw.addr, nil), open(t, nw.network, nw.addr, nil)
			buf := make([]byte, 8192)
			c := mapRequest(t, client, server, buf, UseOnce)
			if c.STag() == 0 || c.Offset() != 0 {
				t.Fatalf("cookie %v", c)
			}
			a, b := pattern(3000, 1), pattern(1000, 2)
			write(t, server, client, "ack", c, 100, NotifyMe, 7, a, b)
			recvMsg(t, client, "ack")
			if !bytes.Equal(buf[100:3100], a) || !bytes.Equal(buf[3100:4100], b) || slices.ContainsFunc(buf[:100], func(x byte) bool { return x != 0 }) {
				t.Fatal("the client's buffer does not hold the data at the ACK")
			}
			note(t, server, 7, StatusSuccess, client.LocalAddr())
			if st := client.Stats(); st.Mappings != 0 || st.Released != 1 {
				t.Fatalf("client after the ACK of a UseOnce cookie: %+v, want it released", st)
			}
			if st := server.Stats(); st.Operations != 1 || st.Succeeded != 1 || st.RDMABytes != 4000 || st.PeerCookies != 1 {
				t.Fatalf("server stats %+v", st)
			}
			// The second use fails, and the client gets nothing; its next
			// message from the server is the one sent after.
			write(t, server, client, "second", c, 0, NotifyMe, 8, make([]byte, 10))
			note(t, server, 8, StatusRemoteError, client.LocalAddr())
			if _, err := server.SendMsg([]byte("after"), client.LocalAddr()); err != nil {
				t.Fatal(err)
			}
			recvMsg(t, client, "after")
			// The cookie is gone at the client too.
			if err := client.FreeMR(c, 0); !errors.Is(err, ErrBadCookie) || !errors.Is(err, syscall.EINVAL) {
				t.Fatalf("FreeMR of a used UseOnce cookie: %v", err)
			}
			if _, err := client.SendMsg(nil, server.LocalAddr(), DestControl{Cookie: c}); !errors.Is(err, ErrBadCookie) {
				t.Fatalf("DEST of a used UseOnce cookie: %v", err)
			}
		})
	}
}

// An RDMA Read (no ReadWrite) into three local buffers, from an offset;
// GetMR and DEST instead of MAP; Fence is accepted.
func TestRead(t *testing.T) {
	client, server := pair(t, nil, nil)
	buf := pattern(10000, 3)
	c, err := client.GetMR(buf, 0)
	if err != nil {
		t.Fatal(err)
	}
	dest(t, client, server, c)
	l := [][]byte{make([]byte, 1000), nil, make([]byte, 5), make([]byte, 4000)}
	if _, err := server.SendMsg([]byte("read done"), client.LocalAddr(), ArgsControl{Cookie: c, Remote: Range{500, 5005},
		Local: l, Flags: Fence | NotifyMe, Token: 1}); err != nil {
		t.Fatal(err)
	}
	recvMsg(t, client, "read done")
	note(t, server, 1, StatusSuccess, client.LocalAddr())
	if got := slices.Concat(l...); !bytes.Equal(got, buf[500:5505]) {
		t.Fatal("the server's buffers do not hold the client's bytes")
	}
	// Not UseOnce: it can be read again, then freed.
	l2 := make([]byte, 10)
	if _, err := server.SendMsg([]byte("again"), client.LocalAddr(), ArgsControl{Cookie: c, Remote: Range{0, 10}, Local: [][]byte{l2}, Flags: NotifyMe, Token: 2}); err != nil {
		t.Fatal(err)
	}
	recvMsg(t, client, "again")
	note(t, server, 2, StatusSuccess, client.LocalAddr())
	if !bytes.Equal(l2, buf[:10]) {
		t.Fatal("second read")
	}
	if err := client.FreeMR(c, Invalidate); err != nil {
		t.Fatal(err)
	}
	if st := client.Stats(); st.Mappings != 0 || st.Released != 0 || st.Invalidated != 1 {
		t.Fatalf("client stats %+v", st)
	}
}

// A transfer of the largest size each way; one byte more is EINVAL.
func TestLargestTransfer(t *testing.T) {
	const max = 1 << 20
	client, server := pair(t, nil, nil)
	buf := make([]byte, max)
	c := mapRequest(t, client, server, buf, 0)
	data := pattern(max, 9)
	write(t, server, client, "w", c, 0, NotifyMe, 1, data[:max/2], data[max/2:])
	recvMsg(t, client, "w")
	note(t, server, 1, StatusSuccess, client.LocalAddr())
	if !bytes.Equal(buf, data) {
		t.Fatal("1 MiB write")
	}
	copy(buf, pattern(max, 4))
	back := make([]byte, max)
	if _, err := server.SendMsg([]byte("r"), client.LocalAddr(), ArgsControl{Cookie: c, Remote: Range{0, max}, Local: [][]byte{back}, Flags: NotifyMe, Token: 2}); err != nil {
		t.Fatal(err)
	}
	recvMsg(t, client, "r")
	note(t, server, 2, StatusSuccess, client.LocalAddr())
	if !bytes.Equal(back, buf) {
		t.Fatal("1 MiB read")
	}
	if _, err := client.GetMR(make([]byte, max+1), 0); !errors.Is(err, ErrTooLarge) || !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("GetMR of MaxTransfer+1: %v", err)
	}
	if _, err := server.SendMsg(nil, client.LocalAddr(), ArgsControl{Cookie: c, Remote: Range{0, max + 1}, Local: [][]byte{make([]byte, max+1)}}); !errors.Is(err, ErrTooLarge) || !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("ARGS of MaxTransfer+1: %v", err)
	}
	if _, err := client.SendMsg(nil, server.LocalAddr(), MapControl{Buf: make([]byte, max+1)}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("MAP of MaxTransfer+1: %v", err)
	}
	// A smaller configured limit applies.
	small := open(t, "udp4", "127.0.0.1:0", &Options{MaxTransfer: 4096})
	if _, err := small.GetMR(make([]byte, 4097), 0); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("GetMR over a 4096-byte limit: %v", err)
	}
	if _, err := small.GetMR(make([]byte, 4096), 0); err != nil {
		t.Fatal(err)
	}
}

// FreeMR without Invalidate leaves the mapping usable until the released
// mappings are invalidated; with Invalidate (on FreeMR, or on the
// mapping) it is unusable at once, and an RDMA to it fails with
// REMOTE_ERROR over the wire and no ACK.
func TestInvalidate(t *testing.T) {
	client, server := pair(t, nil, nil)
	peer := client.LocalAddr()
	buf := make([]byte, 100)

	c := mapRequest(t, client, server, buf, 0)
	if err := client.FreeMR(c, 0); err != nil {
		t.Fatal(err)
	}
	if st := client.Stats(); st.Mappings != 0 || st.Released != 1 {
		t.Fatalf("after a lazy FreeMR: %+v", st)
	}
	write(t, server, client, "lazy", c, 0, NotifyMe, 1, []byte("x"))
	recvMsg(t, client, "lazy") // documented: valid until invalidated
	note(t, server, 1, StatusSuccess, peer)
	if err := client.FreeMR(0, Invalidate); err != nil {
		t.Fatal(err)
	}
	if st := client.Stats(); st.Released != 0 || st.Invalidated != 1 {
		t.Fatalf("after FreeMR(0, Invalidate): %+v", st)
	}
	write(t, server, client, "flushed", c, 0, NotifyMe, 2, []byte("y"))
	note(t, server, 2, StatusRemoteError, peer)
	marker(t, server, client)
	if buf[0] != 'x' {
		t.Fatal("an invalidated mapping was written")
	}

	c = mapRequest(t, client, server, buf, 0)
	if err := client.FreeMR(c, Invalidate); err != nil {
		t.Fatal(err)
	}
	write(t, server, client, "freed", c, 0, NotifyMe, 3, []byte("z"))
	note(t, server, 3, StatusRemoteError, peer)
	marker(t, server, client)

	// UseOnce|Invalidate: the ACK from one server invalidates it at once,
	// so a second server that knows the cookie is refused by the client.
	other := open(t, "udp4", "127.0.0.1:0", nil)
	c = mapRequest(t, client, server, buf, UseOnce|Invalidate)
	dest(t, client, other, c)
	write(t, server, client, "first", c, 0, NotifyMe, 4, []byte("1"))
	recvMsg(t, client, "first")
	note(t, server, 4, StatusSuccess, peer)
	if st := client.Stats(); st.Mappings != 0 || st.Released != 0 || st.Invalidated != 3 {
		t.Fatalf("after the ACK of a UseOnce|Invalidate cookie: %+v", st)
	}
	write(t, other, client, "from other", c, 0, NotifyMe, 5, []byte("2"))
	note(t, other, 5, StatusRemoteError, peer)
	marker(t, other, client)
	if buf[0] != '1' {
		t.Fatal("an invalidated mapping was written")
	}

	// A released mapping is invalidated once LazyFlush of them gather.
	lazy := open(t, "udp4", "127.0.0.1:0", &Options{LazyFlush: 2})
	c1, _ := lazy.GetMR(buf, 0)
	c2, _ := lazy.GetMR(buf, 0)
	lazy.FreeMR(c1, 0)
	if st := lazy.Stats(); st.Released != 1 {
		t.Fatalf("%+v", st)
	}
	lazy.FreeMR(c2, 0)
	if st := lazy.Stats(); st.Released != 0 || st.Invalidated != 2 {
		t.Fatalf("after LazyFlush releases: %+v", st)
	}
}

// A window past the client's region, or a cookie the server never got,
// fails with REMOTE_ERROR and no ACK; the mapping stays usable.
func TestRemoteErrors(t *testing.T) {
	client, server := pair(t, nil, nil)
	peer := client.LocalAddr()
	buf := make([]byte, 1000)
	c := mapRequest(t, client, server, buf, 0)
	write(t, server, client, "past the end", c, 990, NotifyMe, 1, make([]byte, 11))
	note(t, server, 1, StatusRemoteError, peer)
	if _, err := server.SendMsg(nil, peer, ArgsControl{Cookie: c, Remote: Range{2000, 1}, Local: [][]byte{{0}}, Flags: NotifyMe, Token: 2}); err != nil {
		t.Fatal(err)
	}
	note(t, server, 2, StatusRemoteError, peer)
	write(t, server, client, "forged", c^0x1, 0, NotifyMe, 3, []byte("a")) // a key the server never learned
	note(t, server, 3, StatusRemoteError, peer)
	write(t, server, client, "unknown", makeCookie(0x12345678, 0), 0, NotifyMe, 4, []byte("a"))
	note(t, server, 4, StatusRemoteError, peer)
	marker(t, server, client)
	// The region rejected the tagged segments itself.
	if st := client.Device().Stats(); st.RxBounds.Load() == 0 {
		t.Fatal("the client's device counted no bounds fault")
	}
	write(t, server, client, "fits", c, 989, NotifyMe, 5, make([]byte, 11))
	recvMsg(t, client, "fits")
	note(t, server, 5, StatusSuccess, peer)
}

// RECVERR against NOTIFY_ME: which operations notify, and never twice.
func TestNotifyAndRecvErr(t *testing.T) {
	client, server := pair(t, nil, nil)
	peer := client.LocalAddr()
	buf := make([]byte, 100)
	c := mapRequest(t, client, server, buf, 0)
	ok := func(flags ArgsFlags, token uint32, msg string) {
		t.Helper()
		write(t, server, client, msg, c, 0, flags, token, []byte("ok"))
		recvMsg(t, client, msg)
	}
	bad := func(flags ArgsFlags, token uint32) {
		t.Helper()
		write(t, server, client, "bad", c, 99, flags, token, []byte("no"))
	}
	if server.RecvErr() {
		t.Fatal("RECVERR on by default")
	}
	// Off, no NotifyMe: nothing, success or failure.
	ok(0, 1, "ok1")
	bad(0, 2)
	ended(t, server, 2)
	nothingQueued(t, server)
	// On: failures notify without NotifyMe; successes do not.
	server.SetRecvErr(true)
	if !server.RecvErr() {
		t.Fatal("RECVERR not on")
	}
	ok(0, 3, "ok3")
	bad(0, 4)
	note(t, server, 4, StatusRemoteError, peer)
	// NotifyMe and RECVERR: one notification, not two.
	bad(NotifyMe, 5)
	note(t, server, 5, StatusRemoteError, peer)
	ok(NotifyMe, 6, "ok6")
	note(t, server, 6, StatusSuccess, peer)
	ended(t, server, 6)
	nothingQueued(t, server)
	// Off again, NotifyMe alone: both outcomes notify.
	server.SetRecvErr(false)
	bad(NotifyMe, 7)
	note(t, server, 7, StatusRemoteError, peer)
	ok(NotifyMe, 8, "ok8")
	note(t, server, 8, StatusSuccess, peer)
	ended(t, server, 8)
	nothingQueued(t, server)
	marker(t, server, client)
	// Several queued notifications come in one RecvMsg, in order.
	for i := range uint32(3) {
		bad(NotifyMe, 10+i)
	}
	deadline := time.Now().Add(wait)
	for server.Stats().Notifications < 8 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if ns := notes(t, server); len(ns) != 3 || ns[0].Token != 10 || ns[2].Token != 12 {
		t.Fatalf("queued notifications %+v", ns)
	}
}

// Messages to one peer keep their order around an ACK that waits for its
// RDMA; an ACK may itself carry an RDMA request (a MAP) back.
func TestOrderAndArgsWithMap(t *testing.T) {
	client, server := pair(t, nil, nil)
	buf := make([]byte, 64<<10)
	c := mapRequest(t, client, server, buf, 0)
	if _, err := server.SendMsg([]byte("m1"), client.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	data := pattern(len(buf), 5)
	back := make([]byte, 16)
	var sc Cookie
	if _, err := server.SendMsg([]byte("m2"), client.LocalAddr(), ArgsControl{Cookie: c, Remote: Range{0, uint64(len(buf))}, Local: [][]byte{data}, Flags: ReadWrite},
		MapControl{Buf: back, Cookie: &sc}); err != nil {
		t.Fatal(err)
	}
	if _, err := server.SendMsg([]byte("m3"), client.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	recvMsg(t, client, "m1")
	if _, ctrl := recvMsg(t, client, "m2"); len(ctrl) != 1 || ctrl[0] != (DestControl{Cookie: sc}) {
		t.Fatalf("m2 controls %+v, want the server's cookie %v", ctrl, sc)
	}
	if !bytes.Equal(buf, data) {
		t.Fatal("m2 arrived before its data")
	}
	recvMsg(t, client, "m3")
	// The roles turn: the client writes into the server's buffer.
	write(t, client, server, "back", sc, 0, NotifyMe, 9, []byte("0123456789abcdef"))
	recvMsg(t, server, "back")
	note(t, client, 9, StatusSuccess, server.LocalAddr())
	if string(back) != "0123456789abcdef" {
		t.Fatalf("server buffer %q", back)
	}
}

// Every error of the man page, and bad input, synchronously.
func TestErrors(t *testing.T) {
	client, server := pair(t, &Options{MaxMappings: 3}, nil)
	to := server.LocalAddr()
	buf := make([]byte, 64)
	c, err := client.GetMR(buf, 0)
	if err != nil {
		t.Fatal(err)
	}
	is := func(err error, sentinel *Error, errno syscall.Errno) {
		t.Helper()
		if !errors.Is(err, sentinel) || !errors.Is(err, errno) {
			t.Fatalf("error %v, want %v (%v)", err, sentinel, errno)
		}
	}
	var ce *Error
	// EINVAL: conflicting controls.
	for _, ctrl := range [][]Control{
		{MapControl{Buf: buf}, MapControl{Buf: buf}},
		{MapControl{Buf: buf}, DestControl{Cookie: c}},
		{DestControl{Cookie: c}, &MapControl{Buf: buf}},
		{DestControl{Cookie: c}, DestControl{Cookie: c}},
		{ArgsControl{Cookie: c, Remote: Range{0, 1}, Local: [][]byte{{0}}}, &ArgsControl{Cookie: c, Remote: Range{0, 1}, Local: [][]byte{{0}}}},
	} {
		_, err := client.SendMsg([]byte("x"), to, ctrl...)
		is(err, ErrConflict, syscall.EINVAL)
		if !errors.As(err, &ce) || ce.Errno != syscall.EINVAL {
			t.Fatalf("errors.As: %v", err)
		}
	}
	// EINVAL: sizes.
	_, err = client.SendMsg(nil, to, ArgsControl{Cookie: c, Remote: Range{0, 10}, Local: [][]byte{make([]byte, 9)}})
	is(err, ErrSizeMismatch, syscall.EINVAL)
	_, err = client.SendMsg(nil, to, ArgsControl{Cookie: c, Remote: Range{0, 10}, Local: [][]byte{make([]byte, 6), make([]byte, 6)}})
	is(err, ErrSizeMismatch, syscall.EINVAL)
	_, err = client.SendMsg(nil, to, ArgsControl{Cookie: c, Remote: Range{0, 2 << 20}, Local: [][]byte{make([]byte, 2<<20)}})
	is(err, ErrTooLarge, syscall.EINVAL)
	_, err = client.GetMR(make([]byte, 2<<20), 0)
	is(err, ErrTooLarge, syscall.EINVAL)
	// EINVAL: bad input.
	many := make([][]byte, MaxLocalVecs+1)
	for i := range many {
		many[i] = []byte{1}
	}
	for _, a := range []ArgsControl{
		{Remote: Range{0, 1}, Local: [][]byte{{0}}}, // zero cookie
		{Cookie: c}, // zero length
		{Cookie: c, Remote: Range{0, 1}, Local: [][]byte{{0}}, Flags: 0x100},              // unknown flag
		{Cookie: c, Remote: Range{^uint64(0), 1}, Local: [][]byte{{0}}},                   // wraps
		{Cookie: c, Remote: Range{0, uint64(len(many))}, Local: many},                     // too many buffers
		{Cookie: c, Remote: Range{0, 1}, Local: [][]byte{{0}}, Flags: ArgsFlags(UseOnce)}, // a map flag
	} {
		_, err := client.SendMsg(nil, to, a)
		if !errors.Is(err, syscall.EINVAL) {
			t.Fatalf("args %+v: %v", a, err)
		}
	}
	_, err = client.SendMsg(nil, to, StatusControl{})
	is(err, ErrInvalid, syscall.EINVAL)
	_, err = client.SendMsg(nil, to, (*MapControl)(nil))
	is(err, ErrInvalid, syscall.EINVAL)
	_, err = client.SendMsg(nil, to, DestControl{Cookie: c + 1<<32})
	is(err, ErrBadCookie, syscall.EINVAL)
	_, err = client.GetMR(nil, 0)
	is(err, ErrInvalid, syscall.EINVAL)
	_, err = client.GetMR(buf, readWriteAsMap())
	is(err, ErrInvalid, syscall.EINVAL)
	is(client.FreeMR(c+1<<32, 0), ErrBadCookie, syscall.EINVAL)
	is(client.FreeMR(0, 0), ErrBadCookie, syscall.EINVAL)
	is(client.FreeMR(c, UseOnce), ErrInvalid, syscall.EINVAL)
	for _, bad := range []netip.AddrPort{{}, netip.MustParseAddrPort("127.0.0.1:0"), netip.MustParseAddrPort("[::1]:5"), netip.MustParseAddrPort("0.0.0.0:5"), netip.MustParseAddrPort("224.0.0.1:5")} {
		_, err := client.SendMsg(nil, bad)
		is(err, ErrInvalid, syscall.EINVAL)
	}
	_, err = client.SendMsg(make([]byte, client.MaxMessage()+1), to)
	is(err, ErrMessageTooLong, syscall.EMSGSIZE)
	if _, err := client.SendMsg(make([]byte, client.MaxMessage()), to); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := recv(t, server); len(n) != 2048 {
		t.Fatalf("largest message: %d bytes", len(n))
	}

	// EAGAIN: the mapping limit (3), for GET_MR and MAP; a MAP that fails
	// sends nothing. A released mapping makes room.
	if _, err := client.GetMR(buf, 0); err != nil {
		t.Fatal(err)
	}
	c3, err := client.GetMR(buf, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.GetMR(buf, 0)
	is(err, ErrMappingLimit, syscall.EAGAIN)
	_, err = client.SendMsg([]byte("never"), to, MapControl{Buf: buf})
	is(err, ErrMappingLimit, syscall.EAGAIN)
	marker(t, client, server)
	if err := client.FreeMR(c3, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := client.GetMR(buf, 0); err != nil {
		t.Fatalf("a mapping after a release: %v", err)
	}
	if st := client.Stats(); st.Mappings != 3 || st.Released != 0 {
		t.Fatalf("stats %+v", st)
	}

	// EBUSY: the device cannot register more memory (the socket's own
	// receive and send buffers take two of its four regions).
	busy := open(t, "udp4", "127.0.0.1:0", &Options{Device: qp.DeviceConfig{MaxMR: 4}})
	for range 2 {
		if _, err := busy.GetMR(buf, 0); err != nil {
			t.Fatal(err)
		}
	}
	_, err = busy.GetMR(buf, 0)
	is(err, ErrNoMapping, syscall.EBUSY)
	dest(t, client, busy, c)
	_, err = busy.SendMsg(nil, client.LocalAddr(), ArgsControl{Cookie: c, Remote: Range{0, 1}, Local: [][]byte{{0}}})
	is(err, ErrNoMapping, syscall.EBUSY)

	// Options and networks.
	if _, err := Listen("tcp", "127.0.0.1:0", nil); err == nil {
		t.Fatal("tcp accepted")
	}
	if _, err := Listen("udp4", "127.0.0.1:0", &Options{Device: qp.DeviceConfig{Poll: qp.PollBusy}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("busy polling: %v", err)
	}
}

// readWriteAsMap is an args flag passed where map flags are expected.
func readWriteAsMap() MapFlags { return MapFlags(ReadWrite) }

// The notification queue is bounded: an operation that could not queue
// its notification is refused with ENOBUFS until the queue is read.
func TestNotificationQueueBound(t *testing.T) {
	client, server := pair(t, nil, &Options{MaxNotifications: 2})
	peer := client.LocalAddr()
	unknown := makeCookie(0xabcdef00, 0)
	args := ArgsControl{Cookie: unknown, Remote: Range{0, 1}, Local: [][]byte{{0}}, Flags: NotifyMe}
	for i := range 2 {
		args.Token = uint32(i)
		if _, err := server.SendMsg(nil, peer, args); err != nil {
			t.Fatal(err)
		}
	}
	args.Token = 2
	if _, err := server.SendMsg(nil, peer, args); !errors.Is(err, ErrNoBufs) || !errors.Is(err, syscall.ENOBUFS) {
		t.Fatalf("a third notifying operation: %v", err)
	}
	// Without NotifyMe nor RECVERR no room is needed.
	if _, err := server.SendMsg(nil, peer, ArgsControl{Cookie: unknown, Remote: Range{0, 1}, Local: [][]byte{{0}}}); err != nil {
		t.Fatal(err)
	}
	// With RECVERR on, any operation may need room.
	server.SetRecvErr(true)
	if _, err := server.SendMsg(nil, peer, ArgsControl{Cookie: unknown, Remote: Range{0, 1}, Local: [][]byte{{0}}}); !errors.Is(err, ErrNoBufs) {
		t.Fatalf("with RECVERR and a full queue: %v", err)
	}
	if ns := notes(t, server); len(ns) != 2 || ns[0].Token != 0 || ns[1].Token != 1 || ns[1].Status != StatusRemoteError {
		t.Fatalf("notifications %+v", ns)
	}
	if _, err := server.SendMsg(nil, peer, args); err != nil {
		t.Fatal(err)
	}
	note(t, server, 2, StatusRemoteError, peer)
}

// slow gives a socket a device whose datagrams take d to leave, so an
// RDMA stays in flight that long.
func slow(d time.Duration) *Options {
	return &Options{Device: qp.DeviceConfig{Impair: &qp.Impairment{Delay: d}}}
}

// FREE_MR with Invalidate while the server's RDMA is in flight returns at
// once; the RDMA then fails with REMOTE_ERROR, and no ACK arrives.
func TestFreeMRWhileInUse(t *testing.T) {
	client, server := pair(t, nil, slow(200*time.Millisecond))
	buf := make([]byte, 4096)
	c := mapRequest(t, client, server, buf, 0)
	write(t, server, client, "ack", c, 0, NotifyMe, 1, pattern(4096, 1))
	if err := client.FreeMR(c, Invalidate); err != nil {
		t.Fatal(err)
	}
	// "At once": FreeMR returned before the RDMA's outcome could reach the
	// server (the link delays every datagram 200 ms), whatever the
	// machine's load: no notification is there yet. (A bound of 100 ms
	// on FreeMR's own time failed under -race on a loaded machine.)
	server.SetReadDeadline(time.Now().Add(time.Millisecond))
	if n, _, ctrl, err := server.RecvMsg(make([]byte, 64)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the RDMA's outcome was in before FreeMR returned (%d bytes, %+v, %v): FreeMR waited for it", n, ctrl, err)
	}
	note(t, server, 1, StatusRemoteError, client.LocalAddr())
	marker(t, server, client)
	if !bytes.Equal(buf, make([]byte, 4096)) {
		t.Fatal("the buffer was written after FreeMR returned")
	}
}

// A client that vanished: the server's operation ends DROPPED (its RD
// layer gave up on the peer), with RECVERR alone too, and no ACK is left
// over.
func TestPeerVanished(t *testing.T) {
	fast := &Options{RD: qp.RDConfig{Config: reliability.Config{InitialRTT: 2 * time.Millisecond, MaxRTO: 20 * time.Millisecond, MaxRetries: 3}}}
	client, server := pair(t, nil, fast)
	peer := client.LocalAddr()
	c := mapRequest(t, client, server, make([]byte, 4096), 0)
	client.Close()
	write(t, server, client, "ack", c, 0, NotifyMe, 1, make([]byte, 4096))
	note(t, server, 1, StatusDropped, peer)
	server.SetRecvErr(true)
	write(t, server, client, "ack", c, 0, 0, 2, make([]byte, 10))
	note(t, server, 2, StatusDropped, peer)
	if st := server.Stats(); st.Operations != 2 || st.Succeeded != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// Cancel: operations whose ACK has not left end CANCELED once their RDMA
// completed, and their ACKs never arrive; later messages still do.
func TestCancel(t *testing.T) {
	client, server := pair(t, nil, slow(150*time.Millisecond))
	peer := client.LocalAddr()
	buf := make([]byte, 100)
	c := mapRequest(t, client, server, buf, 0)
	if n := server.Cancel(peer); n != 0 {
		t.Fatalf("canceled %d with nothing pending", n)
	}
	write(t, server, client, "ack1", c, 0, NotifyMe, 1, []byte("a"))
	write(t, server, client, "ack2", c, 1, NotifyMe, 2, []byte("b"))
	if n := server.Cancel(netip.AddrPort{}); n != 2 {
		t.Fatalf("canceled %d, want 2", n)
	}
	if _, err := server.SendMsg([]byte("after"), peer); err != nil {
		t.Fatal(err)
	}
	got := notes(t, server)
	if len(got) == 1 {
		got = append(got, notes(t, server)...)
	}
	want := []StatusControl{{1, StatusCanceled, peer}, {2, StatusCanceled, peer}}
	if !slices.Equal(got, want) {
		t.Fatalf("notifications %+v, want %+v", got, want)
	}
	recvMsg(t, client, "after")
	marker(t, server, client)
}

// Close with an operation in flight: it returns at once, the ACK never
// arrives, and (TestMain) no goroutine is left.
func TestCloseCancels(t *testing.T) {
	client, server := pair(t, nil, slow(150*time.Millisecond))
	c := mapRequest(t, client, server, make([]byte, 100), 0)
	write(t, server, client, "ack", c, 0, NotifyMe, 1, []byte("a"))
	start := time.Now()
	if err := server.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Close took %v", d)
	}
	// The ACK never arrives: it never left. The server's device is
	// closed, its counters final, and the one Data frame it sent (its
	// retransmissions aside) is the RDMA Write's.
	if st := server.Device().Stats(); st.RDDataSent.Load()-st.RDRetransmits.Load() != 1 {
		t.Fatalf("the server sent %d Data frames (%d of them again), want the RDMA Write's alone", st.RDDataSent.Load(), st.RDRetransmits.Load())
	}
	var oe *net.OpError
	if err := server.Close(); !errors.As(err, &oe) || !errors.Is(err, net.ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
}

// Deadlines and Close unblock RecvMsg; a full send side waits for a slot
// until the write deadline.
func TestDeadlinesAndClose(t *testing.T) {
	s := open(t, "udp4", "127.0.0.1:0", &Options{SendSlots: 1})
	b := make([]byte, 10)
	// A deadline in the past interrupts a blocked RecvMsg at once.
	done := make(chan error, 1)
	go func() {
		_, _, _, err := s.RecvMsg(b)
		done <- err
	}()
	parked.Wait(t, "(*Socket).RecvMsg") // the read is blocked: what follows is tested on it
	s.SetReadDeadline(time.Now().Add(-time.Second))
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("RecvMsg: %v", err)
		}
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("not a timeout: %v", err)
		}
	case <-time.After(wait):
		t.Fatal("a past deadline did not interrupt RecvMsg")
	}
	s.SetReadDeadline(time.Time{})
	// A silent peer holds the one send slot; the next SendMsg waits for
	// it until the write deadline.
	hole, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer hole.Close()
	to := hole.LocalAddr().(*net.UDPAddr).AddrPort()
	if _, err := s.SendMsg([]byte("1"), to); err != nil {
		t.Fatal(err)
	}
	s.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := s.SendMsg([]byte("2"), to); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("SendMsg with no slot: %v", err)
	}
	s.SetWriteDeadline(time.Time{})
	// Close unblocks a waiting RecvMsg and SendMsg.
	go func() {
		_, _, _, err := s.RecvMsg(b)
		done <- err
	}()
	sent := make(chan error, 1)
	go func() {
		_, err := s.SendMsg([]byte("3"), to)
		sent <- err
	}()
	parked.Wait(t, "(*Socket).SendMsg") // blocked: Close is tested on it
	s.Close()
	for _, ch := range []chan error{done, sent} {
		select {
		case err := <-ch:
			if !errors.Is(err, net.ErrClosed) {
				t.Fatalf("after Close: %v", err)
			}
		case <-time.After(wait):
			t.Fatal("Close did not unblock")
		}
	}
	if _, err := s.SendMsg(nil, to); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("SendMsg after Close: %v", err)
	}
	if _, err := s.GetMR(b, 0); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("GetMR after Close: %v", err)
	}
	if err := s.SetDeadline(time.Now()); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("SetDeadline after Close: %v", err)
	}
}

// A message longer than the buffer is cut; one that is not this
// protocol's is dropped and counted.
func TestTruncateAndForeign(t *testing.T) {
	client, server := pair(t, nil, nil)
	if _, err := client.SendMsg([]byte("0123456789"), server.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	server.SetReadDeadline(time.Now().Add(wait))
	b := make([]byte, 4)
	if n, _, _, err := server.RecvMsg(b); err != nil || string(b[:n]) != "0123" {
		t.Fatalf("cut message: %q, %v", b[:n], err)
	}
	// A bare RD peer (not this package) sends a Send with no header.
	dev, err := qp.Open(qp.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	sock, _ := dev.Bind("udp4", "127.0.0.1:0")
	pd := dev.AllocPD()
	cq, _ := dev.CreateCQ(16)
	q, _ := pd.CreateQP(qp.QPAttr{Type: qp.RD, SendCQ: cq, RecvCQ: cq})
	q.Modify(qp.ModifyAttr{State: qp.StateInit, Socket: sock})
	q.Modify(qp.ModifyAttr{State: qp.StateRTR})
	q.Modify(qp.ModifyAttr{State: qp.StateRTS})
	ah, _ := pd.CreateAH(server.LocalAddr(), QPN)
	if err := q.PostSend(&qp.SendWR{Inline: []byte("hello"), AH: ah, Flags: qp.FlagSignaled}); err != nil {
		t.Fatal(err)
	}
	wc := make([]qp.WorkCompletion, 1)
	deadline := time.Now().Add(wait)
	for cq.Poll(wc) == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if wc[0].Status != qp.Success {
		t.Fatalf("foreign send: %v", wc[0].Status)
	}
	// The socket took the foreign Send and dropped it, counted: what it
	// would have made of it is queued by then.
	for end := time.Now().Add(wait); server.Stats().BadMessages == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the foreign Send was not counted: stats %+v", server.Stats())
		}
	}
	nothingQueued(t, server)
	if st := server.Stats(); st.BadMessages != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestWireHeader(t *testing.T) {
	b := make([]byte, hdrMax+3)
	n := putHeader(b, &request{cookie: 5, addr: 6, length: 7, flags: UseOnce}, 9)
	if n != hdrMax {
		t.Fatal(n)
	}
	h, ok := parseHeader(b[:n])
	if !ok || !h.hasReq || !h.hasAck || h.req != (request{5, 6, 7, UseOnce}) || h.ack != 9 || h.size != n {
		t.Fatalf("%+v %v", h, ok)
	}
	for i := range n {
		if _, ok := parseHeader(b[:i]); ok {
			t.Fatalf("a %d-byte prefix parsed", i)
		}
	}
	b[2] |= 4
	if _, ok := parseHeader(b[:n]); ok {
		t.Fatal("unknown extension parsed")
	}
	if s := (UseOnce | Invalidate | 0x100).String(); s != "Invalidate|UseOnce|0x100" {
		t.Fatal(s)
	}
	if s := (ReadWrite | NotifyMe).String(); s != "ReadWrite|NotifyMe" {
		t.Fatal(s)
	}
	if s := StatusDropped.String(); s != "dropped" {
		t.Fatal(s)
	}
}

// A Read of a range past the client's region fails with REMOTE_ERROR
// (the client refuses the Read Request), and the ACK stays home.
func TestReadRemoteError(t *testing.T) {
	client, server := pair(t, nil, nil)
	peer := client.LocalAddr()
	c := mapRequest(t, client, server, pattern(100, 1), 0)
	sink := make([]byte, 20)
	if _, err := server.SendMsg([]byte("ack"), peer, ArgsControl{Cookie: c, Remote: Range{90, 20}, Local: [][]byte{sink}, Flags: NotifyMe, Token: 1}); err != nil {
		t.Fatal(err)
	}
	note(t, server, 1, StatusRemoteError, peer)
	marker(t, server, client)
	if !bytes.Equal(sink, make([]byte, 20)) {
		t.Fatal("a refused Read wrote the sink")
	}
	if err := client.FreeMR(c, Invalidate); err != nil {
		t.Fatal(err)
	}
	if _, err := server.SendMsg([]byte("ack"), peer, ArgsControl{Cookie: c, Remote: Range{0, 20}, Local: [][]byte{sink}, Flags: NotifyMe, Token: 2}); err != nil {
		t.Fatal(err)
	}
	note(t, server, 2, StatusRemoteError, peer)
	marker(t, server, client)
}

// A client that reads late: messages and ACKs past its receive depth wait
// at the server (receiver not ready, retried without limit), none is
// lost, and they arrive in order.
func TestSlowReader(t *testing.T) {
	client, server := pair(t, &Options{RecvDepth: 2}, nil)
	buf := make([]byte, 10*8)
	c := mapRequest(t, client, server, buf, 0)
	for i := range 10 {
		write(t, server, client, "m"+string(rune('0'+i)), c, uint64(i*8), NotifyMe, uint32(i), bytes.Repeat([]byte{byte('a' + i)}, 8))
	}
	// The client's two receives are taken: it refused a message for want
	// of a receive (receiver not ready), which the server retries.
	for end := time.Now().Add(wait); client.dev.Stats().RDNotReady.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the client never ran out of receives")
		}
	}
	for i := range 10 {
		recvMsg(t, client, "m"+string(rune('0'+i)))
		if buf[i*8] != byte('a'+i) {
			t.Fatalf("message %d before its data", i)
		}
	}
	var got []StatusControl
	for len(got) < 10 {
		got = append(got, notes(t, server)...)
	}
	for i, n := range got {
		if n.Token != uint32(i) || n.Status != StatusSuccess {
			t.Fatalf("notifications %+v", got)
		}
	}
}

// Several goroutines run operations on one server at once, to two
// clients; every ACK arrives with its data and every notification once.
func TestConcurrent(t *testing.T) {
	server := open(t, "udp4", "127.0.0.1:0", &Options{SendSlots: 8})
	const workers, rounds = 4, 10
	clients := []*Socket{open(t, "udp4", "127.0.0.1:0", nil), open(t, "udp4", "127.0.0.1:0", nil)}
	bufs := make([][]byte, len(clients))
	cookies := make([]Cookie, len(clients))
	for i, cl := range clients {
		bufs[i] = make([]byte, workers*rounds*16)
		cookies[i] = mapRequest(t, cl, server, bufs[i], 0)
	}
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			for r := range rounds {
				k := w*rounds + r
				i := k % len(clients)
				data := bytes.Repeat([]byte{byte(k)}, 16)
				_, err := server.SendMsg([]byte{byte(k)}, clients[i].LocalAddr(), ArgsControl{Cookie: cookies[i],
					Remote: Range{uint64(k * 16), 16}, Local: [][]byte{data[:7], data[7:]}, Flags: ReadWrite | NotifyMe, Token: uint32(k)})
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	seen := map[uint32]bool{}
	for len(seen) < workers*rounds {
		for _, n := range notes(t, server) {
			if seen[n.Token] || n.Status != StatusSuccess {
				t.Fatalf("notification %+v (seen %v)", n, seen[n.Token])
			}
			seen[n.Token] = true
		}
	}
	for i, cl := range clients {
		for range workers * rounds / len(clients) {
			got, _, _ := recv(t, cl)
			k := int(got[0])
			if k%len(clients) != i || !bytes.Equal(bufs[i][k*16:k*16+16], bytes.Repeat([]byte{byte(k)}, 16)) {
				t.Fatalf("client %d: ACK %d without its data", i, k)
			}
		}
		marker(t, server, cl) // no ACK twice
	}
}

// Through loss and reordering both ways, good and bad multi-datagram
// Writes alternate: every good one's ACK arrives after all its data, every
// bad one (its last segment runs past the region) ends REMOTE_ERROR and
// its ACK never arrives. A reordered last segment is selectively acked
// before the client checked it; the operation waits for the cumulative
// ack, which carries the error.
func TestAtomicUnderLoss(t *testing.T) {
	lossy := func(seed uint64) *Options {
		return &Options{Device: qp.DeviceConfig{Impair: &qp.Impairment{Seed: seed, Loss: 0.02, Reorder: 0.5}}}
	}
	client, server := pair(t, lossy(1), lossy(2))
	peer := client.LocalAddr()
	const region, size = 256 << 10, 150 << 10 // a Write is three datagrams
	buf := make([]byte, region)
	c := mapRequest(t, client, server, buf, 0)
	server.SetRecvErr(true)
	const ops = 16
	for i := range ops {
		off := uint64(0)
		if i%2 == 1 {
			off = region - size + 1 // the last byte is past the end
		}
		write(t, server, client, fmt.Sprint("op", i), c, off, NotifyMe, uint32(i), pattern(size, byte(i)))
		want := StatusSuccess
		if i%2 == 1 {
			want = StatusRemoteError
		}
		note(t, server, uint32(i), want, peer)
		if i%2 == 0 {
			recvMsg(t, client, fmt.Sprint("op", i))
			if !bytes.Equal(buf[:size], pattern(size, byte(i))) {
				t.Fatalf("op %d: ACK before its data", i)
			}
		}
		// The client is done with its buffer and says so, as an
		// application would (and the race detector sees it: the
		// causality through the network is invisible to it).
		if _, err := client.SendMsg([]byte("next"), server.LocalAddr()); err != nil {
			t.Fatal(err)
		}
		recvMsg(t, server, "next")
	}
	marker(t, server, client) // no bad operation's ACK
}

// FREE_MR with Invalidate while a peer's RDMA Read of the mapping is in
// flight (issue 13, item 9) revokes remote access at once: the Read ends
// with REMOTE_ERROR and no ACK, and later RDMAs with the cookie fail. The
// client's Read Responses leave slowly, two small segments at a time, so
// the Read is still in flight when FreeMR returns.
func TestFreeMRInvalidateDuringRead(t *testing.T) {
	co := &Options{Device: qp.DeviceConfig{Impair: &qp.Impairment{Delay: 20 * time.Millisecond}},
		RD: qp.RDConfig{Segment: 1024, Config: reliability.Config{Window: 2}}}
	client, server := pair(t, co, nil)
	peer := client.LocalAddr()
	buf := pattern(64<<10, 9)
	orig := slices.Clone(buf)
	c := mapRequest(t, client, server, buf, 0)
	sink := make([]byte, len(buf))
	if _, err := server.SendMsg([]byte("read"), peer, ArgsControl{Cookie: c, Remote: Range{0, uint64(len(buf))},
		Local: [][]byte{sink}, Flags: NotifyMe, Token: 1}); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(wait); client.dev.Stats().RDReadsServed.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the client never served the Read")
		}
	}
	if err := client.FreeMR(c, Invalidate); err != nil {
		t.Fatal(err)
	}
	note(t, server, 1, StatusRemoteError, peer)
	write(t, server, client, "after", c, 0, NotifyMe, 2, []byte("zz"))
	note(t, server, 2, StatusRemoteError, peer)
	marker(t, server, client)
	if !bytes.Equal(buf, orig) {
		t.Fatal("an invalidated mapping was written")
	}
	if st := client.Stats(); st.Mappings != 0 || st.Invalidated != 1 {
		t.Fatalf("client stats %+v", st)
	}
}
