package socketshim

import (
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// pconn is what both sides of the comparison offer.
type pconn interface {
	net.PacketConn
}

func udpPair(b *testing.B) (pconn, pconn) {
	a, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { a.Close(); c.Close() })
	return a, c
}

// shimPair opens two PacketConns; kind "socketshim-nocrc" turns the
// CRC32c off, to show what the software CRC costs (an RNIC computes it in
// hardware).
func shimPair(b *testing.B, kind string) (pconn, pconn) {
	o := &Options{}
	o.Device.NoCRC = kind == "socketshim-nocrc"
	a, err := ListenPacket("udp4", "127.0.0.1:0", o)
	if err != nil {
		b.Fatal(err)
	}
	c, err := ListenPacket("udp4", "127.0.0.1:0", o)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { a.Close(); c.Close() })
	return a, c
}

// BenchmarkPingPong is a ReadFrom/WriteTo ping-pong, half round trip
// median, over the shim's PacketConn and over net.UDPConn, in one run.
func BenchmarkPingPong(b *testing.B) {
	for _, size := range []int{64, 1024} {
		for _, kind := range []string{"net.UDPConn", "socketshim", "socketshim-nocrc"} {
			b.Run(fmt.Sprintf("size=%d/%s", size, kind), func(b *testing.B) {
				var a, c pconn
				if kind != "net.UDPConn" {
					a, c = shimPair(b, kind)
				} else {
					a, c = udpPair(b)
				}
				var wg sync.WaitGroup
				wg.Add(1)
				go func() { // echo
					defer wg.Done()
					buf := make([]byte, 2048)
					for {
						n, from, err := c.ReadFrom(buf)
						if err != nil {
							return
						}
						c.WriteTo(buf[:n], from)
					}
				}()
				msg := make([]byte, size)
				buf := make([]byte, 2048)
				ns := make([]int64, 0, b.N)
				for range 1000 + b.N {
					t0 := time.Now()
					a.WriteTo(msg, c.LocalAddr())
					if _, _, err := a.ReadFrom(buf); err != nil {
						b.Fatal(err)
					}
					ns = append(ns, int64(time.Since(t0))/2)
				}
				c.Close()
				wg.Wait()
				ns = ns[1000:]
				slices.Sort(ns)
				b.ReportMetric(float64(ns[len(ns)/2])/1e3, "p50-µs")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}

// BenchmarkStream sends 64000-byte datagrams for a second and reports
// what the receiver read.
func BenchmarkStream(b *testing.B) {
	for _, kind := range []string{"net.UDPConn", "socketshim", "socketshim-nocrc"} {
		b.Run(kind, func(b *testing.B) {
			var a, c pconn
			if kind != "net.UDPConn" {
				a, c = shimPair(b, kind)
			} else {
				a, c = udpPair(b)
				c.(*net.UDPConn).SetReadBuffer(32 << 20)
			}
			var got atomic.Int64
			var first, last atomic.Int64
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := make([]byte, 65536)
				for {
					n, _, err := c.ReadFrom(buf)
					if err != nil {
						return
					}
					now := time.Now().UnixNano()
					first.CompareAndSwap(0, now)
					last.Store(now)
					got.Add(int64(n))
				}
			}()
			msg := make([]byte, 64000)
			for end := time.Now().Add(time.Second); time.Now().Before(end); {
				a.WriteTo(msg, c.LocalAddr())
			}
			time.Sleep(50 * time.Millisecond)
			c.Close()
			wg.Wait()
			el := time.Duration(last.Load() - first.Load()).Seconds()
			b.ReportMetric(float64(got.Load())*8/el/1e9, "Gb/s")
			b.ReportMetric(0, "ns/op")
		})
	}
}
