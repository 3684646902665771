package qp

import (
	"errors"
	"strings"
	"testing"
)

// TestLowerXDPRefusedOrFallsBack: a device that asks for AF_XDP on an
// address no AF_XDP link can serve (loopback: no Ethernet; AF_XDP is
// never attached to lo) gets the reason in one line, or, with
// LowerFallback, a kernel UDP socket whose Link says why; a lower layer
// the stack does not know is refused.
func TestLowerXDPRefusedOrFallsBack(t *testing.T) {
	d, err := Open(DeviceConfig{Lower: LowerXDP})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	s, err := d.Bind("udp4", "127.0.0.1:0")
	if err == nil {
		t.Fatalf("AF_XDP on loopback: a socket on %+v", s.Link())
	}
	if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, "never attaches to loopback") {
		t.Fatalf("the reason: %q", msg)
	}
	if _, err := d.Bind("udp4", "0.0.0.0:0"); !errors.Is(err, ErrInvalidAttr) {
		t.Fatalf("AF_XDP on the unspecified address: %v", err)
	}

	f := newNode(t, DeviceConfig{Lower: LowerXDP, LowerFallback: true}, "udp4", "127.0.0.1:0")
	if c := f.sock.Link(); c.Kind != "udp" || !strings.Contains(c.Detail, "AF_XDP refused: qp: AF_XDP: 127.0.0.1 is a loopback address") {
		t.Fatalf("the fallback socket: %+v", c)
	}
	g := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	mustPost(t, g.qp.PostRecv(&RecvWR{ID: 1, SGL: []SGE{g.mr.SGE(0, 100)}}))
	mustPost(t, f.qp.PostSend(&SendWR{ID: 2, Flags: FlagSignaled, SGL: []SGE{f.mr.SGE(0, 10)}, AH: f.ah(g, g.qp)}))
	if wc := waitWC(t, g.cq, 1)[0]; wc.Status != Success || wc.Len != 10 {
		t.Fatalf("a Send over the fallback socket: %+v", wc)
	}

	if b, err := Open(DeviceConfig{Lower: "dpdk"}); !errors.Is(err, ErrInvalidAttr) {
		if b != nil {
			b.Close()
		}
		t.Fatalf("an unknown lower layer: %v", err)
	}
}
