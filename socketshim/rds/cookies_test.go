package rds

import (
	"testing"
)

// TestPeerCookiesNotFlushedByOneSource: the cookies a server remembers
// are bounded (MaxPeerCookies), but one peer that sends RDMA requests
// with many cookies of its own must not make the server forget another
// client's: the client's RDMA, asked for before the flood, still works.
func TestPeerCookiesNotFlushedByOneSource(t *testing.T) {
	const limit = 32
	server := open(t, "udp4", "127.0.0.1:0", &Options{MaxPeerCookies: limit})
	client := open(t, "udp4", "127.0.0.1:0", nil)
	other := open(t, "udp4", "127.0.0.2:0", &Options{MaxMappings: 4 * limit})
	peer := client.LocalAddr()
	buf := make([]byte, 64)
	c := mapRequest(t, client, server, buf, 0)
	// Another host (any that reaches the server's port) sends 2 x
	// limit requests, each with a cookie of its own; the server reads
	// them as every message.
	for range 2 * limit {
		mapRequest(t, other, server, make([]byte, 8), 0)
	}
	if st := server.Stats(); st.PeerCookies != limit { // full: it forgot some
		t.Fatalf("the server remembers %d cookies, want its %d", st.PeerCookies, limit)
	}
	write(t, server, client, "ack", c, 0, NotifyMe, 1, []byte("data"))
	note(t, server, 1, StatusSuccess, peer)
	recvMsg(t, client, "ack")
}
