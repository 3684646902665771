package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/internal/netnstest"
	"github.com/udiwarp/udiwarp/internal/spoof"
)

// TestFeedOversizeDatagramKeepsStream: a udp:// feed's socket takes
// datagrams from anyone. One datagram larger than a chunk (here forged
// off-path, 1400 bytes against udp's 1316-byte chunks) arriving between
// two of the feed's must not end the stream: the sender goes on with
// every datagram the feed sends after it, and the receiver gets them.
func TestFeedOversizeDatagramKeepsStream(t *testing.T) {
	s := spoof.NewT(t)
	feed, port := freePort(t), freePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	out := filepath.Join(t.TempDir(), "out.ts")
	var wg sync.WaitGroup
	var snd, rcv ended
	wg.Go(func() {
		snd = runCmd([]string{"send", "-t", "udp", "-listen", addr, "-i", fmt.Sprintf("udp://127.0.0.1:%d", feed), "-idle", "1s", "-json", "-q", "-wait", "20s"}, nil)
	})
	wg.Go(func() {
		rcv = runCmd([]string{"recv", "-t", "udp", "-from", addr, "-o", out, "-json", "-q", "-idle", "3s"}, nil)
	})
	poll(t, "the sender's feed socket", func() bool { return netnstest.UDPBound(0, feed) })
	c, err := net.Dial("udp4", fmt.Sprintf("127.0.0.1:%d", feed))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const perHalf = 20
	dg := bytes.Repeat(append([]byte{0x47}, make([]byte, 187)...), 7) // 1316 B: one udp chunk
	to := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(feed))
	for i := range 2 * perHalf {
		if i == perHalf { // the forged datagram, queued between two of the feed's
			if err := s.Send(netip.MustParseAddrPort("127.9.9.9:4000"), to, bytes.Repeat([]byte{0x47}, 1400)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := c.Write(dg); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	wg.Wait()
	var ss sendStats
	var rs recvStats
	json.Unmarshal([]byte(snd.stdout), &ss)
	json.Unmarshal([]byte(rcv.stdout), &rs)
	if snd.code != 0 || rcv.code != 0 {
		t.Fatalf("send exit %d %q; recv exit %d %q", snd.code, snd.stderr, rcv.code, rcv.stderr)
	}
	if want := uint64(2 * perHalf * len(dg)); ss.Bytes < want || rs.BytesReceived < want {
		t.Fatalf("the feed sent %d bytes; the sender streamed %d in %d chunks, the receiver took %d (%+v)", want, ss.Bytes, ss.Chunks, rs.BytesReceived, rs)
	}
	t.Logf("sender %+v; receiver %+v", ss, rs)
}
