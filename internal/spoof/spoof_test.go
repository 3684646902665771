package spoof

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"
)

// TestSpoofedSourceArrives checks that a forged datagram reaches an ordinary
// UDP socket with the forged source and intact payload.
func TestSpoofedSourceArrives(t *testing.T) {
	s := NewT(t)
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dst := c.LocalAddr().(*net.UDPAddr).AddrPort()
	for i, src := range []netip.AddrPort{
		netip.MustParseAddrPort("127.9.8.7:4242"),
		netip.MustParseAddrPort("127.200.1.3:1"),
	} {
		want := bytes.Repeat([]byte{byte(i + 1)}, 33+i)
		if err := s.Send(src, dst, want); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		b := make([]byte, 100)
		n, from, err := c.ReadFromUDPAddrPort(b)
		if err != nil {
			t.Fatal(err)
		}
		if from != src || !bytes.Equal(b[:n], want) {
			t.Fatalf("got %d bytes from %v, want %d from %v", n, from, len(want), src)
		}
	}
	if err := s.Send(netip.MustParseAddrPort("[::1]:1"), dst, nil); err == nil {
		t.Fatal("IPv6 source accepted")
	}
}
