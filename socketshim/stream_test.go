package socketshim

import (
	"bytes"
	"github.com/udiwarp/udiwarp/internal/netnstest"
	"github.com/udiwarp/udiwarp/qp"
	"net"
	"os/exec"
	"testing"
	"time"
)

// packetPair opens two loopback PacketConns, closed when t ends.
func packetPair(t *testing.T, reliable bool) (a, c *PacketConn) {
	t.Helper()
	for _, p := range []**PacketConn{&a, &c} {
		pc, err := ListenPacket("udp4", "127.0.0.1:0", &Options{Reliable: reliable})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pc.Close() })
		*p = pc
	}
	return a, c
}

// TestWriteToLeavesBuffer checks that a UD PacketConn, which sends every
// datagram inline from the caller's buffer (gathered by the kernel when
// it goes out at once, copied into the send queue when it must wait),
// never reads the buffer after WriteTo returns: the writer overwrites it
// at once, and every datagram read is whole and one of those written.
// On plain loopback the kernel takes every datagram at once (it never
// says EAGAIN), so the "UD, queued" case runs in a namespace whose
// loopback is shaped by a tbf: datagrams wait in the qdisc, charged to
// the sender's socket, which fills, and sends queue in the stack; the
// test asserts they did (TxQueued) before it asserts the bytes.
// (A UD reader stops at the writer's 1-byte end marker.)
func TestWriteToLeavesBuffer(t *testing.T) {
	for _, tc := range []struct {
		name             string
		reliable, shaped bool
	}{{"UD", false, false}, {"Reliable", true, false}, {"UD, queued", false, true}} {
		name, reliable := tc.name, tc.reliable
		t.Run(name, func(t *testing.T) {
			var a, c *PacketConn
			if tc.shaped {
				if _, err := exec.LookPath("tc"); err != nil {
					t.Skip("the shaped loopback needs iproute2's tc")
				}
				ns := netnstest.New(t, "link set lo up", "!tc -n NS qdisc add dev lo root tbf rate 200mbit burst 64kb limit 64mb")
				netnstest.In(t, ns, func() {
					for _, p := range []**PacketConn{&a, &c} {
						// A send buffer of two datagrams: the qdisc holds them charged
						// to it, so the socket fills at once, even under -race.
						pc, err := ListenPacket("udp4", "127.0.0.1:0", &Options{Device: qp.DeviceConfig{SendBuffer: 128 << 10, RecvBuffer: 32 << 20}})
						if err != nil {
							t.Fatal(err)
						}
						t.Cleanup(func() { pc.Close() })
						*p = pc
					}
				})
			} else {
				a, c = packetPair(t, reliable)
			}
			const n, size = 400, 64000
			done := make(chan int)
			go func() {
				buf := make([]byte, 65536)
				got := 0
				defer func() { done <- got }()
				c.SetReadDeadline(time.Now().Add(20 * time.Second))
				for got < n {
					k, _, err := c.ReadFrom(buf)
					if err != nil || k == 1 { // (UD: the end marker)
						return
					}
					if k != size || buf[0] == 0xEE || !bytes.Equal(buf[1:k], bytes.Repeat(buf[:1], k-1)) {
						t.Errorf("datagram %d: %d bytes, not one written whole (first bytes % x)", got, k, buf[:8])
						return
					}
					got++
				}
			}()
			msg := make([]byte, size)
			dst := c.LocalAddr()
			for i := range n {
				for j := range msg {
					msg[j] = byte(i%200 + 1)
				}
				if _, err := a.WriteTo(msg, dst); err != nil {
					t.Fatal(err)
				}
				for j := range msg {
					msg[j] = 0xEE // the caller's buffer is the caller's again
				}
			}
			if tc.shaped {
				if q := a.Device().Stats().Snapshot().TxQueued; q == 0 {
					t.Fatal("no send queued: the test does not reach the path it is about")
				}
			}
			if reliable {
				if got := <-done; got != n {
					t.Fatalf("read %d of %d", got, n)
				}
				return
			}
			// UD may drop at the reader's socket: the writer marks the end
			// with a 1-byte datagram, sent again until the reader sees one.
			var got int
			for tick := time.NewTicker(10 * time.Millisecond); ; <-tick.C {
				if _, err := a.WriteTo([]byte{0}, dst); err != nil {
					t.Fatal(err)
				}
				select {
				case got = <-done:
				default:
					continue
				}
				tick.Stop()
				break
			}
			t.Logf("read %d of %d (UD may drop at the receiver's socket)", got, n)
			if got == 0 {
				t.Fatal("nothing arrived")
			}
		})
	}
}

// TestStreamAllocs checks that a 64000-byte WriteTo and ReadFrom cost no
// allocation, on UD and Reliable PacketConns (RD recycles the work
// requests it keeps until acknowledged).
func TestStreamAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	for _, reliable := range []bool{false, true} {
		a, c := packetPair(t, reliable)
		msg, buf := make([]byte, 64000), make([]byte, 65536)
		dst := c.LocalAddr().(*net.UDPAddr).AddrPort()
		round := func() {
			if _, err := a.WriteToUDPAddrPort(msg, dst); err != nil {
				t.Fatal(err)
			}
			if _, _, err := c.ReadFromUDPAddrPort(buf); err != nil {
				t.Fatal(err)
			}
		}
		round()
		if allocs := testing.AllocsPerRun(200, round); allocs != 0 {
			t.Errorf("reliable %v: %v allocations per WriteTo and ReadFrom of 64000 bytes", reliable, allocs)
		}
	}
}
