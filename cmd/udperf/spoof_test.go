package main

import (
	"encoding/json"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/internal/perf"
	"github.com/udiwarp/udiwarp/internal/spoof"
	"github.com/udiwarp/udiwarp/qp"
	"github.com/udiwarp/udiwarp/udiwarp"
	"golang.org/x/sys/unix"
)

// TestServerSpoofedData: an off-path host that forges datagrams to a
// run's data port, from a third party's address (the victim's), can
// neither steer the run nor draw its echoes onto the victim. Before, the
// raw-udp server connected to the first datagram's source (a forged first
// datagram took the run: the client's pings went unanswered and the
// victim got the echoes), raw-udp-unconn echoed to any source, and a UD
// server echoed a forged Send to its claimed source. Now the request names
// the client's data end and the server takes data from it alone, counting
// the rest (runReply.Foreign).
func TestServerSpoofedData(t *testing.T) {
	sp := spoof.NewT(t)
	defer sp.Close()
	addr := startServer(t)
	for _, mode := range []perf.Mode{perf.ModeRawUDP, perf.ModeRawUDPUnconnected, perf.ModeUDSend} {
		t.Run(string(mode), func(t *testing.T) {
			// The victim: a third party on another loopback address.
			victim, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 7)})
			if err != nil {
				t.Fatal(err)
			}
			defer victim.Close()
			forged := victim.LocalAddr().(*net.UDPAddr).AddrPort()

			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(time.Minute)) // only a hung server gets here
			enc, dec := json.NewEncoder(c), json.NewDecoder(c)
			const size, trips = 64, 50
			req := runRequest{Mode: mode, Test: "lat", Size: size, Poll: "event", Trips: trips}
			var data *net.UDPConn
			var end *perf.End
			cfg := perf.Config{Mode: mode, Test: perf.TestLat, Poll: qp.PollEvent, Size: size, Iters: trips, QPs: 1}
			if mode == perf.ModeUDSend {
				if end, err = perf.OpenEnd(cfg, false, "udp4", "127.0.0.1:0"); err != nil {
					t.Fatal(err)
				}
				defer end.Close()
				p := end.Peer(netip.MustParseAddr("127.0.0.1"))
				req.From, req.QPN = p.Addr.String(), p.QPN
			} else {
				if data, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}); err != nil {
					t.Fatal(err)
				}
				defer data.Close()
				req.From = data.LocalAddr().String()
			}
			if err := enc.Encode(req); err != nil {
				t.Fatal(err)
			}
			var rep runReply
			if err := dec.Decode(&rep); err != nil || rep.Error != "" {
				t.Fatalf("the run: %+v %v", rep, err)
			}
			to := netip.MustParseAddrPort(rep.Addr)

			// The spoofer goes first: forged datagrams from the victim's
			// address (UD: Sends to the server's QP).
			payload := make([]byte, size)
			if mode == perf.ModeUDSend {
				h := udiwarp.AppendUntagged(nil, &udiwarp.UntaggedFields{Last: true, DV: udiwarp.DatagramDDPVersion,
					RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpSend), ULP: 77, QN: udiwarp.DatagramQN(rep.QPN, udiwarp.QueueSend), MSN: 1})
				payload = udiwarp.SealDatagram(append(h, payload...), 0)
			}
			const forgeries = 20
			for range forgeries {
				if err := sp.Send(forged, to, payload); err != nil {
					t.Fatal(err)
				}
			}

			// The client's run, as `udperf client` drives it.
			var res perf.Result
			if end != nil {
				res, err = driveEnd(end, cfg, "lat", rep)
			} else {
				res, err = drive(cfg, "lat", rep, data, netip.MustParseAddr("127.0.0.1"))
			}
			if err != nil {
				t.Fatalf("the client's run beside the spoofer: %v (the spoofer took the run)", err)
			}
			if res.Median <= 0 {
				t.Fatalf("the client's run: %+v", res)
			}
			if err := enc.Encode(doneMsg{Done: true}); err != nil {
				t.Fatal(err)
			}
			var fin runReply
			if err := dec.Decode(&fin); err != nil || fin.Error != "" {
				t.Fatalf("the run's figures: %+v %v", fin, err)
			}
			// A connected socket's kernel drops the forgeries before the
			// server sees them; the others count what they dropped.
			if mode != perf.ModeRawUDP && fin.Foreign == 0 {
				t.Errorf("the server counted no datagram from elsewhere (%d forged)", forgeries)
			}
			// The victim got nothing: no echo, no reflection. The server
			// handled the forgeries, queued ahead of the client's pings,
			// before it echoed the first (what it does not drop it takes
			// in order), so an answer to one would be in the victim's
			// socket by now (loopback queues it as it is sent): a read
			// that does not wait finds none.
			raw, err := victim.SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			var n int
			var rerr error
			if err := raw.Read(func(fd uintptr) bool {
				n, _, rerr = unix.Recvfrom(int(fd), make([]byte, 65536), unix.MSG_DONTWAIT)
				return true
			}); err != nil {
				t.Fatal(err)
			}
			if rerr != unix.EAGAIN {
				t.Fatalf("the victim received %d bytes (%v): the server answered a forged source", n, rerr)
			}
			enc.Encode(runRequest{Bye: true})
			dec.Decode(&rep)
		})
	}
}

// TestServerRefusesForeignDataAddress: a request may point the server's
// data only at the control connection's own host, and must name it.
func TestServerRefusesForeignDataAddress(t *testing.T) {
	addr := startServer(t)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Minute))
	enc, dec := json.NewEncoder(c), json.NewDecoder(c)
	for _, from := range []string{"", "127.0.0.9:4000", "nonsense"} {
		if err := enc.Encode(runRequest{Mode: "raw-udp-unconn", Test: "lat", Size: 10, From: from}); err != nil {
			t.Fatal(err)
		}
		var rep runReply
		if err := dec.Decode(&rep); err != nil || rep.Error == "" || rep.Addr != "" {
			t.Fatalf("from %q: %+v %v; want a refusal", from, rep, err)
		}
	}
	// The session goes on: a right request is served.
	if err := enc.Encode(runRequest{Mode: "raw-udp-unconn", Test: "lat", Size: 10, From: "127.0.0.1:9"}); err != nil {
		t.Fatal(err)
	}
	var rep runReply
	if err := dec.Decode(&rep); err != nil || rep.Error != "" || rep.Addr == "" {
		t.Fatalf("a right request after the refusals: %+v %v", rep, err)
	}
}
