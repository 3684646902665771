package main

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/internal/netnstest"
	"github.com/udiwarp/udiwarp/internal/spoof"
	"github.com/udiwarp/udiwarp/socketshim"
)

// Off-path attacks on udstream's own protocol: datagrams with forged
// sources (internal/spoof) at a receiver, as if from its sender, and at a
// sender, as if from a receiver. The forged messages are built here byte
// by byte, as docs/udstream.md lays them out, by an attacker who knows
// the format and the addresses but sees none of the traffic.

// forge lays out a udstream message: the 16-byte header (magic, kind,
// flags, sequence number, the stream's tag) and then body.
func forge(kind byte, seq uint32, tag uint64, body []byte) []byte {
	m := make([]byte, 16, 16+len(body))
	m[0], m[1], m[2], m[3] = 'U', 'S', kind, 0
	binary.BigEndian.PutUint32(m[4:], seq)
	binary.BigEndian.PutUint64(m[8:], tag)
	return append(m, body...)
}

func randomTag() uint64 {
	var b [8]byte
	rand.Read(b[:])
	return binary.BigEndian.Uint64(b[:]) | 1
}

// onWire turns udstream messages into the UDP payloads transport puts on
// the wire for them: themselves over udp; over send-ud, the UD Send a
// socketshim.PacketConn makes of each (headers and CRC), captured from a
// real one by a plain UDP socket, ready to be replayed from a forged
// source.
func onWire(t *testing.T, transport string, msgs ...[]byte) [][]byte {
	t.Helper()
	if transport == tUDP {
		return msgs
	}
	pc, err := socketshim.ListenPacket("udp4", "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	capture, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer capture.Close()
	out := make([][]byte, 0, len(msgs))
	buf := make([]byte, 65536)
	for _, m := range msgs {
		if _, err := pc.WriteToUDPAddrPort(m, capture.LocalAddr().(*net.UDPAddr).AddrPort()); err != nil {
			t.Fatal(err)
		}
		capture.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err := capture.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, append([]byte(nil), buf[:n]...))
	}
	return out
}

// poll waits for cond; the bound only fails a hung test.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

// TestSpoofedSenderCannotEndStream (issue 30, item 5): while a stream
// runs, an off-path attacker forges datagrams from the sender's address
// to the receiver — chunks numbered far ahead, ends that say the stream
// is over, a challenge — each with a tag it had to guess. None of them
// ends, shortens or derails the stream: the receiver drops and counts
// every one, takes the whole stream, and exits 0 at the sender's own end.
func TestSpoofedSenderCannotEndStream(t *testing.T) {
	needTS(t)
	s := spoof.NewT(t)
	in, _ := os.ReadFile(tsIn)
	payload := bytes.Repeat(append([]byte{0x47}, make([]byte, 187)...), 7)
	var end8 [8]byte
	binary.BigEndian.PutUint64(end8[:], 1316)
	forged := [][]byte{
		forge(dataKind, 1<<20, randomTag(), payload),      // far ahead: every later real chunk would be "old"
		forge(dataKind, 0xfffffff0, randomTag(), payload), // as far as a uint32 goes
		forge(endKind, 1, randomTag(), end8[:]),           // "the stream ended after 1 chunk"
		forge(endKind, 0, randomTag(), end8[:]),
		forge(dataKind, 3, randomTag(), payload),  // a chunk the receiver may well expect
		forge(4, 0, randomTag(), make([]byte, 8)), // a challenge, as if the sender asked again
	}
	for _, tr := range []string{tUDP, tSendUD} {
		t.Run(tr, func(t *testing.T) {
			frames := onWire(t, tr, forged...)
			port, rport := freePort(t), freePort(t)
			sender := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port))
			receiver := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(rport))
			out := filepath.Join(t.TempDir(), "out.ts")
			var wg sync.WaitGroup
			var snd, rcv ended
			wg.Go(func() {
				snd = runCmd([]string{"send", "-t", tr, "-listen", sender.String(), "-i", tsIn, "-speed", "2", "-q", "-wait", "20s"}, nil)
			})
			wg.Go(func() {
				rcv = runCmd([]string{"recv", "-t", tr, "-from", sender.String(), "-bind", receiver.String(), "-o", out, "-json", "-q", "-wait", "20s"}, nil)
			})
			// Once the stream is under way (the first bytes written), the
			// attacker strikes: the stream has seconds still to run.
			poll(t, "the stream to start", func() bool {
				fi, err := os.Stat(out)
				return err == nil && fi.Size() > 0
			})
			for _, f := range frames {
				if err := s.Send(sender, receiver, f); err != nil {
					t.Error(err)
				}
			}
			wg.Wait()
			var rs recvStats
			if err := json.Unmarshal([]byte(rcv.stdout), &rs); err != nil {
				t.Fatalf("the receiver's JSON %q: %v", rcv.stdout, err)
			}
			got, _ := os.ReadFile(out)
			if snd.code != 0 || rcv.code != 0 || !bytes.Equal(got, in) || !rs.Ended || rs.ChunksLost != 0 {
				t.Fatalf("send %d %q; recv %d %q; %d of %d bytes written; %+v", snd.code, snd.stderr, rcv.code, rcv.stderr, len(got), len(in), rs)
			}
			if rs.Rejected < uint64(len(forged)) {
				t.Fatalf("%d forged datagrams, %d rejected: the attack did not reach the receiver (%+v)", len(forged), rs.Rejected, rs)
			}
		})
	}
}

// TestSpoofedRequestAimsNothing (issue 30, item 6): an off-path attacker
// forges requests for the stream from a victim's address (a real socket
// bound there counts what arrives). The sender answers an unproven
// source with one challenge no larger than the request, and nothing
// else: the victim gets at most as many bytes as the attacker sent (1x),
// and the stream goes to the receiver that proved its address.
func TestSpoofedRequestAimsNothing(t *testing.T) {
	needTS(t)
	s := spoof.NewT(t)
	for _, tr := range []string{tUDP, tSendUD} {
		t.Run(tr, func(t *testing.T) {
			// An 8-byte request as the first udstream sent it, and one of
			// the size a request has now, echoing no cookie.
			reqs := onWire(t, tr, forge(reqKind, 0, 0, nil)[:8], forge(reqKind, 0, randomTag(), make([]byte, 8)))
			victim, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 66, 0, 1)})
			if err != nil {
				t.Fatal(err)
			}
			defer victim.Close()
			victim.SetReadBuffer(8 << 20)
			vAP := victim.LocalAddr().(*net.UDPAddr).AddrPort()
			marker, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				t.Fatal(err)
			}
			defer marker.Close()
			mAP := marker.LocalAddr().(*net.UDPAddr).AddrPort()
			var mu sync.Mutex
			var drawn, datagrams int
			done := make(chan struct{})
			go func() { // counts all the victim gets, until the test's marker
				defer close(done)
				b := make([]byte, 65536)
				for {
					n, from, err := victim.ReadFromUDPAddrPort(b)
					if err != nil || from == mAP {
						return
					}
					mu.Lock()
					drawn += n
					datagrams++
					mu.Unlock()
				}
			}()
			port := freePort(t)
			sender := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port))
			var wg sync.WaitGroup
			var snd, rcv ended
			wg.Go(func() {
				snd = runCmd([]string{"send", "-t", tr, "-listen", sender.String(), "-i", tsIn, "-speed", "8", "-json", "-q", "-wait", "20s"}, nil)
			})
			poll(t, "the sender to listen", func() bool { return netnstest.UDPBound(0, port) })
			// The requests go again until the victim hears from the sender
			// (the sender's socket may be bound before it reads).
			sent := 0
			poll(t, "the sender to answer the forged requests", func() bool {
				mu.Lock()
				heard := datagrams > 0
				mu.Unlock()
				if heard {
					return true
				}
				for _, r := range reqs {
					if err := s.Send(vAP, sender, r); err != nil {
						t.Fatal(err)
					}
					sent += len(r)
				}
				time.Sleep(100 * time.Millisecond)
				mu.Lock()
				defer mu.Unlock()
				return datagrams > 0
			})
			out := filepath.Join(t.TempDir(), "out.ts")
			rcv = runCmd([]string{"recv", "-t", tr, "-from", sender.String(), "-o", out, "-json", "-q", "-wait", "20s"}, nil)
			wg.Wait()
			// Everything the sender sent went before it returned; the
			// marker, sent after, closes the count.
			marker.WriteToUDPAddrPort([]byte("end"), vAP)
			<-done
			var ss sendStats
			json.Unmarshal([]byte(snd.stdout), &ss)
			t.Logf("%s: forged requests of %d bytes drew %d bytes in %d datagrams at the victim; sender %+v", tr, sent, drawn, datagrams, ss)
			if drawn > sent {
				t.Fatalf("forged requests of %d bytes from %v drew %d bytes (%d datagrams, %.0fx) there", sent, vAP, drawn, datagrams, float64(drawn)/float64(sent))
			}
			if snd.code != 0 || rcv.code != 0 || ss.Receiver == vAP.String() || ss.Challenges == 0 {
				t.Fatalf("send %d %q %+v; recv %d %q", snd.code, snd.stderr, ss, rcv.code, rcv.stderr)
			}
		})
	}
}

// playedSender is the test playing a udstream sender over udp, as an
// on-path host or a confused sender could: it answers the receiver's
// request with a challenge, takes its proof, and then knows the
// stream's tag.
type playedSender struct {
	t        *testing.T
	c        *net.UDPConn
	receiver netip.AddrPort
	tag      uint64
	wg       sync.WaitGroup
	rcv      ended
	out      string
}

// playSender starts a receiver (-t udp, -ts off, and args) asking the
// test for a stream, and goes through the handshake with it.
func playSender(t *testing.T, args ...string) *playedSender {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	p := &playedSender{t: t, c: c, out: filepath.Join(t.TempDir(), "out")}
	sender := c.LocalAddr().(*net.UDPAddr).AddrPort()
	p.wg.Go(func() {
		p.rcv = runCmd(append([]string{"recv", "-t", tUDP, "-from", sender.String(), "-o", p.out, "-json", "-q", "-wait", "20s", "-ts", "off"}, args...), nil)
	})
	t.Cleanup(p.wg.Wait)
	// A request, echoing no cookie; the challenge; the request again,
	// echoing it.
	b := make([]byte, 65536)
	read := func() ([]byte, netip.AddrPort) {
		t.Helper()
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		n, from, err := c.ReadFromUDPAddrPort(b)
		if err != nil {
			t.Fatal(err)
		}
		return b[:n], from
	}
	m, receiver := read()
	kind, _, _, tag, ok := header(m)
	if !ok || kind != reqKind || len(m) != reqSize || binary.BigEndian.Uint64(m[hdrSize:]) != 0 {
		t.Fatalf("the first request: % x", m)
	}
	p.receiver, p.tag = receiver, tag
	const cookie = 0x1122334455667788
	var ck [8]byte
	binary.BigEndian.PutUint64(ck[:], cookie)
	p.send(forge(chalKind, 0, tag, ck[:]))
	for {
		m, from := read()
		if k, _, _, tg, ok := header(m); from == receiver && ok && k == reqKind && tg == tag && len(m) == reqSize &&
			binary.BigEndian.Uint64(m[hdrSize:]) == cookie {
			return p
		}
	}
}

func (p *playedSender) send(m []byte) {
	p.t.Helper()
	if _, err := p.c.WriteToUDPAddrPort(m, p.receiver); err != nil {
		p.t.Fatal(err)
	}
}

// chunk sends chunk seq (400 bytes that say seq) and returns its bytes.
func (p *playedSender) chunk(seq uint32) []byte {
	b := bytes.Repeat([]byte{byte(seq), byte(seq >> 8), byte(seq >> 16), byte(seq >> 24)}, 100)
	p.send(forge(dataKind, seq, p.tag, b))
	return b
}

func (p *playedSender) end(chunks uint32) {
	var e [8]byte
	p.send(forge(endKind, chunks, p.tag, e[:]))
}

// result waits for the receiver and returns its exit, figures and
// output.
func (p *playedSender) result() (ended, recvStats, []byte) {
	p.wg.Wait()
	var rs recvStats
	json.Unmarshal([]byte(p.rcv.stdout), &rs)
	got, _ := os.ReadFile(p.out)
	return p.rcv, rs, got
}

// TestChunkWindowAndEnd: the rules that hold even for datagrams that
// carry the stream's tag (an on-path host's, or a confused sender's):
// the receiver's request echoes the cookie of the challenge; a chunk
// more than chunkWindow ahead is dropped, unless it is the resyncRun-th
// of a run of consecutive ones (the stream moved on past a long gap); an
// end that says fewer chunks than arrived is dropped; a duplicate is
// dropped; an end that says more than arrived counts the rest lost once
// they do not come.
func TestChunkWindowAndEnd(t *testing.T) {
	p := playSender(t)
	var want []byte
	for i := range uint32(5) {
		want = append(want, p.chunk(i)...)
	}
	p.chunk(5 + chunkWindow + 1) // far ahead: dropped
	p.end(3)                     // fewer than arrived: dropped
	p.chunk(2)                   // a duplicate: dropped
	for i := uint32(5); i < 10; i++ {
		want = append(want, p.chunk(i)...)
	}
	far := uint32(10 + chunkWindow + 100)
	p.chunk(far)     // dropped
	p.chunk(far + 1) // dropped
	want = append(want, p.chunk(far+2)...)
	p.end(far + 5) // two more chunks than come: lost at the end
	r, rs, got := p.result()
	if r.code != 0 || !bytes.Equal(got, want) || !rs.Ended || rs.Chunks != 11 || rs.ChunksLost != uint64(far+5-11) || rs.Rejected != 4 {
		t.Fatalf("recv %d %q; %d bytes written, want %d; %+v", r.code, r.stderr, len(got), len(want), rs)
	}
}

// TestStreamEndsShort: a stream whose sender goes silent with no end of
// its own — only an end that contradicts what arrived — ends after
// -idle, says it ended short, exits 1, and keeps what arrived.
func TestStreamEndsShort(t *testing.T) {
	p := playSender(t, "-idle", "500ms")
	var want []byte
	for i := range uint32(5) {
		want = append(want, p.chunk(i)...)
	}
	p.end(2)
	r, rs, got := p.result()
	if r.code != 1 || !strings.Contains(r.stderr, "ended short") || strings.Count(r.stderr, "\n") != 1 || !bytes.Equal(got, want) || rs.Ended || rs.Rejected != 1 {
		t.Fatalf("recv %d %q; %d bytes written, want %d; %+v", r.code, r.stderr, len(got), len(want), rs)
	}
}
